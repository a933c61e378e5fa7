"""Tasks: what the lifecycle trains. A task only trains and predicts: it knows nothing about Slurm,
scratch, shared storage or signals. Around its `train`, the piece (scratchflow.piece) stages the
data in, restores the newest checkpoint, hears the stop signal, mirrors each checkpoint to shared
storage, decides whether the piece finished or paused, and syncs the result back.

A task is one module beside its schema fragment `<module>.schema.yaml` (the JSON schema of the
`training:` section; `grid:` accepts exactly the same keys, as lists): a lab's own beside its
Snakefile, named by its module path (`task: ourlab.mlp` is ourlab/mlp.py), or one of scratchflow's
here, `scratchflow.tasks.<name with _ for ->`. What the module must define is the `Task` protocol
below (docs/tasks.md, "Adding a task"); `load_task` checks a module against it (and for its schema
fragment) when the workflow starts, and names what is missing; scratchflow.contract checks a task's
behaviour against it (scripts/check_task.py on a lab's, tests/test_task_contract.py on
scratchflow's).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import json
import math
import os
import pkgutil
import re
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import yaml

# What a task raises when its training diverged: `from scratchflow.tasks import Diverged`.
from scratchflow.failures import Diverged as Diverged
from scratchflow.failures import ProtocolBroken, raised_at

if TYPE_CHECKING:
    from scratchflow.piece_spec import PieceSpec
    from scratchflow.schedule import CheckpointInterval

# What a progress report holds, each a number: where training is, where this job stops, the loss,
# the speed, the seconds left at that speed, and when it was reported (time.time()). A task gives the
# step (with where it stops, and the loss, where it knows them); the piece works out the rest.
PROGRESS_KEYS = ("step", "max_steps", "loss", "samples_per_second", "seconds_left", "at")

# The directions a metric may have in a task's METRICS: higher is better, or lower is.
GOALS = ("max", "min")


class UnknownTask(ValueError):
    """The config names a task that has no module, or a module that is not a whole task."""


class Lifecycle(Protocol):
    """What the piece does for a task while it trains (scratchflow.training_process.TrainingProcess)."""

    def stop_requested(self) -> bool: ...
    def checkpoint_due(self, step: int) -> bool: ...
    def checkpoint_saved(self, checkpoint: Path) -> None: ...
    def report_progress(self, progress: dict[str, Any]) -> None: ...
    def report_step(self, step: int, max_steps: int | None, loss: float | None) -> None: ...
    def run_program(self, argv: list[str], env: dict[str, str]) -> tuple[int, str]: ...


class TrainContext:
    """What a task's `train` is given: the run, where things are, and the piece's services. A view
    of the piece's spec (scratchflow.piece_spec.PieceSpec), with the checkpoint it resumes from."""

    def __init__(self, spec: PieceSpec, resume_from: Path | None, lifecycle: Lifecycle) -> None:
        self._spec, self.lifecycle = spec, lifecycle
        # The newest complete checkpoint, copied into checkpoint_dir; None: the run starts from zero.
        self.resume_from = resume_from

    def __repr__(self) -> str:
        return f"TrainContext(run {self.run_id}, piece {self.piece}, resume_from={self.resume_from})"

    @property
    def run_id(self) -> str:
        return self._spec.run_id

    @property
    def piece(self) -> int:
        """1 for the first job that trains the run, 2 for the one that resumes it, ..."""
        return self._spec.piece

    @property
    def data(self) -> dict[str, Path]:
        """The data, staged on scratch, as the config's dataset gives it, unsplit: {"all": the file
        or folder of dataset.path} or, with dataset.splits, {"train": ..., "test": ...,
        "validation": ...} (validation only if given). The task splits "all" itself
        (scratchflow.dataset.load_splits)."""
        return self._spec.data

    @property
    def dataset(self) -> dict[str, Any]:
        """The config's dataset: section, its defaults filled in."""
        return self._spec.dataset

    @property
    def params(self) -> dict[str, Any]:
        """The run's training parameters (training:, the grid's values in it)."""
        return self._spec.params

    @property
    def model(self) -> Path | None:
        """The base model's cache on shared storage."""
        return self._spec.model

    @property
    def work_dir(self) -> Path:
        """This piece's private scratch folder."""
        return self._spec.work_dir

    @property
    def checkpoint_dir(self) -> Path:
        """On scratch: save checkpoint-<step>/ here, the task's CHECKPOINT_MARKER last."""
        return self._spec.checkpoint_dir

    @property
    def keep_checkpoints(self) -> int:
        """How many complete checkpoints to keep on scratch (shared storage keeps as many)."""
        return self._spec.store.keep

    @property
    def checkpoint_every(self) -> CheckpointInterval:
        """checkpointing.every_minutes and every_steps, for a task whose training is another
        program (scratchflow.tasks.command passes them on); a task in Python asks `checkpoint_due`."""
        return self._spec.checkpoint_every

    @property
    def save_every_steps(self) -> NoReturn:
        raise AttributeError(
            f"TrainContext.save_every_steps is gone since scratchflow {GONE_FROM_THE_CONTEXT['save_every_steps']}"
        )

    @property
    def tracking_dir(self) -> Path:
        """Where to write TensorBoard's events: on scratch; the piece publishes them to the run's
        TensorBoard folder with each checkpoint and as it ends (scratchflow.tracking). Its parent is
        where W&B writes its offline run (`WANDB_DIR`), published as the piece ends."""
        return self._spec.local_tracking_dir

    @property
    def tracking(self) -> str:
        """Config key tracking: "tensorboard", or "wandb" (W&B offline as well)."""
        return self._spec.tracking

    @property
    def threads(self) -> int:
        """CPU threads of this process."""
        return self._spec.threads

    @property
    def nodes(self) -> int:
        """The piece's shape: training processes = nodes x processes_per_node."""
        return self._spec.shape.nodes

    @property
    def processes_per_node(self) -> int:
        return self._spec.shape.processes_per_node

    @property
    def budget_epochs(self) -> int | None:
        """A halving search's rung: train until this many of the run's epochs are done (the schedule
        still that of all its epochs), save a checkpoint there and return the validation metrics
        there: Trained(output, {"validation": {name: number}})."""
        return self._spec.budget_epochs

    def stop_requested(self) -> bool:
        """Whether the job is asked to stop (its wall time near, cancelled, preempted). Ask at the
        end of every step; with several training processes every process must ask at the same
        steps (they agree there), and all get the same answer."""
        return self.lifecycle.stop_requested()

    def checkpoint_due(self, step: int) -> bool:
        """Whether to save a checkpoint at the end of `step`, the run's step just done: once
        checkpointing.every_minutes of training have passed since the last (later if checkpoints
        would take more than 1 % of training), and every checkpointing.every_steps steps if set.
        Ask at the end of every step, after `stop_requested()`; with several training processes every
        process asks at the same steps, and all get the same answer."""
        return self.lifecycle.checkpoint_due(step)

    def checkpoint_saved(self, checkpoint: Path) -> None:
        """Call after saving `checkpoint` (checkpoint_dir/checkpoint-<step>, complete) in every
        process: the piece copies it to shared storage, where the next piece resumes from it."""
        self.lifecycle.checkpoint_saved(checkpoint)

    def report_progress(
        self, step: int | dict[str, Any], max_steps: int | None = None, loss: float | None = None
    ) -> None:
        """Optional: where training is, for `make status` and the train log: the run's step just
        done, where this job stops (`max_steps`) and the loss, where the task knows them. Call it at
        every step if you like, from any process: the piece keeps the first process's latest, works
        out the speed and the time left, and writes it to the run's folder with each checkpoint and at
        most once a minute between them; a piece that fails is recorded with the step it had reached.
        (A whole report, a dict of PROGRESS_KEYS, as tasks of scratchflow 0.4 gave it, is taken too.)"""
        if isinstance(step, dict):
            self.lifecycle.report_progress(step)
        else:
            self.lifecycle.report_step(step, max_steps, loss)

    def run_program(self, argv: list[str], env: dict[str, str]) -> tuple[int, str]:
        """For a task whose training is another program: run it to its end, passing the stop signal on
        to it, copying each complete checkpoint it writes into checkpoint_dir to shared storage as it
        appears; returns its exit code and the last lines of its output."""
        return self.lifecycle.run_program(argv, env)


