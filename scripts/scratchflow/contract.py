"""The task protocol checked by behaviour, on a task's smallest real config: what
tests/test_task_contract.py runs on scratchflow's tasks, and `scripts/check_task.py` on a lab's own
(docs/tasks.md, "What check_task.py checks").

Each check raises `ContractBroken` saying what the task did instead:
- `check_declarations`: the protocol's names, a valid schema fragment that refuses unknown keys;
- `check_refuses_empty_data`: an empty dataset refused with a DatasetError when the workflow starts;
- `check_stops_and_resumes`: under its piece, a real stop signal makes it save, hand the checkpoint on
  and return; the next piece resumes from that checkpoint and trains to the end;
- `check_rung`: a halving search's rung (1 of 2 epochs) and a retry after it that only evaluates;
- `check_predicts`: `predict` on what a run trained to its end returns what the workflow writes;
- `check_leaves_duties_to_its_piece`: nothing in its code (its imports and calls) does what its
  piece does;
- `check_resumes_exactly`, for a program (`task: command`): the run stopped and resumed ends with
  what the same run trains uninterrupted, file for file (its weights, its metrics.json).
`check_all` runs them all (for a program, those that concern it), each on its own: whatever a task
raises in one is that check's failure, with where the task raised it, and the others still run.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from scratchflow import signals, trainer_script
from scratchflow.checkpoints import CheckpointMirroring, CheckpointStore
from scratchflow.config import ConfigError, configured_task, validate_config
from scratchflow.dataset import (
    WHOLE,
    DatasetError,
    config_locations,
    data_sources,
    resolve_location,
    share_package_locations,
)
from scratchflow.files import read_json
from scratchflow.lease import Publication, RunFolder
from scratchflow.piece_spec import Paused, PieceSpec
from scratchflow.schedule import CheckpointInterval
from scratchflow.tasks import (
    GOALS,
    PROGRESS_KEYS,
    TASK_NAMES,
    PredictContext,
    Trained,
    WrongPredicted,
    check_predicted,
    described,
    load_task,
    loaded_file,
    task_file,
    training_schema,
)
from scratchflow.training_process import PieceOutcome, TrainingProcess, restore


class ContractBroken(AssertionError):
    """A task does not keep the task protocol."""


def contract_config(path: Path) -> dict[str, Any]:
    """The contract config at `path` as the workflow would run it: validated, the task's defaults
    filled in, its data there. ConfigError: one line naming what to fix in the config; its kind
    LabTaskFailed: the task's own code failed as it was imported or checked the config's settings."""
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"cannot read it: {error}") from None
    if not isinstance(config, dict):
        raise ConfigError("it holds no mapping of config keys (task:, dataset:, grid:, ...)")
    validate_config(config)
    configured_task(config)
    try:
        share_package_locations(config_locations(config))  # fetched here, as where a workflow starts
    except DatasetError as error:
        raise ConfigError(str(error)) from None
    check_data_is_there(config["dataset"])
    return config


def check_data_is_there(dataset: dict[str, Any]) -> None:
    """Each data location of the config (`dataset.path`, or each file of `dataset.splits`) is there;
    ConfigError naming the key and the path where one is not."""
    try:
        sources = data_sources(dataset)
    except DatasetError as error:
        raise ConfigError(f"config key dataset: {error}") from None
    for name, location in sources.items():
        if not location.exists():
            key = "dataset.path" if name == WHOLE else f"dataset.splits.{name}"
            raise ConfigError(f"config key {key}: {location.absolute()} is not there")


def check_declarations(task: str) -> None:
    module = load_task(task)  # refuses a module that lacks a name, naming it
    missing = [name for name in TASK_NAMES if not hasattr(module, name)]
    if missing or not (isinstance(module.CHECKPOINT_MARKER, str) and module.CHECKPOINT_MARKER):
        raise ContractBroken(f"{task}: lacks {missing or 'a CHECKPOINT_MARKER file name'}")
    if metrics_problem(module.METRICS):
        raise ContractBroken(f"{task}: METRICS {metrics_problem(module.METRICS)}, not {module.METRICS!r}")
    for flag in ("NEEDS_MODEL", "WRITES_PREDICTIONS", "LAUNCHES_OWN_PROCESSES", "TRAINS_RUNGS"):
        if not isinstance(getattr(module, flag), bool):
            raise ContractBroken(f"{task}: {flag} is True or False, not {getattr(module, flag)!r}")
    schema = training_schema(task)
    jsonschema.Draft202012Validator.check_schema(schema)
    if schema.get("additionalProperties") is True:
        raise ContractBroken(f"{task}: its schema fragment takes any key: a typo in training: must be refused")


def metrics_problem(metrics: Any) -> str | None:
    """What is wrong with a task's METRICS (None: nothing): each metric's direction, the first the one
    runs are ranked by, as {"rmse": "min", "mae": "min"}; or None (whatever its code reports)."""
    if metrics is None:
        return None
    if isinstance(metrics, tuple) and metrics and all(isinstance(name, str) for name in metrics):
        return None  # scratchflow 0.4's names without directions: the config's aggregate.goal then
    if not isinstance(metrics, dict) or not metrics:
        return 'is each metric\'s direction, as {"rmse": "min", "accuracy": "max"} (the first ranks the runs), or None'
    wrong = {name: goal for name, goal in metrics.items() if not isinstance(name, str) or goal not in GOALS}
    if wrong:
        return f'gives each metric a direction, "max" (higher is better) or "min" (lower is): {wrong!r}'
    return None


def check_refuses_empty_data(config: dict[str, Any], work: Path) -> None:
    """`check_data` on the config's dataset with `dataset.path` an empty folder (no splits)."""
    empty = work / "empty-dataset"
    empty.mkdir(parents=True)
    dataset = {**config["dataset"], "path": str(empty)}
    dataset.pop("splits", None)
    task = config["task"]
    try:
        load_task(task).check_data(dataset, data_sources(dataset))
    except DatasetError:
        return
    except Exception as error:
        raise ContractBroken(
            f"{task}: check_data must refuse an empty dataset with scratchflow.dataset.DatasetError (the "
            f"workflow then names it in one line); it raised {described(error, task_file(task))}"
        ) from error
    raise ContractBroken(f"{task}: check_data accepted an empty dataset (dataset.path an empty folder)")


