"""The checks on a configuration that a JSON schema cannot express, made before any job starts."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import signal
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scratchflow import SCRATCHFLOW_DIR
from scratchflow.dataset import DatasetError, data_sources, resolve_location, table_columns
from scratchflow.models import is_local_source
from scratchflow.plan import TRAINING_RULES
from scratchflow.preflight import requested_gpus_per_node
from scratchflow.search import BUDGET_KEY, HALVING, SearchError, check_halving, check_space, search_size, swept_values
from scratchflow.slurm_job import SLURM_SIGNAL_OPTION
from scratchflow.staging import COMPRESSION_TOOLS, archive_layout, missing_tools
from scratchflow.tasks import (
    Task,
    UnknownTask,
    declared_goal,
    described,
    grid_schema,
    is_lab_task,
    load_task,
    loaded_file,
    metric_names,
    refuse_what_is_gone,
    task_file,
    training_schema,
)
from scratchflow.tracking import MissingPackage, require_wandb

# Resources Snakemake defines, and those snakemake-executor-plugin-slurm 2.x turns into sbatch flags;
# any other name in a profile is a typo that would be silently ignored.
KNOWN_RESOURCES = frozenset(
    {
        *("_cores", "_nodes", "threads", "runtime", "tmpdir"),
        *("mem", "mem_mb", "mem_mib", "disk", "disk_mb", "disk_mib", "mem_mb_per_cpu"),
        *("slurm_account", "slurm_partition", "slurm_extra", "slurm_cluster", "clusters", "cluster"),
        *("constraint", "qos", "nodes", "tasks", "tasks_per_node", "tasks_per_gpu", "mpi"),
        *("cpus_per_task", "cpus_per_gpu", "gpu", "gpu_model", "gres"),
        "processes_per_node",  # scratchflow's own: training processes per node (rule train)
        "pack_slot",  # scratchflow's own: one per run, for cluster.pack_runs (rules train and predict)
    }
)


# Planning costs about 3.3 ms and 50 KB a run on 2 cores (benchmarks/README.md, "Grid scale": 100,000
# runs in 330 s and 5.0 GB); from this many runs on, the workflow says so before it starts planning.
PLANNING_SECONDS_PER_RUN = 0.0033
PLANNING_MB_PER_RUN = 0.05
LARGE_GRID_RUNS = 10_000

# Executors that submit jobs to a cluster, where cluster.pack_runs means something ("dryrun" is how
# Snakemake names any executor under --dry-run).
PACKING_EXECUTORS = frozenset({"slurm", "dryrun"})


class ConfigError(ValueError):
    """The configuration names something that does not exist or does not fit; the message names the key."""


CONFIG_SCHEMA = SCRATCHFLOW_DIR / "config" / "schemas" / "config.schema.yaml"


def validate_config(config: dict[str, Any]) -> None:
    """Snakemake's validation of `config` against scratchflow's schema, its defaults filled in; a
    ConfigError of one line naming the key where it does not fit."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    # `model: null` is no model, as an absent `model:` is: Snakemake's default-filling validator
    # would descend into the null (for model.token_file's default) and fail with an AttributeError.
    if isinstance(config, dict) and "model" in config and config["model"] is None:
        del config["model"]
    try:
        validate(config, str(CONFIG_SCHEMA))
    except WorkflowError as error:
        raise ConfigError(explain_schema_error(error) or str(error)) from None


def explain_schema_error(error: Exception) -> str | None:
    """One line naming the offending key, for the jsonschema error inside Snakemake's validation
    error (whose own message prints the whole schema); None if there is no such error inside."""
    import jsonschema

    cause = error.__cause__ or error.__context__  # Snakemake raises its error while handling this one
    if not isinstance(cause, jsonschema.ValidationError):
        return None
    return describe_schema_error(cause)


def describe_schema_error(cause: Any, section: str = "") -> str:
    """'config key <dotted.key[index]>: <what is wrong>', with the keys allowed where one is unknown
    and a hint for numbers YAML read as text."""
    path = [section] if section else []
    key = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in [*path, *cause.absolute_path])
    key = key.lstrip(".") or "(top level)"
    message = f"config key {key}: {cause.message}"
    if cause.validator == "additionalProperties":
        allowed = sorted(cause.schema.get("properties", {}))
        message += f"; the keys allowed there are: {', '.join(allowed)}"
    if cause.validator == "type" and isinstance(cause.instance, str):
        try:
            float(cause.instance)
        except ValueError:
            pass
        else:
            message += f" (YAML reads {cause.instance} as text: write it with a decimal point, e.g. 1.0e-4)"
    return message


