"""What the workflow does besides its rules: the checks when it is read and once its jobs are known
(before any job is submitted, in a dry run too), the grid file for the status, and what it does once
it has succeeded. The Snakefile and `rules/common.smk` call one function for each; Snakemake's
internals are reached only through `scratchflow.snakemake_adapter`."""

from __future__ import annotations

import contextlib
import functools
import getpass
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, NoReturn

from scratchflow import SCRATCHFLOW_DIR, preflight, snakemake_adapter
from scratchflow.checkpoints import CheckpointStore, space_warning
from scratchflow.config import (
    ConfigError,
    check_compression,
    check_dataset,
    check_dataset_layout,
    check_packing,
    check_paths,
    check_precision,
    check_resources,
    check_run_count,
    check_split_fractions,
    check_stop_signal,
    check_tracking,
    configured_task,
    cpu_flags,
    dropped_settings,
    dropped_settings_line,
    validate_config,
)
from scratchflow.containers import check_rule_image_rules, set_job_step_image, start_job_steps_in_image
from scratchflow.dataset import (
    DatasetError,
    config_locations,
    data_sources,
    resolve_location,
    share_package_locations,
    shared_fingerprint,
)
from scratchflow.failures import FAILED, unfinished_line, unfinished_runs
from scratchflow.files import read_json
from scratchflow.lab_pipeline import FACTS_FOLDER, PROFILE_FILE
from scratchflow.lease import RunFolder
from scratchflow.ledger import FINISHED
from scratchflow.models import is_local_source
from scratchflow.plan import COMPARISON_OUTPUTS, RUN_PATHS, Plan, best_run_figures
from scratchflow.prediction import made_for
from scratchflow.profiles import read_settings
from scratchflow.software import default_requirements_variable, job_software_problem, pipeline_requirements
from scratchflow.tasks import Task, find_lab_tasks_in
from scratchflow.tracking import wandb_sync_command

CHECKED_DATA = Path(".snakemake/scratchflow/checked-data")


def read_config(
    config: dict[str, Any], workflow: Any, job_rules: AbstractSet[str] = frozenset()
) -> tuple[Task, Plan, dict[str, Path], str]:
    """`config` checked (its layout, the schema, then `_read_valid_config`); a mistake in it refused
    in its one line, before any job."""
    with config_mistakes_refused():
        check_dataset_layout(config)
        validate_config(config)
        return _read_valid_config(config, workflow, job_rules)


@contextlib.contextmanager
def config_mistakes_refused() -> Iterator[None]:
    """A ConfigError raised in the block: its one line, and exit 1 (raised, Snakemake would print
    Python's frames after it)."""
    try:
        yield
    except ConfigError as mistake:
        refuse(f"ConfigError: {mistake}")


def _read_valid_config(
    config: dict[str, Any], workflow: Any, job_rules: AbstractSet[str]
) -> tuple[Task, Plan, dict[str, Path], str]:
    """Check a config that passed the schema, fill in its task's defaults, and plan it: the task's
    module, the plan, the data's files (name -> path) and their fingerprint (names, sizes and times,
    listed once per workflow, where it starts: the data check and the archive rule's rebuild
    trigger both use it; its jobs' Snakemakes are handed it). The data itself is read once per
    version of it, by the main process only. `job_rules`: in a job's own Snakemake, the rules of
    the jobs it runs. A lab's own tasks are found beside its Snakefile
    (`workflow.basedir`, the host's when scratchflow is its module)."""
    snakemake_adapter.refuse_renamed_rules(workflow)
    workflow_dir, main_process = Path(workflow.basedir), workflow.is_main_process
    find_lab_tasks_in(workflow_dir)
    task = configured_task(config)
    planning_note = check_run_count(config)
    if planning_note and main_process:
        print(planning_note, file=sys.stderr, flush=True)
    if main_process:
        try:
            share_package_locations(config_locations(config))
        except DatasetError as error:
            raise ConfigError(str(error)) from None
    check_paths(config, workflow_dir)
    check_split_fractions(config)
    check_tracking(config)
    check_compression(config)
    sources = data_sources(config["dataset"])
    data_fingerprint = shared_fingerprint(sources, main_process)
    if main_process:
        check_dataset(config, task, data_fingerprint, CHECKED_DATA)
    else:
        start_job_steps_in_image(os.environ, job_rules)
    return task, Plan.from_config(config, task.CHECKPOINT_MARKER), sources, data_fingerprint


