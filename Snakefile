# scratchflow: tar the data -> stage it to node-local scratch -> train -> predict -> sync back ->
# clean up, for every point of a hyperparameter grid; then compare the runs.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "rules/report/workflow.rst"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/train.smk"
include: "rules/predict.smk"
include: "rules/pack.smk"
include: "rules/aggregate.smk"


check_rule_resources()


rule all:
    default_target: True
    input:
        final_outputs,


onstart:
    check_rule_resources()
    check_packing_on_start()
    write_grid_file()
    notice_finished_jobs()


onsuccess:
    release_finished_checkpoints()
    print(describe_results())
