# One prediction job per grid point, separate from training so that it reruns without retraining.


rule predict:
    input:
        unpack(dataset_archive),
        model=trained_model,
    output:
        predictions="results/runs/{run_id}/predictions.csv",
        metrics="results/runs/{run_id}/metrics.json",
        record="results/runs/{run_id}/predict_record.json",
    params:
        identity=run_identity_of,
    threads: 4
    log:
        "logs/predict/{run_id}.log",
    benchmark:
        "results/benchmarks/predict/{run_id}.tsv"
    conda:
        "../envs/scratchflow.yaml"
    script:
        "../scripts/predict.py"
