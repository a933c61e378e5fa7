# Config validation, the run table, and the named input functions the rules use.
import shutil
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

sys.path.insert(0, str(Path(workflow.basedir) / "scripts"))
from scratchflow.checkpoints import RunCheckpoints
from scratchflow.config import (
    ConfigError,
    check_dataset,
    check_dataset_layout,
    check_packing,
    check_paths,
    check_precision,
    check_resources,
    check_split_fractions,
    check_compression,
    check_tracking,
    cpu_flags,
    explain_schema_error,
    validate_task,
)
from scratchflow.dataset import (
    data_sources,
    fingerprint,
    fingerprint_sources,
    resolve_location,
)
from scratchflow.grid import build_run_table, run_identity
from scratchflow.models import is_local_source
from scratchflow.staging import archive_suffix
from scratchflow.snakemake_adapter import keep_job_variables, notice_job_ends_at_once
from scratchflow.status import write_grid
from scratchflow.tracking import wandb_sync_command

check_dataset_layout(config)
try:
    validate(config, "../config/schemas/config.schema.yaml")
except WorkflowError as error:
    raise ConfigError(explain_schema_error(error) or str(error)) from None
TASK = validate_task(config)
check_paths(config, Path(workflow.basedir))
check_split_fractions(config)
check_tracking(config)
check_compression(config)
# Names, sizes and times of every data file, listed once per start (the data check and the archive
# rule's rebuild trigger both use it).
DATA_SOURCES = data_sources(config["dataset"])
DATA_FINGERPRINT = fingerprint_sources(DATA_SOURCES)
if workflow.is_main_process:
    check_dataset(
        config, TASK, DATA_FINGERPRINT, Path(".snakemake/scratchflow/checked-data")
    )

if workflow.remote_exec:
    # Slurm's warning before the wall time (--signal=USR1@<s>) reaches every process of the job step,
    # this Snakemake included, which USR1 would kill, and the step with it. Ignored here (and so in
    # the job's script, which inherits it) except where the task listens for it.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    keep_job_variables()

DATASET = config["dataset"]
# cluster.pack_runs > 1: train jobs, and predict jobs, go to Slurm that many to a job (Snakemake's
# groups). A pack is the runs one `pack` job gathers: that job joins them into one group job. A
# group asks Slurm for the sum of what its jobs could run side by side; every train and predict job
# takes the one `pack_slot` a packed job has (a "local" resource: each job gets its own), so the
# runs go one after another and the job asks for one run's resources and the sum of their runtimes.
PACK_RUNS = config["cluster"]["pack_runs"]
PACKED_TRAIN = "packed_train" if PACK_RUNS > 1 else None
PACKED_PREDICT = "packed_predict" if PACK_RUNS > 1 else None


MODEL = config.get("model")
# run_id -> that run's training parameters; run_id is the only wildcard of train and predict.
RUNS = build_run_table(config)
# The run ids in grid order, and the runs of each pack (one run each when runs are not packed).
RUN_IDS = list(RUNS)
PACKS = [
    RUN_IDS[first : first + PACK_RUNS] for first in range(0, len(RUN_IDS), PACK_RUNS)
]
# Paths that depend on config alone are constants, not input functions: Snakemake calls an input
# function once per job, through inspect.signature, which costs seconds on a grid of 10,000 runs.
# The archive (its first part, when it has several) is .tar, or .tar.zst when compressed.
ARCHIVE_OF_DATASET = f"archives/{{dataset}}{archive_suffix(DATASET)}"
DATASET_ARCHIVE = ARCHIVE_OF_DATASET.format(dataset=DATASET["name"])
DATASET_MANIFEST = f"archives/{DATASET['name']}.manifest.json"
MODEL_CACHE = f"models/{MODEL['name']}" if MODEL else None
CHECKPOINTS = "checkpoints/{run_id}"
# What a train job reads (the model cache only where the config names a model), and what predict
# writes (predictions.csv only for tasks that make them).
TRAIN_INPUTS = {
    "archive": DATASET_ARCHIVE,
    "manifest": DATASET_MANIFEST,
    **({"base_model": MODEL_CACHE} if MODEL else {}),
}
PREDICT_OUTPUTS = {
    "metrics": "results/runs/{run_id}/metrics.json",
    "record": "results/runs/{run_id}/predict_record.json",
    "curves": "results/runs/{run_id}/curves.png",
    **(
        {"predictions": "results/runs/{run_id}/predictions.csv"}
        if TASK.WRITES_PREDICTIONS
        else {}
    ),
}


wildcard_constraints:
    run_id="[0-9a-f]{10}",
    dataset=DATASET["name"],
    model=MODEL["name"] if MODEL else "(?!)",
    pack="[0-9]+",


def dataset_locations(wildcards):
    return list(DATA_SOURCES.values())


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


def run_identity_of(wildcards):
    """What determines the run's result (dataset settings, model, training parameters, task)."""
    return run_identity(
        RUNS[wildcards.run_id],
        DATASET,
        MODEL["name"] if MODEL else None,
        config["task"],
    )


def run_results(wildcards):
    """The params, test metrics and records of every run of the grid, for the comparison."""
    return {
        "params": expand("results/runs/{run_id}/params.json", run_id=RUNS),
        "metrics": expand("results/runs/{run_id}/metrics.json", run_id=RUNS),
        "records": expand("results/runs/{run_id}/record.json", run_id=RUNS),
    }