class QuickMirroring(CheckpointMirroring):
    """Looks for a program's new checkpoints every 10 ms, not every second: a small program may
    finish between two looks."""

    def watching(self, poll_seconds: float = 0.01):
        return super().watching(poll_seconds)


@dataclasses.dataclass(frozen=True)
class StopsAfterFirstCheckpoint(CheckpointStore):
    """The run's shared checkpoints; the first one mirrored sends this process the stop signal, as
    Slurm's wall-time warning would, at a moment the check knows."""

    stop: bool = True

    def mirroring(self, local_folder: Path, restored_step: int | None = None, **then: Any) -> CheckpointMirroring:
        return QuickMirroring(self, local_folder, restored_step, **then)

    def mirror(self, local_checkpoint: Path, with_it: Callable[[Publication], None] | None = None) -> Path:
        destination = super().mirror(local_checkpoint, with_it)
        if self.stop and len(self.complete()) == 1:
            os.kill(os.getpid(), signals.stop_signal())
        return destination


class ProgressCheckedProcess(TrainingProcess):
    """A piece whose task's progress reports are checked as they come (`make status` reads them),
    and each written, not one an interval."""

    def __init__(self, spec: PieceSpec) -> None:
        super().__init__(spec)
        self.since, self.progress_interval = time.time(), 0.0

    def report_progress(self, progress: dict[str, Any]) -> None:
        problem = progress_problem(progress, self.since)
        if problem:
            raise ContractBroken(f"report_progress({progress!r:.300}): {problem}")
        super().report_progress(progress)


def progress_problem(progress: Any, since: float) -> str | None:
    """What is wrong with a progress report (None: nothing): each of PROGRESS_KEYS a number, and `at`
    the time it was reported (time.time())."""
    if not isinstance(progress, dict):
        return "a progress report is a dict"
    missing = [key for key in ("step", "at") if key not in progress]
    if missing:
        return f"it lacks {', '.join(missing)} (a report holds the step, and may hold {', '.join(PROGRESS_KEYS)})"
    not_numbers = [
        key
        for key in PROGRESS_KEYS
        if key in progress and (isinstance(progress[key], bool) or not isinstance(progress[key], int | float))
    ]
    if not_numbers:
        return f"not a number: {', '.join(not_numbers)}"
    if not since <= progress["at"] <= time.time():
        return "at is not the time it was reported (time.time())"
    return None