def check_dataset_layout(config: dict[str, Any]) -> None:
    """One data location split by fractions, or one per split: never both, never neither. Checked
    on the config as written, before defaults fill the fractions in."""
    dataset = config.get("dataset") or {}
    if not isinstance(dataset, dict):
        return  # the schema says what is wrong
    if "splits" in dataset:
        written = [key for key in ("path", "test_fraction", "validation_fraction", "split_seed") if key in dataset]
        if written:
            raise ConfigError(
                f"dataset.splits and dataset.{written[0]} are both set: a dataset is either one file or folder "
                "split by fractions (path, test_fraction, validation_fraction, split_seed) or its own split "
                "files (splits: train, validation, test); remove one"
            )
    elif "path" not in dataset:
        raise ConfigError("config key dataset: set dataset.path (one file or folder) or dataset.splits (train, test)")


def configured_task(config: dict[str, Any]) -> Task:
    """The config's task module, its defaults filled into the config, and the config checked against
    what the task takes and needs."""
    with lab_task_bugs_in_one_line(config["task"], "its module, as it was imported,"):
        try:
            task = load_task(config["task"])
            if is_lab_task(config["task"]):
                refuse_what_is_gone(config["task"], loaded_file(config["task"]))
        except UnknownTask as error:
            raise ConfigError(str(error)) from None
    fill_task_defaults(config, task)
    check_task_settings(config, task)
    return task


class LabTaskFailed(ConfigError):
    """A lab's own task raised, at start-up, what the task protocol does not name: its code's fault."""

    def __init__(self, task: str, failure: str) -> None:
        super().__init__(f"task {task}: {failure}")
        self.task, self.failure = task, failure


@contextlib.contextmanager
def lab_task_bugs_in_one_line(task: str, where: str) -> Iterator[None]:
    """What a lab's own task raises beyond the protocol's errors (a bug in its code, not in the
    config) as a ConfigError of one line: its type, message and the task's line, never a traceback.
    scratchflow's own tasks are left to raise: a bug there is scratchflow's, and its traceback helps."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as error:
        if not is_lab_task(task):
            raise
        failure = f"{where} raised {described(error, task_file(task))}"
        missing = error.name if isinstance(error, ModuleNotFoundError) else None
        if missing and missing.split(".")[0] != task.split(".")[0]:  # not a module of the lab's own folder
            guide = 'docs/lab-pipeline.md, "Your environment and your packages"'
            failure += (
                f": the environment of {sys.executable} lacks it; add the package that provides it to your "
                f"pipeline's requirements.txt and install that file there ({guide})"
            )
        raise LabTaskFailed(task, failure) from None


def fill_task_defaults(config: dict[str, Any], task: Task) -> None:
    """The defaults of the task's `training:` keys (its schema fragment), its first metric as the
    one the runs are compared by, and that metric's direction as the task declares it (else higher
    is better), where the config leaves them out. A direction the config gives that contradicts the
    task's declaration is refused: the best run would be the worst."""
    for key, item in training_schema(config["task"]).get("properties", {}).items():
        if "default" in item:
            config["training"].setdefault(key, item["default"])
    aggregate = config["aggregate"]
    if aggregate["metric"] is None and task.METRICS:
        aggregate["metric"] = metric_names(task.METRICS)[0]
    declared = declared_goal(task.METRICS, aggregate["metric"])
    if aggregate.get("goal") not in (None, declared) and declared is not None:
        better = {"max": "higher", "min": "lower"}
        raise ConfigError(
            f"config key aggregate.goal: {aggregate['goal']} contradicts task {config['task']!r}, which says "
            f"{better[declared]} {aggregate['metric']} is better ({declared}); leave aggregate.goal out"
        )
    aggregate["goal"] = aggregate.get("goal") or declared or "max"


