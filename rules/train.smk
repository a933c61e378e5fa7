# One training per grid point: stage in, train (resuming from shared checkpoints), sync back, clean up.


rule train:
    input:
        **PLAN.train_inputs(),
        **PLAN.last_rung_input(),
        failed_before=failure_to_train_again,
    output:
        model=directory(RUN_PATHS.model),
        params=RUN_PATHS.params,
        record=RUN_PATHS.record,
    log:
        RUN_PATHS.train_log,
    benchmark:
        RUN_PATHS.train_benchmark
    group:
        PLAN.pack_group("train")
    conda:
        "../envs/scratchflow.yaml"
    threads: 4
    resources:
        pack_slot=1,
    params:
        identity=run_identity_of,
        checkpoints=RUN_PATHS.checkpoints,
    script:
        "../scripts/train.py"