def piece_spec(config: dict[str, Any], work: Path, piece: int, store: CheckpointStore) -> PieceSpec:
    work_dir = work / f"piece-{piece}"
    work_dir.mkdir(parents=True)
    return PieceSpec(
        task=config["task"],
        run_id="contract00",
        identity={"dataset": config["dataset"], "training": config["training"]},
        model=resolve_location(config["model"]["source"]) if config.get("model") else None,  # package: too
        store=store,
        tracking_dir=work / "tensorboard",
        tracking="tensorboard",
        checkpoint_every=CheckpointInterval.of(config["checkpointing"]),
        stop_grace_seconds=30,
        threads=1,
        piece=piece,
        work_dir=work_dir,
        data=data_sources(config["dataset"]),
    )


def train_piece(spec: PieceSpec) -> PieceOutcome:
    """The piece's training as on a node the job prepared: from the newest checkpoint, restored.
    Every progress report is checked (ProgressCheckedProcess)."""
    restore(spec)
    trainer = ProgressCheckedProcess(spec)
    outcome = trainer.train()
    if not trainer.task.LAUNCHES_OWN_PROCESSES and trainer.schedule.costs and not trainer.schedule.asked:
        raise ContractBroken(
            f"{spec.task}: saved checkpoints without asking context.checkpoint_due(step) at a step's end: they "
            "never follow checkpointing.every_minutes (a job killed loses all its training)"
        )
    return outcome


def trained_piece(spec: PieceSpec) -> Trained:
    outcome = train_piece(spec)
    if isinstance(outcome, Paused):
        raise ContractBroken(f"{spec.task}: paused unasked: {outcome.line()}")
    return outcome


def check_stops_and_resumes(config: dict[str, Any], work: Path) -> Trained:
    """With USR2 as the stop signal (not the default: the piece listens for the one configured).
    Returns what the run trained to its end (in `work`)."""
    task, marker = config["task"], load_task(config["task"]).CHECKPOINT_MARKER
    signals.use_stop_signal("USR2")
    try:
        first = StopsAfterFirstCheckpoint(RunFolder(work / "shared"), marker)
        outcome = train_piece(piece_spec(config, work, 1, first))
        if isinstance(outcome, Paused):
            if outcome.signal != "SIGUSR2" or outcome.reached_step is None:
                raise ContractBroken(f"{task}: paused, but not at a saved checkpoint: {outcome.line()}")
        else:
            if first.newest() is None:
                raise ContractBroken(
                    f"{task}: trained to its end without a complete checkpoint handed to its piece: save "
                    f"checkpoint-<step>/ when context.checkpoint_due(step) says, {marker} in it last, then call "
                    "context.checkpoint_saved(it)"
                )
            every_steps = config["checkpointing"]["every_steps"]
            interval = (
                f"has only a few steps more than checkpointing.every_steps ({every_steps}), lower it there"
                if every_steps
                else "saves by time alone (checkpointing.every_steps unset), set every_steps there to a few steps"
            )
            raise ContractBroken(
                f"{task}: trained to its end through a stop signal sent at its first checkpoint; if the contract "
                f"config's training {interval}; else stop at the next step once context.stop_requested() says so"
            )
        stopped_at = first.newest_step()
        if signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN:
            raise ContractBroken(f"{task}: left the stop signal ignored")
        resumed = StopsAfterFirstCheckpoint(RunFolder(work / "shared"), marker, stop=False)
        trained = trained_piece(piece_spec(config, work, 2, resumed))
    finally:
        signals.use_stop_signal(signals.DEFAULT_STOP_SIGNAL)
    figures = trained.metrics
    if stopped_at is None or figures.get("resumed_from_step") != stopped_at or not figures["global_steps"] > stopped_at:
        raise ContractBroken(
            f"{task}: the next piece did not resume from checkpoint-{stopped_at} and train on to a checkpoint "
            f"after its last step: resumed_from_step {figures.get('resumed_from_step')}, its newest checkpoint "
            f"(global_steps) {figures.get('global_steps')}"
        )
    if not (trained.output.is_dir() and any(trained.output.iterdir())):
        raise ContractBroken(f"{task}: what it trained ({trained.output}) is not a folder with something in it")
    return trained