def check_task_settings(config: dict[str, Any], task: Task) -> None:
    """`training:` and `grid:` (or `search:`) against the task's schema fragment, `model:` and
    `aggregate.metric` against what the task needs and reports, and the task's own checks."""
    import jsonschema

    schema = training_schema(config["task"])
    swept = [section for section in ("grid", "search") if section in config]
    if len(swept) != 1:
        raise ConfigError(
            "config keys grid and search are both set: the runs are a grid or a search, not both; remove one"
            if swept
            else "config key grid: set grid: (lists of values, every combination a run) or search: (trials "
            'drawn from a space; docs/search.md, "Searching beyond a grid")'
        )
    sections = [("training", schema)] + ([("grid", grid_schema(schema))] if "grid" in config else [])
    for section, section_schema in sections:
        errors = sorted(jsonschema.Draft202012Validator(section_schema).iter_errors(config[section]), key=str)
        if errors:
            raise ConfigError(describe_schema_error(jsonschema.exceptions.best_match(errors), section))
    if "search" in config:
        try:
            check_space(config["search"]["space"], schema)
            check_halving(config["search"])
        except SearchError as error:
            raise ConfigError(f"config key {error}") from None
        if config["search"]["kind"] == HALVING and not task.TRAINS_RUNGS:
            raise ConfigError(
                f"config key search.kind: task {config['task']!r} trains no halving search's rungs (its TRAINS_RUNGS "
                "is False): search with kind: random, or sweep a grid"
            )
        if config["search"]["kind"] == HALVING:
            check_halving_setup(config)
    if task.NEEDS_MODEL and not config.get("model"):
        raise ConfigError(f"config key model: task {config['task']!r} needs a model (model.name and model.source)")
    if config["aggregate"]["metric"] is None:
        raise ConfigError(
            f"config key aggregate.metric: task {config['task']!r} reports whatever metrics its code writes; "
            "name the one to compare runs by (and aggregate.goal: min for a loss)"
        )
    if task.METRICS and config["aggregate"]["metric"] not in task.METRICS:
        raise ConfigError(
            f"config key aggregate.metric: {config['aggregate']['metric']!r} is not a metric task "
            f"{config['task']!r} reports; it reports: {', '.join(metric_names(task.METRICS))}"
        )
    with lab_task_bugs_in_one_line(config["task"], "its check_settings"):
        try:
            task.check_settings(config)
        except ValueError as error:
            raise ConfigError(str(error)) from None


def check_halving_setup(config: dict[str, Any]) -> None:
    """A halving search ranks by the validation split, never the test split: refuse data without one.
    It sets the runs' epochs: refuse a program without them. Its rung jobs go to Slurm one run
    each: refuse packed runs."""
    dataset = config["dataset"]
    if dataset.get("splits"):
        if "validation" not in dataset["splits"]:
            raise ConfigError(
                "config key dataset.splits: a halving search (search.kind) ranks the runs at each rung on the "
                "validation split, never the test split, and dataset.splits has none: add a validation file"
            )
    elif not dataset["validation_fraction"]:
        raise ConfigError(
            "config key dataset.validation_fraction: a halving search (search.kind) ranks the runs at each rung on "
            "the validation split, never the test split, and validation_fraction is 0: set it, e.g. 0.1"
        )
    if BUDGET_KEY not in config["training"]:
        raise ConfigError(
            f"config key training.{BUDGET_KEY}: a halving search trains each run to its last rung's "
            f"{BUDGET_KEY}, and the program declares no {BUDGET_KEY} parameter: add {BUDGET_KEY} to training: "
            '(docs/search.md, "Successive halving": what a program does with SCRATCHFLOW_BUDGET_EPOCHS)'
        )
    if config["cluster"]["pack_runs"] > 1:
        raise ConfigError(
            "config key cluster.pack_runs: a halving search submits each run's rung as its own job; "
            "set pack_runs to 1 or use a grid or a random search"
        )


