# One training per grid point: stage in, train (resuming from shared checkpoints), sync back, clean up.


rule train:
    input:
        **TRAIN_INPUTS,
    output:
        model=directory("results/runs/{run_id}/model"),
        params="results/runs/{run_id}/params.json",
        record="results/runs/{run_id}/record.json",
    log:
        "logs/train/{run_id}.log",
    benchmark:
        "results/benchmarks/train/{run_id}.tsv"
    group:
        PACKED_TRAIN
    conda:
        "../envs/scratchflow.yaml"
    threads: 4
    resources:
        pack_slot=1,
    params:
        identity=run_identity_of,
        checkpoints=CHECKPOINTS,
    script:
        "../scripts/train.py"
