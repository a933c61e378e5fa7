# scratchflow: tar the data -> stage it to node-local scratch -> train -> predict -> sync back ->
# clean up, for every point of a hyperparameter grid; then compare the runs.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "rules/report/workflow.rst"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/train.smk"
include: "rules/search.smk"
include: "rules/predict.smk"
include: "rules/pack.smk"
include: "rules/aggregate.smk"


workflow_hooks.check_rule_resources(workflow, config)
workflow_hooks.predict_here_what_needs_no_job(workflow, TASK.WRITES_PREDICTIONS)


rule all:
    default_target: True
    input:
        final_outputs,


onstart:
    workflow_hooks.on_start(workflow, config, PLAN)


onsuccess:
    workflow_hooks.on_success(config, PLAN)


# Used as a module, Snakemake runs neither hook above: scratchflow runs them itself.
workflow_hooks.run_hooks_as_a_module(workflow, config, PLAN)
# Before any job, in every run: a dry run (-n) and --no-hooks run no onstart.
workflow_hooks.check_every_run(workflow, config, PLAN)
