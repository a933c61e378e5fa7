"""The one place that reaches into Snakemake's internals (beyond its documented workflow object)
and works around what its Slurm plugins do. Where an internal has moved, it fails loudly.

A rule's resources as Snakemake computes them, before any job exists (`evaluated_resource`): the
start-up checks read the profile's partition, shape and runtimes through it. A resource that depends
on a job (its wildcards or input) is not known then, and reads as None; any other error is the
profile's, and is raised.

The Slurm variables of a several-node job reach its rule (`keep_job_variables`).

Snakemake runs onstart neither in a dry run (-n) nor under --no-hooks, and a dry run's executor is
its own "dryrun": the start-up checks run once the DAG of jobs is built, in every run
(`run_once_jobs_are_known`), and ask for the executor the run submits to, or a dry run plans for
(`executor_name`).


A finished Slurm job is noticed at once, not minutes later. The Slurm plugin checks its jobs at an
interval that grows by 10 s each time none has finished, up to 180 s (fixed in plugin 2.x), so the
next job of a run (predict after train) went out up to 3 minutes after the last one ended. Every
scratchflow job leaves a marker named by its Slurm job id when its work is done (`mark_job_end`,
in the job); the submitting Snakemake looks for markers every second while it waits, and checks the
jobs as soon as a marked job has had a moment to leave the queue, again every few seconds until
the plugin has seen it end. squeue is still asked once per check for all jobs, so a grid's jobs
ending add a few checks each, not one per job per second (benchmarks/job_end_lag.py).
"""

from __future__ import annotations

import ast
import asyncio
import atexit
import contextlib
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from scratchflow import signals

# Resources the start-up checks read: a job's shape (nodes, launchers, GPUs) and its strings for Slurm.
SHAPE_RESOURCES = ("nodes", "processes_per_node", "gres", "gpu", "slurm_extra", "mpi", "tasks", "tasks_per_gpu")
SLURM_STRING_RESOURCES = ("slurm_partition", "slurm_account", "qos", "constraint", "clusters")

# The Slurm variables of the batch step, kept by the job's Snakemake under this name.
JOB_VARIABLES = "SCRATCHFLOW_SLURM_VARIABLES"
JOB_ENDS = Path(".snakemake") / "scratchflow" / "job-ends"
POLL_SECONDS = 1.0
# After a marker: time for the job's step and batch script to exit, and between two early checks.
SETTLE_SECONDS = 2.0
# A marked job the plugin still lists after this long (a slow epilog) is left to the plugin's own
# interval. A packed run marks nothing unless it fails: the pack's next run goes on in its Slurm job.
PATIENCE_SECONDS = 120.0


class DependsOnJob(LookupError):
    """A resource read a job's wildcards or input, which do not exist before the job does."""


class _NoJobYet:
    """Stands for a job's wildcards and input while a rule's resources are evaluated without a job."""

    def __getattr__(self, name: str) -> Any:
        raise DependsOnJob(name)

    def __getitem__(self, key: Any) -> Any:
        raise DependsOnJob(key)

    def __iter__(self) -> Any:
        raise DependsOnJob("input")

    def __len__(self) -> int:
        raise DependsOnJob("input")


def evaluated_resource(workflow: Any, rule: str, name: str, attempt: int = 1) -> Any:
    """Resource `name` of `rule` for `attempt`, as Snakemake computes it (a profile's expression
    evaluated), or None where the rule has none or it depends on the job."""
    resource = workflow.get_rule(rule).resources.get(name)
    if resource is None:
        return None
    try:
        return resource.evaluate(
            _NoJobYet(),
            input=_NoJobYet(),
            attempt=attempt,
            threads=1,
            rulename=rule,
            async_run=workflow.async_run,
        ).value
    except DependsOnJob:
        return None


def share_resources(workflow: Any, source: str, target: str) -> None:
    """Give rule `target` the resources and threads of rule `source`, as the profile sets them
    (a profile's set-resources and set-threads name rules)."""
    workflow.get_rule(target).resources = workflow.get_rule(source).resources.copy()