@dataclass(frozen=True)
class Trained:
    output: Path  # a directory on scratch, synced back whole to results/runs/<run_id>/model/
    # Training figures for record.json's "training" (JSON-serializable; {} will do), and a rung's
    # {"validation": {name: number}}. No step counts: the piece adds global_steps (its newest
    # checkpoint's step) and resumed_from_step (the one it restored, or None), replacing any of the task's.
    metrics: dict[str, Any]


@dataclass(frozen=True)
class PredictContext:
    run_id: str
    data: dict[str, Path]
    dataset: dict[str, Any]
    params: dict[str, Any]
    trained: Path  # the trained output (results/runs/<run_id>/model/), copied to scratch
    work_dir: Path
    threads: int


@dataclass(frozen=True)
class Predicted:
    # name -> number (the test metrics: metrics.json, compared across runs), plus any nested detail
    # as dicts and lists (per class; "confusion_matrix": {"labels": [...],
    # "rows_true_columns_predicted": [[count, ...], ...]} draws the best run's); JSON-serializable.
    metrics: dict[str, Any]
    # With WRITES_PREDICTIONS, a pandas DataFrame of at least one row, written as predictions.csv
    # (its columns are the task's own); otherwise None.
    predictions: Any = None
    # The run's own figures, name -> matplotlib Figure ({"predicted_vs_true": figure}): each saved as
    # results/runs/<run_id>/figures/<name>.png (and closed), the best run's shown in the report.
    figures: dict[str, Any] = field(default_factory=dict)