def check_rung(config: dict[str, Any], work: Path) -> None:
    """1 of the run's 2 epochs, then a checkpoint and the validation metrics there; a retry after that
    checkpoint trains no further and reports the same; the run's last job resumes from the rung."""
    task = config["task"]
    config = {**config, "training": {**config["training"], "epochs": 2}}
    store = CheckpointStore(RunFolder(work / "shared-rung"), load_task(task).CHECKPOINT_MARKER)
    rung = trained_piece(dataclasses.replace(piece_spec(config, work / "rung", 1, store), budget_epochs=1))
    retried = trained_piece(dataclasses.replace(piece_spec(config, work / "rung", 2, store), budget_epochs=1))
    validation = rung.metrics.get("validation")
    if not validation or retried.metrics.get("validation") != validation:
        raise ContractBroken(
            f"{task}: a rung returns Trained(metrics={{'validation': {{...}}}}), the metrics on the validation "
            f"split at the end of budget_epochs, and a retry from that checkpoint the same: the rung's "
            f"{rung.metrics.get('validation')!r:.200}, the retry's {retried.metrics.get('validation')!r:.200} "
            "(a task that trains no halving search's rungs declares TRAINS_RUNGS = False)"
        )
    rung_end = rung.metrics["global_steps"]
    if rung_end is None or not retried.metrics["global_steps"] == rung_end == store.newest_step():
        raise ContractBroken(
            f"{task}: a rung saves a checkpoint at the end of budget_epochs (saved: {rung_end}), and a retry "
            f"from it trains no further (its newest checkpoint: {retried.metrics['global_steps']})"
        )
    last = trained_piece(piece_spec(config, work / "rung", 3, store))
    if last.metrics["resumed_from_step"] != rung_end or last.metrics["global_steps"] != 2 * rung_end:
        raise ContractBroken(
            f"{task}: the run's last job did not resume from the rung's checkpoint-{rung_end} and train to the "
            f"end of epoch 2 (step {2 * rung_end}), with a checkpoint there: its newest is "
            f"{last.metrics['global_steps']}"
        )


def check_predicts(config: dict[str, Any], work: Path, trained: Trained | None = None) -> None:
    """`predict` on `trained` (what a run trained to its end; None: a run trained here, in one
    piece), in a context as the predict job makes it: the trained output copied into its work folder.
    What it returns is what the workflow writes (scratchflow.tasks.check_predicted)."""
    task = config["task"]
    if trained is None:
        store = CheckpointStore(RunFolder(work / "shared"), load_task(task).CHECKPOINT_MARKER)
        trained = trained_piece(piece_spec(config, work, 1, store))
    scratch = work / "predict"
    shutil.copytree(trained.output, scratch / "model")
    context = PredictContext(
        run_id="contract00",
        data=data_sources(config["dataset"]),
        dataset=config["dataset"],
        params=config["training"],
        trained=scratch / "model",
        work_dir=scratch,
        threads=1,
    )
    try:
        check_predicted(task, load_task(task).predict(context))
    except WrongPredicted as wrong:
        raise ContractBroken(str(wrong)) from None


def check_resumes_exactly(config: dict[str, Any], work: Path, resumed: Trained | None) -> None:
    """A run stopped and resumed (`resumed`, from check_stops_and_resumes) ends with the files of the
    same run trained in one piece, byte for byte: a task or program whose pieces draw anything
    unseeded (its data split, a head's initialisation), or that restores less than it saved (the
    optimizer's state), trains each piece on something else."""
    task = config["task"]
    if resumed is None:
        raise ContractBroken(f"{task}: not checked: the run was not stopped and resumed (the check before failed)")
    store = StopsAfterFirstCheckpoint(RunFolder(work / "shared"), load_task(task).CHECKPOINT_MARKER, stop=False)
    uninterrupted = trained_piece(piece_spec(config, work, 1, store))
    differing = different_files(resumed.output, uninterrupted.output)
    if differing:
        name = differing[0]
        detail = (
            metrics_difference(resumed.output / name, uninterrupted.output / name) if name.endswith(".json") else ""
        )
        raise ContractBroken(
            f"{task}: stopped and resumed, the run ended otherwise than uninterrupted: {name} differs{detail}"
            + (f" (and {len(differing) - 1} more file(s))" if len(differing) > 1 else "")
            + "; what it draws at random must come from its seed or its checkpoint: seed its data split and its "
            "model's initialisation, and restore the optimizer's and the random states with the weights"
        )