def evaluated_resources(workflow: Any, rule: str, names: tuple[str, ...]) -> dict[str, Any]:
    """The first attempt's value of each of `names` the rule has (and that does not depend on the job)."""
    evaluated = {name: evaluated_resource(workflow, rule, name) for name in names}
    return {name: value for name, value in evaluated.items() if value is not None}


def string_resources_of(workflow: Any, rule: str) -> dict[str, str]:
    """The strings a profile gives the Slurm jobs of `rule` (partition, account, ...)."""
    evaluated = {name: evaluated_resource(workflow, rule, name) for name in SLURM_STRING_RESOURCES}
    return {name: value for name, value in evaluated.items() if isinstance(value, str)}


@dataclass(frozen=True)
class RuleRequests:
    """What the profile asks for each rule: its resources' names, the shape its first attempt
    asks for, and its runtime for every attempt up to --retries (minutes; only where known)."""

    names: dict[str, set[str]]
    shapes: dict[str, dict[str, Any]]
    runtimes: dict[str, list[int]]


def rule_requests(workflow: Any) -> RuleRequests:
    """Read while the workflow is read (--retries not known yet: first attempts only) and again
    when it starts."""
    names, shapes, runtimes = {}, {}, {}
    for rule in workflow.rules:
        names[rule.name] = set(rule.resources)
        requested = {name: evaluated_resource(workflow, rule.name, name) for name in SHAPE_RESOURCES}
        shapes[rule.name] = {name: value for name, value in requested.items() if value is not None}
        if rule.resources.get("runtime") is None:
            continue
        retries = rule.restart_times if workflow.execution_settings else 0
        minutes = [evaluated_resource(workflow, rule.name, "runtime", attempt) for attempt in range(1, retries + 2)]
        if None not in minutes:
            runtimes[rule.name] = minutes
    return RuleRequests(names, shapes, runtimes)


def settings_in_effect(workflow: Any) -> dict[str, Any]:
    """This run's profile keys that a later profile, or the command line, replaces whole
    (`profiles.WHOLE_MAPPINGS`): set-resources as its rules' resource names, set-threads' rules and
    default-resources' names."""
    settings = workflow.resource_settings
    return {
        "set-resources": {rule: set(resources) for rule, resources in settings.overwrite_resources.items()},
        "set-threads": set(settings.overwrite_threads),
        "default-resources": set(settings.default_resources or ()),
    }


def configfiles(workflow: Any) -> list[Path]:
    """The config files this run merged (a profile's `configfile:` and --configfile), resolved."""
    return [Path(path).resolve() for path in workflow.overwrite_configfiles]


def sets_whole_mappings(argv: list[str] = sys.argv) -> bool:
    """Whether the command line itself sets a key that replaces a profile's whole (--set-resources,
    --set-threads or --default-resources)."""
    whole = ("--set-resources", "--set-threads", "--default-resources")
    return any(argument.split("=")[0] in whole for argument in argv)


def workflow_profile(argv: list[str] = sys.argv) -> Path | None:
    """The folder --workflow-profile names on the command line (None: it names none)."""
    for at, argument in enumerate(argv[:-1]):
        if argument == "--workflow-profile":
            return Path(argv[at + 1])
    named = [argument.split("=", 1)[1] for argument in argv if argument.startswith("--workflow-profile=")]
    return Path(named[0]) if named else None


def job_rules(workflow: Any) -> set[str]:
    """The rules whose jobs go to a cluster's executor (not the local rules), whatever the executor
    of this run: Snakemake's own `is_local` says every rule is local while the workflow is read,
    and with the local executor."""
    return {
        rule.name
        for rule in workflow.rules
        if rule.group is not None or not (rule.name in workflow._localrules or rule.norun or rule.is_template_engine)
    }


def rules_to_submit(workflow: Any) -> set[str]:
    """The rules of the jobs this run will submit (a dry run: would submit): those of the DAG's jobs
    still to run that go to a cluster's executor (`job_rules`). Known once the DAG is built."""
    return {job.rule.name for job in workflow.dag.needrun_jobs()} & job_rules(workflow)