# A figure's name: a file name's stem (its file is `<name>.png`).
FIGURE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


class WrongPredicted(TypeError):
    """A task's `predict` returned what the protocol does not take (`check_predicted`)."""


class WrongTrained(ProtocolBroken):
    """A task's `train` returned what the protocol does not take (`check_trained`): the run fails
    in its one job, as for any error of the task's own."""


def check_trained(task: str, train: Any, trained: Any, stop_asked: bool, kept: bool = True) -> Trained | None:
    """What the task's `train` returned, as the piece takes it: a `Trained` whose `output` (a path or
    a string) is the folder on scratch that holds what it trained (where its output is the one `kept`:
    rank 0's, of several processes; the others' need not be there), given back as a Path, and whose
    metrics are a JSON-serializable dict; or None, stopped, where a stop was asked. WrongTrained:
    one line naming the task and what it returned, and where `train` is."""
    problem = trained_problem(trained, stop_asked, kept)
    if problem:
        code = getattr(train, "__code__", None)
        where = f"{code.co_filename}:{code.co_firstlineno} (in {code.co_name})" if code else None
        raise WrongTrained(f"task {task}: train returned {problem}", where)
    return None if trained is None else dataclasses.replace(trained, output=Path(trained.output))


def trained_problem(trained: Any, stop_asked: bool, kept: bool = True) -> str | None:
    """What is wrong with what `train` returned, completing "train returned ..." (None: nothing)."""
    if trained is None:
        return None if stop_asked else "None, which means stopped, though no stop was asked"
    if not isinstance(trained, Trained):
        return f"{kind_of(trained)}, not a Trained(output, metrics) (from scratchflow.tasks import Trained)"
    if not isinstance(trained.output, str | os.PathLike):
        return f"an output that is {kind_of(trained.output)}, not the path of the folder on scratch it trained into"
    if kept and not Path(trained.output).is_dir():
        return f"an output, {trained.output}, that is no folder: give the folder on scratch it trained into"
    if not isinstance(trained.metrics, dict):
        return f"metrics that are {kind_of(trained.metrics)}, not a dict of name -> value"
    try:
        json.dumps(trained.metrics)
    except (TypeError, ValueError) as error:
        return f"metrics that are not JSON-serializable ({error})"
    return None


def check_predicted(task: str, predicted: Any) -> Predicted:
    """What the task's `predict` returned, if it is what the workflow writes: a `Predicted` whose
    metrics are a JSON-serializable dict of name -> number or nested detail, holding each name of the
    task's METRICS as a number, and whose predictions are a DataFrame of at least one row with
    WRITES_PREDICTIONS, None without. WrongPredicted: one line naming the task and what it returned."""
    module = load_task(task)
    problem = predicted_problem(predicted, module.METRICS, module.WRITES_PREDICTIONS)
    if problem:
        raise WrongPredicted(f"task {task}: predict returned {problem}")
    return predicted


