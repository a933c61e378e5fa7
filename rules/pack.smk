# cluster.pack_runs > 1: train jobs, and predict jobs, go to Slurm that many to a job (Snakemake's
# groups, PLAN.pack_group). A pack is the runs one `pack` job gathers: that job joins them into one
# group job. A group asks Slurm for the sum of what its jobs could run side by side; every train and
# predict job takes the one `pack_slot` a packed job has (a "local" resource: each job gets its
# own), so the runs go one after another and the job asks for one run's resources and the sum of
# their runtimes.


resource_scopes:
    pack_slot="local",


if PLAN.packed:
    register_pack_slot(workflow)


rule pack_train:
    input:
        records_in_pack,
    output:
        PACK_OUTPUT.format(stage="train", pack="{pack}"),
    log:
        "logs/pack/train-{pack}.log",
    group:
        "packed_train"
    conda:
        "../envs/scratchflow.yaml"
    resources:
        **slurm_strings_of("train"),
        runtime=1,
        mem_mb=500,
        cpus_per_task=1,
    script:
        "../scripts/pack.py"


use rule pack_train as pack_predict with:
    input:
        metrics_in_pack,
    output:
        PACK_OUTPUT.format(stage="predict", pack="{pack}"),
    log:
        "logs/pack/predict-{pack}.log",
    group:
        "packed_predict"
    resources:
        **slurm_strings_of("predict"),
        runtime=1,
        mem_mb=500,
        cpus_per_task=1,