def target_rules(argv: list[str] = sys.argv) -> set[str]:
    """In a job's own Snakemake: the rules of the jobs it was started for, from its `--target-jobs
    RULE:WILDCARDS ...` (read from the command line: Snakemake sets its DAG settings only after it
    has read the workflow). Empty in the main process."""
    rules, taking = set(), False
    for argument in argv[1:]:
        if argument.startswith("-"):
            taking = argument == "--target-jobs"
        elif taking:
            rules.add(argument.split(":", 1)[0])
    return rules


def executor_name(workflow: Any) -> str:
    """The executor this run submits its jobs with ("local", "slurm"), known once the workflow runs;
    in a dry run (-n), the one it plans for. There Snakemake's own is "dryrun", and the one the
    command line or profile named is known only to the call that runs the workflow (Snakemake's
    API, `DAGApi.execute_workflow`, given both)."""
    if not workflow.dryrun:
        return workflow.executor_plugin.name
    from snakemake.api import DAGApi

    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code is not DAGApi.execute_workflow.__code__:
        frame = frame.f_back
    if frame is None or not isinstance(frame.f_locals.get("executor"), str):
        raise RuntimeError(
            "scratchflow cannot tell which executor this dry run plans for: this Snakemake's "
            "DAGApi.execute_workflow was not found with its `executor` (scratchflow/snakemake_adapter.py "
            "knows Snakemake 9)"
        )
    return frame.f_locals["executor"]


def jobs_requeueable(workflow: Any, slurm_extra: object) -> bool:
    """Whether the Slurm plugin submits a rule with `slurm_extra` requeueable: the profile's
    `slurm-requeue: true` (sbatch --requeue), and no --no-requeue there or in the rule's slurm_extra."""
    settings = workflow.executor_settings
    asked = bool(getattr(settings, "requeue", False)) and not getattr(settings, "no_requeue", False)
    return asked and "--no-requeue" not in str(slurm_extra or "")


def is_dry_run(workflow: Any) -> bool:
    """Whether this run is a dry run (-n); known once the workflow runs."""
    return bool(workflow.dryrun)


def hooks_skipped(workflow: Any) -> bool:
    """Whether Snakemake skips onstart and onsuccess (--no-hooks; every job's own Snakemake too)."""
    return bool(workflow.execution_settings.no_hooks)


def run_once_jobs_are_known(workflow: Any, check: Callable[[], None]) -> None:
    """Run `check` in every run of the workflow, a dry run (-n) or --no-hooks included, once the
    DAG of its jobs is built and before anything is planned, printed or submitted. Snakemake runs
    onstart in neither, and only after the DAG's checks and its container and conda set-ups.
    Not in --touch, nor where no jobs run (--summary, --report, ...). Call while the workflow is
    read; fails loudly where Snakemake's internals moved."""
    if not workflow.is_main_process:
        return
    if not hasattr(workflow, "_build_dag"):
        raise RuntimeError(
            "scratchflow cannot check a run before its jobs: this Snakemake's workflow has no _build_dag "
            "(scratchflow/snakemake_adapter.py knows Snakemake 9)"
        )
    build_dag = workflow._build_dag

    def build_dag_then_check() -> None:
        build_dag()
        if workflow.executor_plugin is not None and not workflow.touch:  # only Workflow.execute sets it
            check()

    workflow._build_dag = build_dag_then_check


def job_precommand(workflow: Any) -> str:
    """The profile's `precommand`, which every job runs before its Snakemake ("" where none)."""
    settings = workflow.remote_execution_settings
    return (settings.precommand if settings else None) or ""


def run_here_when(workflow: Any, rule: str, here: Callable[[str], bool]) -> None:
    """Jobs of `rule` (not in a group) for whose run id `here` holds when they are about to run are
    run by this Snakemake itself, as a localrule's are, not submitted: `here` is asked once the jobs
    they need have ended. Snakemake knows only rules that always run here (`localrules`)."""
    if not workflow.is_main_process:
        return
    from snakemake.jobs import Job

    submitted = Job.is_local

    def is_local(job: Any) -> bool:
        if submitted.fget(job):
            return True
        run_id = job.wildcards_dict.get("run_id")
        return job.rule.name == rule and job.group is None and run_id is not None and here(run_id)

    Job.is_local = property(is_local)


