# One prediction job per grid point, separate from training so that it reruns without retraining.


rule predict:
    input:
        archive=PLAN.archive,
        manifest=PLAN.manifest,
        model=rules.train.output.model,
    output:
        **PLAN.predict_outputs(TASK.WRITES_PREDICTIONS),
    log:
        RUN_PATHS.predict_log,
    benchmark:
        RUN_PATHS.predict_benchmark
    group:
        PLAN.pack_group("predict")
    conda:
        "../envs/scratchflow.yaml"
    threads: 4
    resources:
        pack_slot=1,
    params:
        identity=run_identity_of,
    script:
        "../scripts/predict.py"
