# cluster.pack_runs > 1: one job per pack of runs, after them and in their group, which it joins into
# one Slurm job (common.smk says how).


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