def predict_here_what_needs_no_job(workflow: Any, writes_predictions: bool) -> None:
    """A predict job that has nothing to predict runs in the workflow's own Snakemake, not as a
    cluster job asking for a GPU: that of a run that failed or diverged, which has no model to
    predict with (scratchflow.jobs.no_prediction), and that of a run whose train job predicted as it
    ended, which moves that prediction into place (scratchflow.prediction; `writes_predictions`: the
    task's, whose predictions.csv it must then hold). Such a run costs no job but its training's."""
    known: dict[str, bool] = {}  # a run's answer, once its record says (Snakemake asks many times)

    def needs_no_job(run_id: str) -> bool:
        if run_id not in known:
            paths = RUN_PATHS.of(run_id)
            if not Path(paths.record).is_file():
                return False  # not trained yet: its predict job does not run before it is
            trained = read_json(Path(paths.record))
            known[run_id] = (
                trained.get("outcome", FINISHED) != FINISHED
                or made_for(Path(paths.predicted_in_training), trained, writes_predictions) is not None
            )
        return known[run_id]

    snakemake_adapter.run_here_when(workflow, "predict", needs_no_job)


def check_rule_resources(workflow: Any, config: dict[str, Any]) -> snakemake_adapter.RuleRequests | None:
    """Profile resources checked before any job is submitted: unknown names, the training shape,
    FSDP and bf16 on a CPU-only run, runtimes above cluster.max_runtime_minutes, and the rules
    cluster.rule_image_variables names. Called when
    the workflow is read (first attempts: --retries is not known yet) and again when it starts, for
    every attempt up to --retries. Returns what it read (None in a job's own Snakemake)."""
    if not workflow.is_main_process:
        return None
    with config_mistakes_refused():
        return _checked_rule_requests(workflow, config)


def _checked_rule_requests(workflow: Any, config: dict[str, Any]) -> snakemake_adapter.RuleRequests:
    """`check_rule_resources` in the main process, the one that reads the profile's requests."""
    requests = snakemake_adapter.rule_requests(workflow)
    check_layers_keep_the_profile(workflow, config["cluster"]["name"], requests.shapes)
    check_resources(requests.names, requests.runtimes, requests.shapes, config["cluster"])
    check_rule_image_rules(config["cluster"]["rule_image_variables"], snakemake_adapter.job_rules(workflow))
    check_precision(config, requests.shapes["train"], shutil.which("nvidia-smi") is not None, cpu_flags())
    check_stop_signal(config["checkpointing"]["stop_signal"], requests.shapes["train"].get("slurm_extra"))
    return requests


def check_layers_keep_the_profile(workflow: Any, cluster: str, shapes: dict[str, dict[str, Any]]) -> None:
    """On one of scratchflow's cluster profiles (its facts file is among the run's config files), a
    layer over it (--workflow-profile, the command line) that replaces set-resources, set-threads or
    default-resources whole and so drops what the profile sets there (`config.dropped_settings`) is
    refused in one line naming the command that writes the layer whole: a 0.2 layer's
    `set-resources: train: runtime: 720` dropped the train job's GPU, memory and stop signal, and
    every predict resource."""
    profile = SCRATCHFLOW_DIR / "profiles" / cluster / PROFILE_FILE
    facts = SCRATCHFLOW_DIR / FACTS_FOLDER / f"{cluster}.yaml"
    if not profile.is_file() or facts.resolve() not in snakemake_adapter.configfiles(workflow):
        return
    in_effect = snakemake_adapter.settings_in_effect(workflow)
    dropped = dropped_settings(read_settings(profile, "scratchflow's profile"), in_effect, shapes)
    if not dropped.lost:
        return
    layer_folder = snakemake_adapter.workflow_profile()
    layer = None
    if layer_folder is not None and not snakemake_adapter.sets_whole_mappings():
        layer = str(layer_folder / PROFILE_FILE)
    shown = os.path.relpath(SCRATCHFLOW_DIR)
    refuse(dropped_settings_line(cluster, dropped, layer, str(SCRATCHFLOW_DIR) if shown.startswith("..") else shown))