def register_pack_slot(workflow: Any) -> None:
    """What --resources pack_slot=1 would set, here and in each packed job's own Snakemake: the
    one slot of a packed job, which its train (or predict) jobs take one after another."""
    workflow.register_resource("pack_slot", 1)


def prepare_job_step(stop_signal: str) -> None:
    """In the Snakemake a Slurm job step runs (which reads the workflow, then runs the rule's script):
    the stop signal ignored, the job's Slurm variables kept, and the job's end marked when this
    Snakemake exits, also after a rule whose script could not mark it (a SIGKILLed trainer).

    Slurm's warning before the wall time (--signal=<name>@<s>) reaches every process of the job
    step, this Snakemake included, which the signal would kill, and the step with it. Ignored here
    (and so in the rule's script, which inherits it) until the task listens for it."""
    signals.use_stop_signal(stop_signal)
    signals.ignore_stop_signal()
    keep_job_variables()
    atexit.register(_mark_job_end_if_possible)


def _mark_job_end_if_possible() -> None:
    with contextlib.suppress(OSError):  # only a speed-up: never a job's failure
        mark_job_end()


def keep_job_variables(environ: dict[str, str] | os._Environ = os.environ) -> None:
    """Keep the job's Slurm variables under another name, for the rule's own process.

    The Slurm plugin's job step (snakemake-executor-plugin-slurm-jobstep) removes every SLURM_*
    variable but a few identity ones before it runs a rule. A one-node job runs the rule under
    `srun`, whose TaskProlog sets the node's variables again; a several-node job (`mpi`) runs it in
    the batch step as it is, without $SLURM_TMPDIR, the Alliance's node-local scratch. Called by
    that job step's Snakemake, which still has them, when it reads the workflow."""
    kept = {name: value for name, value in environ.items() if name.startswith("SLURM_")}
    environ.setdefault(JOB_VARIABLES, json.dumps(kept))


def mark_job_end(directory: Path = JOB_ENDS, environ: dict[str, str] | os._Environ = os.environ) -> None:
    """Called by a job when its work is done: the marker of its Slurm job (nothing outside Slurm)."""
    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        return
    directory.mkdir(parents=True, exist_ok=True)
    (directory / job_id).touch()


def ended_jobs_to_check(directory: Path, listed: set[str], now: float, checked_at: float) -> bool:
    """Whether a job the plugin still lists has marked its end long enough ago (SETTLE_SECONDS, and
    as long since the last check) to check the jobs now. Markers of jobs the plugin no longer lists,
    or that waited PATIENCE_SECONDS, are removed."""
    due = False
    with contextlib.suppress(FileNotFoundError), os.scandir(directory) as markers:
        for marker in markers:
            with contextlib.suppress(FileNotFoundError):
                marked_at = marker.stat().st_mtime
                if marker.name not in listed or now - marked_at > PATIENCE_SECONDS:
                    os.unlink(marker.path)
                elif now - max(marked_at, checked_at) >= SETTLE_SECONDS:
                    due = True
    return due


def notice_job_ends_at_once(workflow: Any) -> None:
    """Make the Slurm executor's wait between status checks end early when a job marks its end.
    Call after Snakemake made its scheduler (`onstart`); fails loudly where its internals moved."""
    executor = workflow.scheduler._executor
    for name in ("active_jobs", "next_seconds_between_status_checks", "sleep"):
        if not hasattr(executor, name):
            raise RuntimeError(
                f"scratchflow cannot watch for finished jobs: this Snakemake's executor {type(executor).__name__} "
                f"has no {name!r} (scratchflow/snakemake_adapter.py knows Snakemake 9 with the Slurm plugin 2.x)"
            )
    directory = Path.cwd() / JOB_ENDS
    last_check = [0.0]

    async def sleep() -> None:
        deadline = time.monotonic() + executor.next_seconds_between_status_checks
        while time.monotonic() < deadline:
            await asyncio.sleep(POLL_SECONDS)
            listed = {str(job.external_jobid) for job in list(executor.active_jobs)}
            if ended_jobs_to_check(directory, listed, time.time(), last_check[0]):
                break
        last_check[0] = time.time()

    executor.sleep = sleep


