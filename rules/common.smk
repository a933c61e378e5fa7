# Config validation, the plan of the grid or search, and the named input functions the rules use.
# What the checks and hooks do lives in scripts/scratchflow (workflow_hooks, plan, snakemake_adapter).
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

# This file's folder, not workflow.basedir: used as a module, that is the host workflow's. Its code
# must be on disk (a checkout at a tag, not a remote source).
if not hasattr(workflow.current_basedir, "__fspath__"):
    raise WorkflowError(
        f"{workflow.current_basedir}: pin scratchflow as a checkout (docs/lab-pipeline.md)"
    )
sys.path.insert(0, str(Path(workflow.current_basedir).parent / "scripts"))
from scratchflow.software import missing_module_message

try:
    from scratchflow import workflow_hooks
except ModuleNotFoundError as error:  # a job's image or venv without requirements.txt
    raise WorkflowError(missing_module_message(error)) from None
from scratchflow.dataset import fingerprint, resolve_location
from scratchflow.models import is_local_source
from scratchflow.files import read_json
from scratchflow.provenance import VERIFIED_FILE
from scratchflow.plan import (
    COMPARISON_OUTPUTS,
    MANIFEST,
    PACK_OUTPUT,
    RUN_PATHS,
    RUNG_BENCHMARK,
    RUNG_DECISION,
    RUNG_LOG,
    RUNG_RECORD,
    SEARCH_OUTPUTS,
)
from scratchflow.snakemake_adapter import (
    as_recorded,
    check_module_hooks,
    prepare_job_step,
    register_pack_slot,
    share_resources,
    string_resources_of,
    target_rules,
)

TASK, PLAN, DATA_SOURCES, DATA_FINGERPRINT = workflow_hooks.read_config(
    config, workflow, target_rules()
)
if workflow.remote_exec:
    prepare_job_step(config["checkpointing"]["stop_signal"])

DATASET = config["dataset"]
MODEL = config.get("model")


wildcard_constraints:
    run_id="[0-9a-f]{10}",
    dataset=DATASET["name"],
    model=MODEL["name"] if MODEL else "(?!)",
    pack="[0-9]+",
    rung="[0-9]+",


def dataset_locations(wildcards):
    return list(DATA_SOURCES.values())


def dataset_settings(wildcards):
    """The config's dataset section, its keys in the order Snakemake last recorded them: reordered in
    the config, it rebuilds no archive (and retrains no run)."""
    return as_recorded(
        workflow, DATASET, PLAN.archive_template.format(dataset=wildcards.dataset)
    )


def dataset_fingerprint(wildcards):
    """Changes when any file of the dataset does, so that the archive is rebuilt (params trigger)."""
    return DATA_FINGERPRINT


def model_source_location(wildcards):
    """A local model source, watched like an input; a hub model has nothing here to watch."""
    if is_local_source(MODEL["source"]):
        return resolve_location(MODEL["source"])
    return []


def model_source_fingerprint(wildcards):
    if is_local_source(MODEL["source"]):
        return fingerprint(resolve_location(MODEL["source"]))
    return None


def failure_to_train_again(wildcards):
    """The newest note of a run whose task failed in a way a retry cannot fix: a new input to its
    train job, so that Snakemake trains it again (once: then the input is the same as when it last
    trained). None for a run that never failed."""
    notes = PLAN.failure_notes(wildcards.run_id)
    return str(notes[-1]) if notes else []


def run_identity_of(wildcards):
    """What determines the run's result (dataset settings, model, training parameters, task)."""
    return PLAN.identity(wildcards.run_id)


def run_results(wildcards):
    """The params, test metrics and records of every run of the grid (of a halving search: of the
    runs its last rung trained, its decisions, and every rung's records), for the comparison.
    """
    if PLAN.halving:
        # The last rung's runs first: until its decision is made, that plans every decision.
        results = PLAN.run_results(runs_in_rung(PLAN.last_rung))
        # Every rung's records too: what the runs the search stopped early cost.
        results["rung_records"] = [
            RUNG_RECORD.format(run_id=run_id, rung=rung)
            for rung in range(PLAN.last_rung)
            for run_id in runs_in_rung(rung)
        ]
        return results
    # What `make verify` found (scratchflow.verify): the tables and page say which runs it covers.
    verified = {"verified": str(VERIFIED_FILE)} if VERIFIED_FILE.is_file() else {}
    return {**PLAN.run_results(), **verified}


def runs_in_rung(rung):
    """The runs rung `rung` of a halving search trains: all at rung 0, then those the decision after
    the rung before promoted (`promote`: a Snakemake checkpoint, not a training one)."""
    if rung == 0:
        return PLAN.run_ids
    return read_json(checkpoints.promote.get(rung=rung - 1).output.decision)["promoted"]


def rung_records(wildcards):
    """The validation metrics of the runs a rung trained, which its decision ranks."""
    rung = int(wildcards.rung)
    return [
        RUNG_RECORD.format(run_id=run_id, rung=rung) for run_id in runs_in_rung(rung)
    ]


def previous_rung_record(wildcards):
    """From the second rung on, a run's rung resumes from its rung before."""
    rung = int(wildcards.rung)
    return RUNG_RECORD.format(run_id=wildcards.run_id, rung=rung - 1) if rung else []


def budget_epochs(wildcards):
    return PLAN.rungs[int(wildcards.rung)]


def records_in_pack(wildcards):
    """What a pack's train jobs write last."""
    return PLAN.pack_inputs("train", int(wildcards.pack))


def metrics_in_pack(wildcards):
    """What a pack's predict jobs write last."""
    return PLAN.pack_inputs("predict", int(wildcards.pack))


def final_outputs(wildcards):
    check_module_hooks(workflow)  # once the host Snakefile, if any, is read whole
    return PLAN.final_outputs()


def slurm_strings_of(rule_name):
    """The strings a profile gives the Slurm jobs of `rule_name` (partition, account, ...); its
    pack job asks for the same, since Snakemake joins a group's differing strings by taking the
    largest."""
    return string_resources_of(workflow, rule_name)