def check_before_any_job(workflow: Any, config: dict[str, Any], plan: Plan) -> None:
    """Run in every run once its jobs are known, before anything is submitted: a dry run (-n) and
    --no-hooks included, which run no onstart (`snakemake_adapter.run_once_jobs_are_known`). Every
    check again, now with the executor and --retries known: packing (which needs a cluster) and, on
    Slurm, where jobs are to be submitted (unless `preflight: False`), the live cluster and then the
    jobs' software (`scratchflow.software`, against the pipeline's requirements file, which the
    jobs install by default); each refusal is one message and exit 1. A dry run where Slurm does
    not answer says so in one line, checks neither, and plans on. --no-hooks is refused where jobs
    need onstart (a container cluster's image)."""
    executor = snakemake_adapter.executor_name(workflow)
    dry_run = snakemake_adapter.is_dry_run(workflow)
    cluster = config["cluster"]
    if snakemake_adapter.hooks_skipped(workflow) and executor == "slurm" and cluster["image_variable"]:
        refuse(
            f"scratchflow: --no-hooks skips the start-up that puts the job steps of cluster {cluster['name']!r} in "
            f"their container image (${cluster['image_variable']}), so its jobs would run outside it: run without "
            "--no-hooks (to skip only the preflight: --config preflight=False)"
        )
    runtimes = {rule: snakemake_adapter.evaluated_resource(workflow, rule, "runtime") for rule in ("train", "predict")}
    with config_mistakes_refused():
        requests = _checked_rule_requests(workflow, config)  # this check runs in the main process only
        check_packing(plan.pack_runs, executor, runtimes, cluster)
    if executor != "slurm":
        return
    requirements = pipeline_requirements(Path(workflow.basedir))
    default_requirements_variable(cluster, requirements, os.environ)
    if not config["preflight"] or not snakemake_adapter.rules_to_submit(workflow):
        return
    try:
        check_against_cluster(workflow, plan, requests.runtimes)
    except SlurmDidNotAnswer as unanswered:
        if not dry_run:
            refuse(
                f"scratchflow preflight: Slurm did not answer ({unanswered}), so nothing was checked or "
                "submitted: run from the cluster's login node (or skip the check: --config preflight=False)"
            )
        print(
            f"scratchflow preflight: Slurm did not answer ({unanswered}), so this dry run could not ask the "
            "cluster whether it would run these jobs, nor check their software (on its login node, the dry run "
            "does both)",
            file=sys.stderr,
            flush=True,
        )
        return
    except preflight.PreflightError as refused:
        refuse(str(refused))
    lacking = job_software_problem(cluster, snakemake_adapter.job_precommand(workflow), requirements)
    if lacking:
        refuse(lacking)


def refuse(message: str) -> NoReturn:
    """The message alone, and exit 1: raised, it came with Snakemake's traceback after it."""
    print(message, file=sys.stderr, flush=True)
    raise SystemExit(1)


