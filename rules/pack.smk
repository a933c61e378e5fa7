# cluster.pack_runs > 1: one job per pack of runs, after them and in their group, which it joins into
# one Slurm job (common.smk says how).


resource_scopes:
    pack_slot="local",


if PACK_RUNS > 1:
    # What --resources pack_slot=1 would set, here and in each packed job's own Snakemake.
    workflow.register_resource("pack_slot", 1)


rule pack_train:
    input:
        records_in_pack,
    output:
        "results/packs/train-{pack}.json",
    log:
        "logs/pack/train-{pack}.log",
    group:
        "packed_train"
    conda:
        "../envs/scratchflow.yaml"
    resources:
        **string_resources_of("train"),
        runtime=1,
        mem_mb=500,
        cpus_per_task=1,
    script:
        "../scripts/pack.py"


use rule pack_train as pack_predict with:
    input:
        metrics_in_pack,
    output:
        "results/packs/predict-{pack}.json",
    log:
        "logs/pack/predict-{pack}.log",
    group:
        "packed_predict"
    resources:
        **string_resources_of("predict"),
        runtime=1,
        mem_mb=500,
        cpus_per_task=1,
