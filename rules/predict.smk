# One prediction job per grid point, separate from training so that it reruns without retraining.


rule predict:
    input:
        archive=DATASET_ARCHIVE,
        manifest=DATASET_MANIFEST,
        model=rules.train.output.model,
    output:
        **PREDICT_OUTPUTS,
    log:
        RUN_PATHS.predict_log,
    benchmark:
        RUN_PATHS.predict_benchmark
    group:
        PACKED_PREDICT
    conda:
        "../envs/scratchflow.yaml"
    threads: 4
    resources:
        pack_slot=1,
    params:
        identity=run_identity_of,
    script:
        "../scripts/predict.py"