def on_start(workflow: Any, config: dict[str, Any], plan: Plan) -> None:
    """Snakemake's onstart, once the checks passed (`check_before_any_job`): on Slurm, the job steps'
    container image where the cluster has one; the grid file for the status; a warning where the
    checkpoints may not fit; and on Slurm, the next job of a run sent seconds after the last one ends."""
    executor = snakemake_adapter.executor_name(workflow)
    if executor == "slurm":
        set_job_step_image(
            config["cluster"],
            Path.cwd(),
            SCRATCHFLOW_DIR,
            read_inputs(config),
            sys.executable,
            snakemake_adapter.job_rules(workflow),
        )
    plan.started(executor, [str(path) for path in workflow.overwrite_configfiles]).write(Path("."))
    warn_of_checkpoint_space(config, plan)
    if executor == "slurm":
        say_where_pauses_spend_retries(workflow)
        snakemake_adapter.notice_job_ends_at_once(workflow)
        snakemake_adapter.ask_min_job_age_once()


def say_where_pauses_spend_retries(workflow: Any) -> None:
    """One line where train jobs are not requeueable: a piece paused by the wall-time warning (or
    preempted) cannot requeue its own job, which fails instead, and Snakemake's retry resumes it."""
    train_extra = snakemake_adapter.evaluated_resource(workflow, "train", "slurm_extra")
    if not snakemake_adapter.jobs_requeueable(workflow, train_extra):
        print(
            "scratchflow: train jobs are submitted not requeueable (no slurm-requeue: true in the profile, or "
            "--no-requeue): a piece paused at its wall time or preempted ends its job as failed, and Snakemake's "
            "retry resumes the run, spending one of --retries each time",
            file=sys.stderr,
            flush=True,
        )


def warn_of_checkpoint_space(config: dict[str, Any], plan: Plan) -> None:
    """Warn, not refuse, where the grid's checkpoints may not fit (the estimate is an upper bound)."""
    model = config.get("model") or {}
    if plan.model_cache and Path(plan.model_cache).is_dir():
        weights = Path(plan.model_cache)
    elif model and is_local_source(model["source"]):
        weights = resolve_location(model["source"])
    else:
        weights = None
    to_train = sum(not Path(RUN_PATHS.of(run_id).record).exists() for run_id in plan.runs)
    root = Path(RUN_PATHS.checkpoints).parent
    warning = space_warning(root, to_train, config["checkpointing"]["keep"], weights)
    if warning:
        print(f"scratchflow: warning: {warning}", file=sys.stderr, flush=True)


def run_hooks_as_a_module(workflow: Any, config: dict[str, Any], plan: Plan) -> None:
    """What the Snakefile's onstart and onsuccess do, when scratchflow is a lab's module."""
    snakemake_adapter.run_module_hooks(
        workflow, functools.partial(on_start, workflow, config, plan), functools.partial(on_success, config, plan)
    )


def check_every_run(workflow: Any, config: dict[str, Any], plan: Plan) -> None:
    """`check_before_any_job` in every run, as scratchflow's own workflow or a lab's module."""
    snakemake_adapter.run_once_jobs_are_known(workflow, functools.partial(check_before_any_job, workflow, config, plan))


class SlurmDidNotAnswer(OSError):
    """Slurm's commands failed (not installed, no configuration, no controller): the cluster said
    nothing of the jobs. Its message: why, in Slurm's words."""


def check_against_cluster(workflow: Any, plan: Plan, runtimes: dict[str, list[int]]) -> None:
    """The request of every rule this run submits jobs of, for each attempt up to --retries, checked
    against the live cluster (`scratchflow.preflight`): one error listing every problem, before any
    job is submitted; nothing asked where no job is. `runtimes`: each rule's, per attempt
    (`check_rule_resources`)."""
    requests = [
        preflight.request_of(
            rule,
            snakemake_adapter.evaluated_resources(workflow, rule, preflight.RESOURCES),
            runtimes.get(rule, []),
            os.environ.get("SBATCH_ACCOUNT"),
            plan.pack_runs if rule in ("train", "predict") else 1,
        )
        for rule in sorted(snakemake_adapter.rules_to_submit(workflow))
    ]
    if not requests:
        return
    try:
        cluster = preflight.read_cluster(os.environ.get("USER") or getpass.getuser())
    except (OSError, subprocess.SubprocessError) as error:
        raise SlurmDidNotAnswer(preflight.reason(error)) from None
    for warning in cluster.warnings:
        print(f"scratchflow preflight: {warning}", file=sys.stderr, flush=True)
    preflight.check(requests, cluster)