# Files of a trained model that say where it was trained, not what: the Hugging Face Trainer's
# settings, pickled with the piece's scratch paths in them (written beside the model, never read back).
WHERE_NOT_WHAT = {"training_args.bin"}


def different_files(mine: Path, theirs: Path) -> list[str]:
    """The files of one folder that the other lacks or holds otherwise, byte for byte (relative paths),
    but those that say only where it was trained (WHERE_NOT_WHAT)."""
    names = {
        str(path.relative_to(folder))
        for folder in (mine, theirs)
        for path in folder.rglob("*")
        if path.is_file() and path.name not in WHERE_NOT_WHAT
    }
    return sorted(
        name
        for name in names
        if not ((mine / name).is_file() and (theirs / name).is_file())
        or (mine / name).read_bytes() != (theirs / name).read_bytes()
    )


def metrics_difference(resumed: Path, uninterrupted: Path) -> str:
    """The first figure that differs between two metrics files, as ` (name: resumed against uninterrupted)`:
    a number before nested detail (a confusion matrix)."""
    try:
        mine, theirs = read_json(resumed), read_json(uninterrupted)
    except (OSError, ValueError):
        return ""
    if not (isinstance(mine, dict) and isinstance(theirs, dict)):
        return ""
    names = set(mine) | set(theirs)
    for name in sorted(names, key=lambda name: (isinstance(mine.get(name, theirs.get(name)), dict | list), name)):
        if mine.get(name) != theirs.get(name):
            return f" ({name}: {mine.get(name)} resumed, {theirs.get(name)} uninterrupted)"
    return ""