def check_run_count(config: dict[str, Any]) -> str | None:
    """Refuse a grid of more than `max_runs` runs before expanding it (its size is the product of its
    lists' lengths, which hold no repeats); for one large enough that planning takes a while, the
    note to print first."""
    if "search" in config:
        search = config["search"]
        runs = search_size(search)
        sizes = f"trials ({search['trials']}) x seeds ({runs // search['trials']})"
        section = "search"
    else:
        grid = config["grid"]
        runs = math.prod(len(values) for values in grid.values())
        sizes = " x ".join(f"{key} ({len(values)})" for key, values in sorted(grid.items()))
        section = "grid"
    if runs > config["max_runs"]:
        raise ConfigError(
            f"config key {section}: {runs:,} runs ({sizes}), more than max_runs ({config['max_runs']:,}); "
            "fewer values (or trials), or a larger max_runs if it is meant "
            f"(planning alone would take about {_planning_cost(runs)})"
        )
    if runs >= LARGE_GRID_RUNS:
        return f"scratchflow: a {section} of {runs:,} runs ({sizes}); planning it takes about {_planning_cost(runs)}"
    return None


def _planning_cost(runs: int) -> str:
    seconds = runs * PLANNING_SECONDS_PER_RUN
    units = ((86400, "days"), (3600, "hours"), (60, "minutes"))
    unit, name = next(((unit, name) for unit, name in units if seconds >= 2 * unit), (1, "s"))
    duration = f"{seconds / unit:,.0f} {name}"
    return f"{duration} and {runs * PLANNING_MB_PER_RUN / 1000:,.1f} GB of memory on 2 cores"


def check_tracking(config: dict[str, Any]) -> None:
    """`tracking: wandb` needs its optional extra where the workflow starts (its jobs check again)."""
    if config["tracking"] == "wandb":
        try:
            require_wandb()
        except MissingPackage as error:
            raise ConfigError(str(error)) from None


def check_compression(config: dict[str, Any]) -> None:
    """A compressed archive needs its tool where the workflow starts (the jobs check again)."""
    compression = archive_layout(config["dataset"])[0]
    missing = missing_tools(*COMPRESSION_TOOLS[compression])
    if missing:
        raise ConfigError(
            f"config key dataset.compression: {compression} needs the {' and '.join(missing)} program, which is not "
            f"on PATH here (Debian: apt-get install {' '.join(missing)}; or module load {' '.join(missing)}); or "
            "remove the key for an uncompressed archive"
        )


def check_packing(pack_runs: int, executor: str, runtimes: Mapping[str, int | None], cluster: dict[str, Any]) -> None:
    """`cluster.pack_runs` needs jobs submitted to a cluster, and a packed job's wall time (its runs'
    runtimes, one after another) must fit the cluster's maximum. `runtimes`: the packed rules' first
    attempt's, in minutes (None where it depends on the job)."""
    if pack_runs == 1:
        return
    if executor not in PACKING_EXECUTORS:
        raise ConfigError(
            f"config key cluster.pack_runs: {pack_runs} packs runs into cluster jobs, but this workflow runs "
            f"with the {executor!r} executor, which runs each job on this machine anyway; set it to 1 here, "
            "or run with a cluster profile (--profile profiles/<cluster>)"
        )
    limit = cluster.get("max_runtime_minutes")
    for rule, runtime in runtimes.items():
        if limit is not None and runtime is not None and pack_runs * runtime > limit:
            raise ConfigError(
                f"config key cluster.pack_runs: {pack_runs} {rule} jobs of {runtime} min each, one after "
                f"another, need {pack_runs * runtime} min, above the maximum of cluster {cluster['name']!r}, "
                f"{limit} min (cluster.max_runtime_minutes). Pack at most {limit // runtime} runs, or lower "
                f"the runtime of rule {rule} to what one run needs"
            )


def check_split_fractions(config: dict[str, Any]) -> None:
    dataset = config["dataset"]
    if "splits" in dataset:
        return
    if dataset["test_fraction"] + dataset["validation_fraction"] >= 1:
        raise ConfigError(
            f"dataset.test_fraction ({dataset['test_fraction']}) + dataset.validation_fraction "
            f"({dataset['validation_fraction']}) must be below 1: nothing would be left to train on"
        )