def predicted_problem(predicted: Any, metric_names: tuple[str, ...] | None, writes_predictions: bool) -> str | None:
    """What is wrong with `predicted`, completing "predict returned ..." (None: nothing), for a task
    whose METRICS are `metric_names` and WRITES_PREDICTIONS `writes_predictions`."""
    import pandas as pd  # here: the workflow loads this module when it plans

    if not isinstance(predicted, Predicted):
        return f"{kind_of(predicted)}, not a Predicted(metrics, predictions) (from scratchflow.tasks import Predicted)"
    metrics = predicted.metrics
    if not isinstance(metrics, dict):
        return f"metrics that are {kind_of(metrics)}, not a dict of name -> number"
    odd = {
        name: value
        for name, value in metrics.items()
        if not isinstance(name, str) or not (is_number(value) or isinstance(value, dict | list))
    }
    if odd:
        return f"metrics that are not name -> number (or nested detail, a dict or list): {odd!r:.300}"
    try:
        json.dumps(metrics)
    except (TypeError, ValueError) as error:
        return f"metrics that JSON cannot hold (metrics.json): {error}"
    named = metric_names or ()
    missing = [name for name in named if not is_number(metrics.get(name))]
    if missing:
        return (
            f"metrics without {', '.join(missing)} as a number (METRICS names {', '.join(named)}): "
            f"it reported {', '.join(map(str, metrics)) or 'none'}"
        )
    predictions = predicted.predictions
    if writes_predictions and not isinstance(predictions, pd.DataFrame):
        return (
            f"predictions that are {kind_of(predictions)}, not a pandas DataFrame (WRITES_PREDICTIONS is True: "
            "they are written to predictions.csv)"
        )
    if writes_predictions and len(predictions) == 0:
        return "an empty predictions DataFrame (no rows; WRITES_PREDICTIONS is True)"
    if not writes_predictions and predictions is not None:
        return (
            f"predictions ({kind_of(predictions)}) though WRITES_PREDICTIONS is False: set it True to have them "
            "written to predictions.csv, or return Predicted(metrics)"
        )
    return figures_problem(predicted.figures)


def figures_problem(figures: Any) -> str | None:
    """What is wrong with a Predicted's `figures` (None: nothing): a dict of name -> matplotlib
    Figure, each name a file name's stem."""
    if not isinstance(figures, dict):
        return f"figures that are {kind_of(figures)}, not a dict of name -> matplotlib Figure"
    misnamed = [name for name in figures if not (isinstance(name, str) and FIGURE_NAME.fullmatch(name))]
    if misnamed:
        return (
            f"figures named {', '.join(map(repr, misnamed))}: a figure's name is its file's "
            "(<name>.png): letters, digits, _ and -"
        )
    if not figures:
        return None
    from matplotlib.figure import Figure  # here: only a task that draws needs matplotlib

    odd = {name: kind_of(figure) for name, figure in figures.items() if not isinstance(figure, Figure)}
    if odd:
        return (
            f"figures that are not a matplotlib Figure: {', '.join(f'{name} ({kind})' for name, kind in odd.items())}"
        )
    return None


def kind_of(value: Any) -> str:
    """`value`'s type, as a message names it: "a list", "an int", "a torch.Tensor", "None"."""
    if value is None:
        return "None"
    kind = type(value)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """The flat numeric entries of a metrics file (per-class tables and matrices left out)."""
    return {name: value for name, value in metrics.items() if is_number(value) and math.isfinite(value)}