def records_in_pack(wildcards):
    """What a pack's train jobs write last."""
    return expand(
        "results/runs/{run_id}/record.json", run_id=PACKS[int(wildcards.pack)]
    )


def metrics_in_pack(wildcards):
    """What a pack's predict jobs write last."""
    return expand(
        "results/runs/{run_id}/metrics.json", run_id=PACKS[int(wildcards.pack)]
    )


def pack_outputs():
    """The packs of the grid, when its runs are packed (cluster.pack_runs > 1)."""
    if PACK_RUNS == 1:
        return []
    return expand(
        "results/packs/{stage}-{pack}.json",
        stage=("train", "predict"),
        pack=range(len(PACKS)),
    )


def string_resources_of(rule_name):
    """The strings a profile gives the Slurm jobs of `rule_name` (partition, account, ...); its
    pack job asks for the same, since Snakemake joins a group's differing strings by taking the
    largest."""
    resources = workflow.get_rule(rule_name).resources
    evaluated = {
        name: evaluated_resource(resources.get(name), rule_name, 1)
        for name in (
            "slurm_partition",
            "slurm_account",
            "qos",
            "constraint",
            "clusters",
        )
    }
    return {name: value for name, value in evaluated.items() if isinstance(value, str)}


def final_outputs(wildcards):
    return pack_outputs() + [
        "results/summary.tsv",
        "results/runs.tsv",
        "results/best_run.json",
        "results/comparison.png",
        "results/curves.png",
        "results/summary.html",
        "results/best_confusion_matrix.png",
    ]


def describe_results():
    """Where the comparison is, printed when the workflow succeeds."""
    found = [
        Path(path).resolve() for path in final_outputs(None) if Path(path).exists()
    ]
    if not found:
        return "scratchflow: done."
    return (
        "scratchflow: done. The comparison of the runs:\n"
        + "\n".join(f"  {path}" for path in found)
        + "\nEvery run's curves, also while a grid trains: tensorboard --logdir "
        + str(Path("results/runs").resolve())
        + "\nIts report, one HTML file: the same command with --report results/report.html"
        + (
            "\nW&B (offline): upload the grid's runs from a login node with\n  "
            + wandb_sync_command(Path("results/runs").resolve())
            if config["tracking"] == "wandb"
            else ""
        )
    )


def check_packing_on_start():
    """cluster.pack_runs, once the executor is known (it is not while the workflow is read)."""
    runtimes = {
        name: evaluated_resource(
            workflow.get_rule(name).resources.get("runtime"), name, 1
        )
        for name in ("train", "predict")
    }
    check_packing(PACK_RUNS, workflow.executor_plugin.name, runtimes, config["cluster"])


def notice_finished_jobs():
    """On Slurm, the next job of a run goes out seconds after the last one ends (snakemake_adapter)."""
    if workflow.executor_plugin.name == "slurm":
        notice_job_ends_at_once(workflow)


def write_grid_file():
    """results/grid.json: every run of the grid, for scripts/status.py (runs not started included)."""
    write_grid(
        Path("."),
        RUNS,
        config["aggregate"]["metric"],
        config["aggregate"]["goal"],
        workflow.executor_plugin.name,
    )


def release_finished_checkpoints():
    """Delete the checkpoints of runs whose training Snakemake has accepted as complete.

    Done here, after the workflow succeeded, not by the train job: until Snakemake has seen a job
    finish, a rerun may delete its outputs as incomplete, and the final checkpoint saves retraining.
    """
    if config["checkpointing"]["keep_after_training"]:
        return
    for run_id in RUNS:
        if Path(f"results/runs/{run_id}/record.json").is_file():
            folder = Path(CHECKPOINTS.format(run_id=run_id))
            RunCheckpoints(folder, TASK.CHECKPOINT_MARKER).release()


def evaluated_resource(resource, rule, attempt):
    """A rule's resource as Snakemake computes it for `attempt`; None where it depends on the job's
    input or wildcards (sbatch checks those at submission)."""
    try:
        return resource.evaluate(
            SimpleNamespace(),
            input=[],
            attempt=attempt,
            threads=1,
            rulename=rule,
            async_run=workflow.async_run,
        ).value
    except Exception:
        return None


def check_rule_resources():
    """Profile resources checked before any job is submitted: unknown names, the training shape,
    FSDP and bf16 on a CPU-only run, and runtimes above cluster.max_runtime_minutes. Called when the workflow is read (first
    attempts: --retries is not known yet) and again from onstart, for every attempt up to --retries.
    """
    if not workflow.is_main_process:
        return
    runtimes, shapes = {}, {}
    for defined in workflow.rules:
        requested = {
            name: evaluated_resource(defined.resources.get(name), defined.name, 1)
            for name in (
                *("nodes", "processes_per_node", "gres", "gpu", "slurm_extra"),
                *("mpi", "tasks", "tasks_per_gpu"),
            )
        }
        shapes[defined.name] = {
            name: value for name, value in requested.items() if value is not None
        }
        runtime = defined.resources.get("runtime")
        if runtime is None:
            continue
        retries = defined.restart_times if workflow.execution_settings else 0
        minutes = [
            evaluated_resource(runtime, defined.name, attempt)
            for attempt in range(1, retries + 2)
        ]
        if None not in minutes:
            runtimes[defined.name] = minutes
    check_resources(
        {defined.name: defined.resources for defined in workflow.rules},
        runtimes,
        shapes,
        config["cluster"],
    )
    check_precision(
        config, shapes["train"], shutil.which("nvidia-smi") is not None, cpu_flags()
    )