def check_dataset(config: dict[str, Any], task: Any, data_fingerprint: str, checked_dir: Path) -> None:
    """Read the data once per version of it (a marker named by `data_fingerprint`, the task and the
    settings that read it) and fail on what training would fail on hours later: the task's own
    checks (missing columns, empty texts, unreadable images, one label, too few examples)."""
    dataset = config["dataset"]
    settings = {key: dataset[key] for key in sorted(dataset) if key != "name"}
    key = hashlib.sha256(json.dumps([data_fingerprint, config["task"], settings]).encode()).hexdigest()[:16]
    marker = checked_dir / f"{dataset['name']}-{key}"
    if marker.exists():
        return
    with lab_task_bugs_in_one_line(config["task"], "its check_data"):
        try:
            task.check_data(dataset, data_sources(dataset))
        except DatasetError as error:
            raise ConfigError(f"dataset: {error}") from None
        except ValueError as error:  # the table reader's own complaint about the file
            raise ConfigError(f"dataset: cannot read the data as {dataset['format']}: {error}") from None
    checked_dir.mkdir(parents=True, exist_ok=True)
    marker.touch()


def check_training_shape(rule: str, resources: Mapping[str, Any], cluster_name: str = "local") -> None:
    """`nodes` and `processes_per_node` whole numbers >= 1; processes only for training, and no more
    on a node than the GPUs asked for there (one process drives one GPU); several nodes only on a
    Slurm cluster, with the resources that give one launcher per node."""
    for name in ("nodes", "processes_per_node"):
        value = resources.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"resource {name} of rule {rule}: {value!r} is not a whole number >= 1")
    processes = resources.get("processes_per_node")
    if processes is not None and rule not in TRAINING_RULES:
        raise ConfigError(
            f"resource processes_per_node of rule {rule}: only rule train starts several training processes"
        )
    gpus = requested_gpus_per_node(resources)
    if processes is not None and gpus is not None and processes > gpus:
        raise ConfigError(
            f"resource processes_per_node of rule {rule}: {processes} processes on a node given {gpus} GPU(s); "
            "each process drives one GPU: ask for more GPUs per node (gres, gpu or --gpus-per-node) or fewer processes"
        )
    nodes = resources.get("nodes") or 1
    if rule in TRAINING_RULES and nodes > 1:
        if cluster_name == "local":
            raise ConfigError(
                f"resource nodes of rule train: {nodes} nodes with cluster {cluster_name!r} (this machine): "
                "several nodes need a Slurm cluster's profile"
            )
        recipe = (
            f"nodes: {nodes}, mpi: srun, tasks: {nodes}, tasks_per_gpu: 0 and --ntasks-per-node=1 in slurm_extra "
            '(docs/clusters.md, "Several nodes")'
        )
        # For a GPU job (gpu, or gres with a GPU), the plugin would otherwise ask for --ntasks-per-gpu
        # (a launcher per GPU); --gpus-per-node in slurm_extra does not make one.
        plugin_gpu_job = bool(resources.get("gpu")) or "gpu" in str(resources.get("gres") or "")
        gpu_tasks = plugin_gpu_job and resources.get("tasks_per_gpu") != 0
        if not resources.get("mpi") or resources.get("tasks") != nodes or gpu_tasks:
            raise ConfigError(
                f"resource nodes of rule train: {nodes} nodes need one launcher per node, and the Slurm plugin "
                f"runs a job on its first node only without an mpi resource; ask for {recipe}"
            )
        if "--ntasks-per-node=1" not in str(resources.get("slurm_extra") or ""):
            raise ConfigError(f"resource slurm_extra of rule train: {nodes} nodes need --ntasks-per-node=1 ({recipe})")


def check_stop_signal(stop_signal: str, train_slurm_extra: Any) -> None:
    """The signal a profile asks Slurm to send before a train job's wall time must be the one the
    trainer listens for (checkpointing.stop_signal): any other would kill the job unsaved."""
    asked = SLURM_SIGNAL_OPTION.search(str(train_slurm_extra or ""))
    if asked is None:
        return
    name = asked.group(1).upper()
    if name.isdigit():
        name = signal.Signals(int(name)).name.removeprefix("SIG")
    if name != stop_signal:
        raise ConfigError(
            f"config key checkpointing.stop_signal: the trainer listens for SIG{stop_signal}, but the profile asks "
            f"Slurm for SIG{name} before the wall time ({asked.group(0)} in the train rule's slurm_extra), "
            f"which would end the job without a checkpoint; set checkpointing.stop_signal: {name}, or "
            f"--signal={stop_signal}@<s>"
        )


# Resources a switch exchanges for one another (a GPU asked for as gpu, gres or --gpus-per-node; one
# node or several): a layer may leave one out where its rule keeps its GPUs (`dropped_settings`).
SHAPE_KEYS = frozenset({"gpu", "gpu_model", "gres", "nodes", "mpi", "tasks", "tasks_per_gpu", "processes_per_node"})