# What a task leaves to its piece (scratchflow.piece), found in its code: each duty's test of one
# use of a name (fully qualified where the module imported it) by an import, a call or a reference.
SIGNAL_HANDLERS = {
    *("signal.signal", "signal.setitimer", "signal.alarm", "signal.pthread_sigmask", "signal.sigwait"),
    *("signal.sigwaitinfo", "signal.sigtimedwait", "signal.set_wakeup_fd", "signal.siginterrupt"),
}
# scratchflow.signals' names a task may read: its constants, and which signal stops a job.
SIGNALS_TO_READ = {"stop_signal", "stop_signals"}
COLLECTIVES = {
    *("all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "all_to_all", "all_to_all_single"),
    *("barrier", "monitored_barrier", "broadcast", "broadcast_object_list", "reduce", "reduce_scatter"),
    *("reduce_scatter_tensor", "gather", "gather_object", "scatter", "scatter_object_list"),
    *("send", "recv", "isend", "irecv", "batch_isend_irecv"),
    *("init_process_group", "destroy_process_group", "new_group"),
}
MIRRORING_NAMES = {"scratchflow.checkpoints.CheckpointStore", "scratchflow.checkpoints.CheckpointMirroring"}
MIRRORING_METHODS = {"mirror", "mirror_newest", "restore_newest_to"}


def _last(name: str) -> str:
    return name.rpartition(".")[2]


def _listens(name: str, how: str) -> bool:
    if how == "call" and name in SIGNAL_HANDLERS:
        return True
    inside, _, member = name.partition("scratchflow.signals.")
    return not inside and bool(member) and not (member.isupper() or member in SIGNALS_TO_READ)


PIECE_DUTIES: dict[str, Callable[[str, str], bool]] = {
    "listening for signals": _listens,
    "running programs itself": lambda name, how: (
        name == "scratchflow.processes" or name.startswith("scratchflow.processes.")
    ),
    "barriers or collectives": lambda name, how: (
        how == "call" and name.startswith("torch.distributed.") and _last(name) in COLLECTIVES
    ),
    "mirroring to shared storage": lambda name, how: (
        name in MIRRORING_NAMES or (how == "call" and "." in name and _last(name) in MIRRORING_METHODS)
    ),
    "deciding that it stopped": lambda name, how: _last(name) in {"TrainingStopped", "Paused"},
}


def package_of(module_file: Path) -> list[str]:
    """The package a module file lies in (its folders that hold an __init__.py), outermost first."""
    package: list[str] = []
    folder = module_file.parent
    while (folder / "__init__.py").is_file():
        package.insert(0, folder.name)
        folder = folder.parent
    return package


def uses_of_names(source: str, package: list[str]) -> list[tuple[int, str, str]]:
    """(line, name, how) for each import ("import"), call ("call") and other use ("reference") of a
    name in `source`, the name fully qualified through the module's imports (`dist.barrier` after
    `import torch.distributed as dist` is torch.distributed.barrier); `package`: the module's, for
    its relative imports."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}
    uses: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.partition(".")[0]  # `import torch.distributed` binds torch
                aliases[alias.asname or top] = alias.name if alias.asname else top
                uses.append((node.lineno, alias.name, "import"))
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                imported = f"{module}.{alias.name}"
                if alias.name != "*":
                    aliases[alias.asname or alias.name] = imported
                uses.append((node.lineno, imported, "import"))

    def qualified(node: ast.expr) -> str:
        if isinstance(node, ast.Name):
            return aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            return f"{qualified(node.value)}.{node.attr}"
        return "(an expression)"

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            uses.append((node.lineno, qualified(node.func), "call"))
        elif isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Load):
            uses.append((node.lineno, qualified(node), "reference"))
    return sorted(set(uses))


def check_leaves_duties_to_its_piece(module_file: Path) -> None:
    """Reads the module's code: what it imports and calls, not its words (a docstring may name a
    signal; `subprocess` may serve something else; torch.distributed.get_rank() is not a barrier)."""
    uses = uses_of_names(module_file.read_text(), package_of(module_file))
    found = []
    for duty, does_it in PIECE_DUTIES.items():
        where = sorted({(line, name) for line, name, how in uses if does_it(name, how)})
        if where:
            shown = "; ".join(f"line {line}: {name}" for line, name in where[:3])
            found.append(f"{duty} ({shown}{'; ...' if len(where) > 3 else ''})")
    if found:
        raise ContractBroken(f"{module_file} does what its piece does: {', '.join(found)}")


class CheckSkipped(Exception):
    """A check that does not apply to the task, and why."""


def skipped(why: str) -> Callable[[Path], None]:
    def check(_work: Path) -> None:
        raise CheckSkipped(why)

    return check


def check_all(config: dict[str, Any]) -> Iterator[tuple[str, ContractBroken | CheckSkipped | None]]:
    """Every check of `config`'s task on `config` (validated, its defaults filled in), each in a
    folder of its own: (what was checked, how it broke or None). Whatever the task raises in a check
    is that check's failure, and the next check runs. The predict check predicts what the stop and
    resume check trained, where that check passed (one training fewer)."""
    task = config["task"]
    module_file = task_file(task)
    resumed: list[Trained] = []
    checks: dict[str, Callable[[Path], Any]] = {
        "declarations": lambda work: check_declarations(task),
        "an empty dataset refused": lambda work: check_refuses_empty_data(config, work),
        "stopped by the stop signal, then resumed": lambda work: resumed.append(check_stops_and_resumes(config, work)),
        "predicted what it trained": lambda work: check_predicts(config, work, resumed[0] if resumed else None),
        "a halving search's rung": lambda work: check_rung(config, work),
        "its piece's duties left to it": lambda work: check_leaves_duties_to_its_piece(loaded_file(task)),
        "resumed to the uninterrupted run's results": lambda work: check_resumes_exactly(
            config, work, resumed[0] if resumed else None
        ),
    }
    if task == "command":  # a program's: the task's own module is scratchflow's
        checks = {
            name: check
            for name, check in checks.items()
            if name not in ("declarations", "its piece's duties left to it")
        }
        if trainer_script.launched_script(config["training"]["command"]):
            del checks["a halving search's rung"]  # not driven by the launcher (docs/tasks.md)
    elif not load_task(task).TRAINS_RUNGS:
        checks["a halving search's rung"] = skipped(
            "TRAINS_RUNGS is False: a halving search with this task is refused at start-up"
        )
    with tempfile.TemporaryDirectory(prefix="check-task-") as folder:
        for number, (name, check) in enumerate(checks.items()):
            work = Path(folder) / f"check-{number}"
            work.mkdir()
            try:
                check(work)
            except (ContractBroken, CheckSkipped) as broken:
                yield name, broken
            except (Exception, SystemExit) as error:  # the task's own code failed: said, not raised
                yield name, ContractBroken(described(error, module_file))
            else:
                yield name, None
