# A halving search's rungs: every run of rung 0 trains to the first rung's epochs; after each rung
# its decision names the runs that go on (the best `keep` of the settings by validation metric),
# and those resume from their own checkpoints to the next rung's epochs. The last rung's runs are
# trained to the end by rule train, and predicted, as a grid's.


localrules:
    promote,


use rule train as train_rung with:
    input:
        **PLAN.train_inputs(),
        previous_rung=previous_rung_record,
    output:
        rung_record=RUNG_RECORD,
    log:
        RUNG_LOG,
    benchmark:
        RUNG_BENCHMARK
    params:
        identity=run_identity_of,
        checkpoints=RUN_PATHS.checkpoints,
        budget_epochs=budget_epochs,


# A rung's job asks Slurm for what a train job asks for: the profile's settings for train.
share_resources(workflow, "train", "train_rung")


checkpoint promote:
    input:
        records=rung_records,
    output:
        decision=RUNG_DECISION,
    log:
        "logs/search/rung-{rung}.log",
    conda:
        "../envs/scratchflow.yaml"
    params:
        settings=PLAN.settings(),
        metric=PLAN.metric,
        goal=PLAN.goal,
        keep=PLAN.keep,
        budget_epochs=budget_epochs,
    script:
        "../scripts/promote.py"