def size_name(resource: str) -> str:
    """A resource's name as Snakemake compares it: mem_mb, mem_mib and mem are one resource."""
    return resource.removesuffix("_mib").removesuffix("_mb")


@dataclass(frozen=True)
class Dropped:
    """What a layer over scratchflow's profile (or the command line) drops of the profile's
    set-resources, set-threads and default-resources, which it replaces whole: per key, what is lost
    ("train's mem_mb", "all of predict's (gpu, runtime)"); and whether the train jobs lose their GPUs
    or their stop signal."""

    lost: dict[str, list[str]]
    train_gpus: bool = False
    stop_signal: bool = False


def says_which_gpus(resources: Mapping[str, Any]) -> bool:
    """Whether a rule's resources say what GPUs it asks for, none included (`gpu: 0`: CPU training
    on purpose), in any syntax `requested_gpus_per_node` reads."""
    extra = str(resources.get("slurm_extra") or "")
    return "gpu" in resources or "gres" in resources or re.search(r"--(gpus|gres)\b", extra) is not None


def dropped_settings(profile: Mapping[str, Any], in_effect: Mapping[str, Any], shapes: Mapping[str, Any]) -> Dropped:
    """What the settings `in_effect` (`snakemake_adapter.settings_in_effect`) lack of scratchflow's
    `profile`: a rule entry of set-resources left out whole, or a resource of it other than those a
    switch exchanges (SHAPE_KEYS), its GPUs (in any syntax, read from the rules' evaluated `shapes`;
    `gpu: 0` says none on purpose) or the --signal of its slurm_extra; a rule of set-threads; a name
    of default-resources."""
    lost: dict[str, list[str]] = {}
    train_gpus = stop_signal = False
    for rule, wanted in (profile.get("set-resources") or {}).items():
        wanted = wanted or {}
        if rule not in in_effect["set-resources"]:
            lost.setdefault("set-resources", []).append(f"all of {rule}'s ({', '.join(wanted)})")
            train_gpus |= rule == "train" and bool(requested_gpus_per_node(wanted))
            stop_signal |= rule == "train" and bool(SLURM_SIGNAL_OPTION.search(str(wanted.get("slurm_extra") or "")))
            continue
        kept = {size_name(name) for name in in_effect["set-resources"][rule]}
        names = [name for name in wanted if name not in SHAPE_KEYS and size_name(name) not in kept]
        shape = shapes.get(rule) or {}
        if requested_gpus_per_node(wanted) and not says_which_gpus(shape):
            names.append("GPUs")
            train_gpus |= rule == "train"
        asked = SLURM_SIGNAL_OPTION.search(str(wanted.get("slurm_extra") or ""))
        if asked and not SLURM_SIGNAL_OPTION.search(str(shape.get("slurm_extra") or "")):
            if "slurm_extra" not in names:
                names.append(f"{asked.group(0)} (in slurm_extra)")
            stop_signal |= rule == "train"
        if names:
            lost.setdefault("set-resources", []).append(f"{rule}'s {', '.join(names)}")
    threads = [rule for rule in profile.get("set-threads") or {} if rule not in in_effect["set-threads"]]
    defaults = {size_name(name) for name in in_effect["default-resources"]}
    lost_defaults = [name for name in profile.get("default-resources") or {} if size_name(name) not in defaults]
    for key, names in (("set-threads", threads), ("default-resources", lost_defaults)):
        if names:
            lost[key] = [", ".join(names)]
    return Dropped(lost, train_gpus, stop_signal)