def ask_min_job_age_once() -> None:
    """The Slurm plugin (2.x) asks `scontrol show config` for the cluster's MinJobAge before each of
    its status checks, a second call to the controller for every squeue of the whole grid; a
    setting of the cluster that no run changes is asked once. Fails loudly where it moved."""
    import snakemake_executor_plugin_slurm as plugin

    asked = getattr(plugin, "get_min_job_age", None)
    if asked is None:
        raise RuntimeError(
            "scratchflow cannot spare the Slurm controller: snakemake_executor_plugin_slurm has no get_min_job_age "
            "(scratchflow/snakemake_adapter.py knows the Slurm plugin 2.x)"
        )
    if not isinstance(asked, functools._lru_cache_wrapper):
        plugin.get_min_job_age = functools.cache(asked)


class HostReplacedHooks(RuntimeError):
    """A host Snakefile defined its own onstart or onsuccess after `module scratchflow:`."""


def run_module_hooks(workflow: Any, on_start: Callable[[], None], on_success: Callable[[], None]) -> None:
    """Snakemake runs the onstart and onsuccess of the main Snakefile only. Used as a module (a lab's
    host Snakefile, `module scratchflow:`), scratchflow's run anyway, each before the host's own
    (which it defined before the module; one defined after replaces them, `check_module_hooks`)."""
    if workflow.modifier.is_main_snakefile():
        return
    host_start, host_success = workflow._onstart, workflow._onsuccess

    def start(log: Any) -> None:
        on_start()
        host_start(log)

    def success(log: Any) -> None:
        on_success()
        host_success(log)

    workflow._onstart, workflow._onsuccess = start, success
    workflow.scratchflow_hooks = (start, success)


def check_module_hooks(workflow: Any) -> None:
    """Refuse to start a host Snakefile whose own onstart or onsuccess, defined after the module,
    replaced scratchflow's: its start-up checks, plan file and checkpoint release would not run."""
    hooks = getattr(workflow, "scratchflow_hooks", None)
    if hooks is not None and (workflow._onstart, workflow._onsuccess) != hooks:
        raise HostReplacedHooks(
            "the host Snakefile's onstart or onsuccess replaces scratchflow's (Snakemake keeps one of each): "
            "define them before the line `module scratchflow:`, and scratchflow runs its own before them"
        )


def refuse_renamed_rules(workflow: Any) -> None:
    """scratchflow's rules keep their names in a host Snakefile: the profiles give resources by rule
    name (train, predict, ...), and so do its start-up checks."""
    rename = workflow.modifier.resolved_rulename_modifier
    if rename is not None and rename("train") != "train":
        raise HostRenamedRules(
            f"`use rule * from scratchflow as {rename('*')}`: scratchflow's rules keep their own names (the "
            "profiles set each rule's resources by name: train, predict, ...); write `use rule * from scratchflow`"
        )


class HostRenamedRules(RuntimeError):
    """A host Snakefile used scratchflow's rules under other names."""


def as_recorded(workflow: Any, value: dict[str, Any], output: str) -> dict[str, Any]:
    """A rule's param `value` (a dict from the config) as Snakemake recorded it for `output`, where
    that record holds the same dict with its keys in another order; else with its keys sorted.
    Snakemake compares params by their repr, which follows the order of the keys: a config whose
    keys were reordered (by hand, or by a tool that writes YAML back) would rerun the rule, and every
    job downstream of it, for nothing."""
    from snakemake.io import IOFile

    persistence = workflow.persistence  # None until Snakemake prepares its DAG (--lint, say)
    for recorded in (persistence.params(IOFile(output)) if persistence is not None else None) or ():
        with contextlib.suppress(ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            if (old := ast.literal_eval(recorded)) == value:
                return old
    return sorted_deeply(value)


def sorted_deeply(value: Any) -> Any:
    """`value` with the keys of every dict in it sorted."""
    if isinstance(value, dict):
        return {key: sorted_deeply(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [sorted_deeply(item) for item in value]
    return value