class Task(Protocol):
    """What a task module defines (module-level names; the functions as plain functions). A task
    sets no signal handler, calls no torch.distributed barrier or collective, runs no program through
    scratchflow.processes, mirrors nothing and raises nothing to stop: its piece does that, asked
    through its `TrainContext` (scratchflow.contract reads a task's code for it). A module may leave
    out any name of DEFAULTS: `load_task` gives it the default."""

    # The file the task writes last into `checkpoint-<step>/`: its presence makes the checkpoint
    # complete (mirrored to shared storage, resumable).
    CHECKPOINT_MARKER: str
    NEEDS_MODEL: bool  # whether `model:` is required (prefetched to models/<name>/)
    # The test metrics it reports, each with its direction, the first the one runs are ranked by:
    # {"rmse": "min", "mae": "min"}; None: whatever its code reports (the config names the metric).
    # A tuple of names (scratchflow 0.4) is taken too: its directions are then the config's.
    METRICS: dict[str, str] | tuple[str, ...] | None
    WRITES_PREDICTIONS: bool  # whether predict writes predictions.csv
    # True: `train` runs once per job whatever the job's shape (it starts its own processes);
    # False: a job with several training processes runs `train` in each, under torchrun.
    LAUNCHES_OWN_PROCESSES: bool
    # Whether `train` trains a halving search's rungs (context.budget_epochs): a task that does not
    # says False, and a halving search with it is refused at start-up.
    TRAINS_RUNGS: bool

    def check_settings(self, config: dict[str, Any]) -> None:
        """Start-up checks of its settings (every start); raises ValueError naming the key."""

    def check_data(self, dataset: dict[str, Any], sources: dict[str, Path]) -> None:
        """Start-up checks of the data where the config says it is (once per version of it):
        `sources` shaped as `TrainContext.data`. Raises scratchflow.dataset.DatasetError, one line
        naming the key or file, for data it cannot train on (an empty folder among it)."""

    def check_model(self, model_dir: Path) -> None:
        """Proves a prefetched model loads offline (if NEEDS_MODEL)."""

    def train(self, context: TrainContext) -> Trained | None:
        """Trains `context.params` on `context.data`, from `context.resume_from` when set (its weights,
        optimizer, schedule, random states and step). When `context.checkpoint_due(step)` says so,
        and after the last step, saves `checkpoint-<step>/` into `context.checkpoint_dir` (its marker last)
        and calls `context.checkpoint_saved` with it. Asks `context.stop_requested()` after every
        step: when asked, saves a checkpoint the same way and returns None. With
        `context.budget_epochs`, stops the same way at the end of that epoch and returns
        Trained(output, {"validation": the metrics there}) (a `resume_from` already there: evaluates
        it, trains no further). Otherwise returns what it trained when done, its checkpoint after
        the last step saved: its step is the run's `global_steps`."""

    def predict(self, context: PredictContext) -> Predicted:
        """Tests what `train` made."""


TASK_NAMES = tuple(Task.__annotations__) + tuple(
    name for name, value in vars(Task).items() if callable(value) and not name.startswith("_")
)


def _no_check(*_given: Any) -> None:
    """Nothing to check."""


# What a task module may leave out, and what it then is.
DEFAULTS: dict[str, Any] = {
    "CHECKPOINT_MARKER": "COMPLETE",
    "NEEDS_MODEL": False,
    "METRICS": None,
    "WRITES_PREDICTIONS": False,
    "LAUNCHES_OWN_PROCESSES": False,
    "TRAINS_RUNGS": True,
    "check_settings": _no_check,
    "check_model": _no_check,
}


def missing_names(module: ModuleType) -> list[str]:
    """The names of the `Task` protocol that `module` lacks and that have no default (or has, but
    not callable where they must be functions)."""
    functions = set(TASK_NAMES) - set(Task.__annotations__)
    return [
        name
        for name in TASK_NAMES
        if (not hasattr(module, name) and name not in DEFAULTS)
        or (hasattr(module, name) and name in functions and not callable(getattr(module, name)))
    ]


def metric_names(metrics: dict[str, str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """The names of a task's METRICS, the one runs are ranked by first."""
    return tuple(metrics or ())


def declared_goal(metrics: dict[str, str] | tuple[str, ...] | None, metric: str) -> str | None:
    """The direction a task's METRICS declare for `metric` ("max" or "min"), or None: not declared."""
    return metrics.get(metric) if isinstance(metrics, dict) else None


def module_name(task: str) -> str:
    """A built-in task's module (`text-classification`), or a lab's own, named by its module path
    (`ourlab.segmentation`: ourlab/segmentation.py beside the lab's Snakefile)."""
    return task if is_lab_task(task) else f"{__name__}.{task.replace('-', '_')}"


def is_lab_task(task: str) -> bool:
    return "." in task


def find_lab_tasks_in(folder: Path) -> None:
    """A lab's task modules are found in `folder` (its Snakefile's), here and in every process the
    workflow starts: jobs' scripts, their training processes."""
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    # Once: a job's own Snakemake inherits the variable, and reads the Snakefile again.
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(folder) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), *paths]))


def module_root(task: str, module_file: Path) -> Path:
    """The folder a lab's task module is imported from: `ourlab.mlp` at <root>/ourlab/mlp.py (or
    <root>/ourlab/mlp/__init__.py)."""
    depth = len(task.split(".")) - (module_file.name != "__init__.py")
    return module_file.resolve().parents[depth]