def dropped_settings_line(cluster: str, dropped: Dropped, layer: str | None, scratchflow: str) -> str:
    """The one line that refuses settings which drop what scratchflow's profile of `cluster` sets:
    set in the layer file `layer` (--workflow-profile), with the command that writes the layer whole;
    or, where None, on the command line or in another profile, with how to make such a change
    (`scratchflow`: scratchflow's folder as the user reaches it)."""
    lost = "; ".join(f"{key}: {'; '.join(names)}" for key, names in dropped.lost.items())
    consequences = ["ask for no GPU"] * dropped.train_gpus + ["get no stop signal before their wall time"] * (
        dropped.stop_signal
    )
    what = f"train jobs would {' and '.join(consequences)}" if consequences else "the jobs would run without them"
    if layer is None:
        return (
            f"scratchflow: settings given over scratchflow's {cluster} profile (on the command line, or in another "
            f"profile) replace its keys whole and drop {lost} "
            f"({what}): put the change in a switch file and apply it to your layer (python {scratchflow}/scripts/"
            f'apply_switch.py FILE --cluster {cluster}; {scratchflow}/docs/lab-pipeline.md, "Your settings over a '
            "cluster's profile\")"
        )
    return (
        f"scratchflow: the layer {layer} replaces scratchflow's {cluster} profile's keys whole and drops {lost} "
        f"({what}): write it whole, your values kept: python {scratchflow}/scripts/apply_switch.py {layer}"
    )


CPU_BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


def check_precision(
    config: dict[str, Any], train_resources: Mapping[str, Any], gpus_here: bool, flags: set[str]
) -> None:
    """FSDP needs GPUs, and bf16 on CPUs is slow without bfloat16 instructions: refused for a run
    that is CPU-only (its train rule asks for no GPU, and this machine, where a local run trains,
    has none)."""
    if requested_gpus_per_node(train_resources) is not None or gpus_here:
        return
    training = config["training"]
    if training.get("fsdp") or any(swept_values(config, "fsdp")):
        raise ConfigError(
            "training.fsdp: FSDP shards the model across GPUs, and this run has none (the train rule "
            "asks for no GPU: gres, gpu or --gpus-per-node in the profile); remove fsdp, or train on GPUs"
        )
    if (training.get("bf16") or any(swept_values(config, "bf16"))) and not flags & set(CPU_BFLOAT16_FLAGS):
        raise ConfigError(
            "training.bf16: this run trains on CPU (its train rule asks for no GPU), and this CPU has no "
            f"bfloat16 instructions ({' or '.join(CPU_BFLOAT16_FLAGS)}): bf16 would be far slower than "
            "float32. Set bf16: false, or train on GPUs"
        )


def check_resources(
    resources_by_rule: Mapping[str, Iterable[str]],  # each rule's resource names
    runtimes: Mapping[str, list[int]],
    shapes: Mapping[str, Mapping[str, Any]],
    cluster: dict[str, Any],
) -> None:
    """Resource names must be ones Snakemake, the Slurm plugin or scratchflow use; `shapes` (a rule's
    `nodes`, `processes_per_node` and GPU requests, evaluated) must fit (`check_training_shape`); no
    attempt's runtime (minutes) may exceed the cluster's maximum. `runtimes` maps a
    rule to its runtime for attempt 1, 2, ..."""
    for rule, resources in resources_by_rule.items():
        unknown = sorted(set(resources) - KNOWN_RESOURCES)
        if unknown:
            raise ConfigError(
                f"resource {', '.join(unknown)} of rule {rule} (profile or --set-resources) is not one "
                "Snakemake or the Slurm plugin knows, so it would be ignored; known: "
                + ", ".join(sorted(KNOWN_RESOURCES))
            )
    for rule, shape in shapes.items():
        check_training_shape(rule, shape, cluster["name"])
    limit = cluster.get("max_runtime_minutes")
    for rule, minutes in runtimes.items():
        for attempt, runtime in enumerate(minutes, start=1):
            if limit is not None and isinstance(runtime, int) and runtime > limit:
                raise ConfigError(
                    f"resource runtime of rule {rule}: {runtime} min on attempt {attempt} is above the "
                    f"maximum of cluster {cluster['name']!r}, {limit} min (cluster.max_runtime_minutes); "
                    "the job would be refused or never start. Cap it, e.g. min(1440 * attempt, "
                    f"{limit}), and let checkpoints carry the training across attempts"
                )


# The Slurm plugin hands each job's command, input paths included, to a shell inside double quotes,
# where these still act: a path holding them would run code on the login node.
SHELL_ACTIVE_CHARACTERS = ("$", "`", '"', "\\", "\n")


def _refuse_shell_characters(key: str, value: str) -> None:
    found = [character for character in SHELL_ACTIVE_CHARACTERS if character in value]
    if found:
        raise ConfigError(
            f"{key}: {value!r} contains {' '.join(map(repr, found))}, which a shell would interpret when "
            "the Slurm plugin submits the job; rename the file or folder (or link it under a plain name)"
        )