def read_inputs(config: dict[str, Any]) -> list[Path]:
    """The paths outside the working directory that jobs read: the dataset's, and a local model's
    (every job checks the config, which names them)."""
    paths = list(data_sources(config["dataset"]).values())
    if config.get("model") and is_local_source(config["model"]["source"]):
        paths.append(resolve_location(config["model"]["source"]))
    return paths


def on_success(config: dict[str, Any], plan: Plan) -> None:
    """Release the checkpoints of trained runs (and of a halving search's stopped ones), and say
    where the results are; then, where runs failed in a way a retry cannot fix, which and why, and
    exit 1 (every other job succeeded).

    The checkpoints are deleted here, after the workflow succeeded, not by the train job: until
    Snakemake has seen a job finish, a rerun may delete its outputs as incomplete, and the final
    checkpoint saves retraining. A failed run's go too: after a fix, it trains from the start."""
    if not config["checkpointing"]["keep_after_training"]:
        stopped = plan.stopped_runs()  # by a halving search: done at their rung
        for run_id in plan.runs:
            paths = plan.paths(run_id)
            if Path(paths.record).is_file() or run_id in stopped:
                CheckpointStore(RunFolder(Path(paths.checkpoints)), plan.checkpoint_marker).remove_all()
    print(describe_results(plan, config["tracking"]))
    records = {run_id: Path(plan.paths(run_id).record) for run_id in plan.runs}
    unfinished = unfinished_runs({run_id: read_json(path) for run_id, path in records.items() if path.is_file()})
    lines = "".join(f"  {unfinished_line(run_id, outcome, said)}\n" for run_id, (outcome, said) in unfinished.items())
    failed = sum(outcome == FAILED for outcome, _said in unfinished.values())
    diverged = len(unfinished) - failed
    if unfinished and not failed:
        print(f"scratchflow: {diverged} of {len(plan.runs)} runs diverged (ranked last):\n{lines}", end="")
    elif failed:
        also = f"; {diverged} diverged (results, ranked last)" if diverged else ""
        refuse(
            f"scratchflow: {failed} of {len(plan.runs)} runs failed, each in a way a retry cannot fix "
            f"(not retried, left out of the comparison){also}:\n{lines}"
            "Their logs are in logs/train/. After a fix, the same command trains the failed runs again."
        )


def describe_results(plan: Plan, tracking: str) -> str:
    """Where the comparison is, printed when the workflow succeeds: its files, and the best run's
    figures there are (scratchflow.plan.best_run_figures)."""
    found = [Path(path).resolve() for path in plan.final_outputs() if Path(path).exists()]
    best = Path(COMPARISON_OUTPUTS["best"])
    if best.is_file():
        found += [path.resolve() for path in best_run_figures(read_json(best)["run"]["run_id"])]
    if not found:
        return "scratchflow: done."
    runs = Path(COMPARISON_OUTPUTS["summary"]).parent.resolve() / "runs"
    lines = [
        "scratchflow: done. The comparison of the runs:",
        *(f"  {path}" for path in found),
        f"Every run's curves, also while a grid trains: tensorboard --logdir {runs}",
        "Its report, one HTML file: the same command with --report results/report.html "
        '(a pipeline\'s make: ARGS="--report results/report.html")',
    ]
    if tracking == "wandb":
        lines.append(f"W&B (offline): upload the grid's runs from a login node with\n  {wandb_sync_command(runs)}")
    return "\n".join(lines)