def available_tasks() -> list[str]:
    """The built-in tasks."""
    return sorted(info.name.replace("_", "-") for info in pkgutil.iter_modules(__path__) if not info.ispkg)


@cache
def load_task(task: str) -> ModuleType:
    if not is_lab_task(task) and task not in available_tasks():
        raise UnknownTask(
            f"config key task: unknown task {task!r}; the tasks are: {', '.join(available_tasks())}, or a module of "
            "your own named by its module path (ourlab.segmentation: ourlab/segmentation.py beside your Snakefile)"
        )
    try:
        module = importlib.import_module(module_name(task))
    except ModuleNotFoundError as error:
        if error.name is None or not task.startswith(error.name):
            raise  # the task's module found, and one it imports missing
        raise UnknownTask(
            f"config key task: no module {task!r}: a task of your own is a Python module importable from the "
            f"folder of your Snakefile ({task.replace('.', '/')}.py there, beside its schema fragment)"
        ) from None
    if module.__file__ is None:
        raise UnknownTask(
            f"config key task: {task!r} is a folder without __init__.py, not a module: name the task's module "
            f"file ({task.replace('.', '/')}/<name>.py: task: {task}.<name>)"
        )
    missing = missing_names(module)
    schema = Path(module.__file__).with_suffix(".schema.yaml")
    if not schema.is_file():
        missing.append(f"its schema fragment {schema.name} beside it")
    if missing:
        raise UnknownTask(
            f"config key task: {task!r} ({module.__file__}) is not a whole task; it lacks "
            f"{', '.join(missing)} (what a task defines: the Task protocol in scratchflow/tasks/__init__.py)"
        )
    for name, default in DEFAULTS.items():
        if not hasattr(module, name):
            setattr(module, name, default)
    return module


# What a task's context no longer has, and what to write instead: a lab's task written for an older
# release is refused at start-up (scratchflow.config.configured_task), not when its first job trains.
GONE_FROM_THE_CONTEXT = {
    "save_every_steps": "0.3: save a checkpoint at a step's end when context.checkpoint_due(step) says so "
    '(docs/tasks.md, "What `train` does, and returns")',
}


def refuse_what_is_gone(task: str, source: Path) -> None:
    """UnknownTask naming the first use in `source` of a name GONE_FROM_THE_CONTEXT."""
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Attribute) and node.attr in GONE_FROM_THE_CONTEXT:
            raise UnknownTask(
                f"config key task: {task!r} ({source}:{node.lineno}) uses context.{node.attr}, gone since "
                f"scratchflow {GONE_FROM_THE_CONTEXT[node.attr]}"
            )


def loaded_file(task: str) -> Path:
    """The file of the task's module, loaded (load_task refuses a module without one)."""
    return Path(str(load_task(task).__file__))


def task_file(task: str) -> Path | None:
    """The file of the task's module, found without running it (None: not found)."""
    try:
        spec = importlib.util.find_spec(module_name(task))
    except Exception:  # its package's own __init__ failed, say: the error itself is named elsewhere
        return None
    return Path(spec.origin) if spec and spec.origin else None


def described(error: BaseException, module_file: Path | None) -> str:
    """An exception a task raised, in one line: its type, its message and where it was raised (what
    check_task.py and the workflow's start say of a bug in a lab's task, never a traceback)."""
    return (
        f"{type(error).__name__}: {error} (raised at {raised_at(error, module_file) or 'where, Python does not say'})"
    )


@cache
def training_schema(task: str) -> dict[str, Any]:
    """The task's schema fragment for `training:`."""
    path = loaded_file(task).with_suffix(".schema.yaml")
    return yaml.safe_load(path.read_text())


def grid_schema(training: dict[str, Any]) -> dict[str, Any]:
    """`grid:` takes the keys `training:` takes, each as a non-empty list of distinct values."""

    def values_of(item: dict[str, Any]) -> dict[str, Any]:
        return {"type": "array", "minItems": 1, "uniqueItems": True, "items": item}

    schema: dict[str, Any] = {
        "type": "object",
        "minProperties": 1,
        "properties": {key: values_of(item) for key, item in training.get("properties", {}).items()},
    }
    extra = training.get("additionalProperties", False)
    schema["additionalProperties"] = values_of(extra) if isinstance(extra, dict) else extra
    return schema