def check_paths(config: dict[str, Any], workflow_dir: Path) -> None:
    """The dataset (each split) and a local model source must exist here, in the form the config
    says; a token file must exist outside the workflow's directory (where it could end up in git)."""
    dataset = config["dataset"]
    keys = {f"dataset.splits.{name}": location for name, location in dataset.get("splits", {}).items()}
    keys = keys or {"dataset.path": dataset["path"]}
    found = {}
    for key, location in keys.items():
        _refuse_shell_characters(key, location)
        try:
            data = resolve_location(location)
        except DatasetError as error:
            raise ConfigError(f"{key}: {error}") from None
        if not data.exists():
            raise ConfigError(f"{key}: {location!r} does not exist (resolved to {data})")
        if dataset["format"] == "folder" and not data.is_dir():
            raise ConfigError(f"{key}: format 'folder' needs a directory with one sub-folder per label, got {data}")
        if dataset["format"] != "folder" and not data.is_file():
            raise ConfigError(f"{key}: format {dataset['format']!r} needs a file, got {data}")
        found[key] = data.resolve()
    _refuse_overlapping(found)
    if "splits" in dataset and dataset["format"] != "folder":
        _refuse_other_columns(found, dataset["format"])
    if dataset.get("target_column") and dataset["format"] != "folder":
        _refuse_a_missing_target(found, dataset["format"], dataset["target_column"])
    if config.get("model"):
        _check_model_source(config["model"], workflow_dir)


def _refuse_overlapping(found: dict[str, Path]) -> None:
    for key, path in found.items():
        for other_key, other in found.items():
            if key != other_key and (path == other or other.is_relative_to(path)):
                raise ConfigError(f"{other_key}: {other} lies inside {key} ({path}); each split needs its own data")


def _refuse_a_missing_target(found: dict[str, Path], fmt: str, target: str) -> None:
    """Every table of the dataset has the column `dataset.target_column` names (a task reads it)."""
    for path in found.values():
        try:
            columns = table_columns(path, fmt)
        except ValueError:
            continue  # a table it cannot read: the task's check_data says why
        if target not in columns:
            shown = ", ".join(columns[:8]) + (", …" if len(columns) > 8 else "")
            raise ConfigError(
                f"config key dataset.target_column: {target!r} is no column of {path}; its columns: {shown}"
            )


def _refuse_other_columns(found: dict[str, Path], fmt: str) -> None:
    """Every split file has the same columns (the first split's)."""
    columns = {}
    for key, path in found.items():
        try:
            columns[key] = table_columns(path, fmt)
        except ValueError as error:
            raise ConfigError(f"{key}: cannot read {path} as {fmt}: {error}") from None
    first_key = next(iter(columns))
    for key, names in columns.items():
        if names != columns[first_key]:
            raise ConfigError(f"{key}: its columns {names} differ from those of {first_key}: {columns[first_key]}")


def _check_model_source(model: dict[str, Any], workflow_dir: Path) -> None:
    _refuse_shell_characters("model.source", model["source"])
    source = model["source"]
    if is_local_source(source):
        try:
            location = resolve_location(source)
        except DatasetError as error:
            raise ConfigError(f"model.source: {error}") from None
        if not (location / "config.json").is_file():
            raise ConfigError(
                f"model.source: {source!r} looks like a local model, but {location} has no config.json "
                "(a hub name looks like 'org/model'; a local model is a directory saved with save_pretrained)"
            )
    elif os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(source, "config.json"), str):
            raise ConfigError(
                f"model.source: {source!r} is a hub name, HF_HUB_OFFLINE is set, and the model is not in "
                "the local Hugging Face cache; download it where there is internet (huggingface-cli "
                "download), or point model.source at a local copy"
            )

    token_file = model.get("token_file")
    if token_file is not None:
        path = Path(token_file).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"model.token_file: {token_file!r} does not exist")
        if path.is_relative_to(workflow_dir.resolve()) or path.is_relative_to(Path.cwd().resolve()):
            raise ConfigError(
                f"model.token_file: {token_file!r} is inside the workflow's directory, where it could be "
                "committed or copied with the results; keep tokens outside it (e.g. ~/.config/hf-token)"
            )
