"""command: the lab's own training program, run inside the lifecycle.

The program is `training.command`, an argv list run without a shell, in the workflow's working
directory. It learns where things are from environment variables (the contract table of docs/tasks.md,
"Your own training code"):

    SCRATCHFLOW_DATA_DIR          the verified, extracted data on node-local scratch, always a folder:
                                  dataset.path's folder, or the folder holding its one file, or with
                                  dataset.splits the folder holding train, validation, test
    SCRATCHFLOW_DATA_FILE         dataset.path's one file there, when it is a file ('' otherwise)
    SCRATCHFLOW_CHECKPOINT_DIR    checkpoints on scratch: write `checkpoint-<step>/`, and the file
                                  COMPLETE into it last. Each complete one is mirrored to shared storage
    SCRATCHFLOW_RESUME_FROM       the newest complete checkpoint, copied in from shared storage ('' if none)
    SCRATCHFLOW_OUTPUT_DIR        synced back whole to results/runs/<run_id>/model/; must hold metrics.json
                                  (and may hold predictions.csv)
    SCRATCHFLOW_PARAMS            a JSON file of the run's parameters (the training keys but `command`)
    SCRATCHFLOW_SAVE_EVERY_SECONDS
                                  checkpointing.every_minutes in seconds: save a checkpoint once this
                                  much training has passed since the last (and after the last step)
    SCRATCHFLOW_SAVE_EVERY_STEPS  checkpointing.every_steps, set only where the config sets it: save
                                  every this many steps as well
    SCRATCHFLOW_RUN_ID, SCRATCHFLOW_PIECE, SCRATCHFLOW_MODEL_DIR (if a model)
    SCRATCHFLOW_STOP_FILE         appears when the job is asked to stop (for code that cannot take signals)
    SCRATCHFLOW_BUDGET_EPOCHS     set in a halving search's rung job ('' otherwise): train until that many
                                  of the run's epochs are done (its schedule still that of all its
                                  epochs), write a complete checkpoint there, write validation.json
                                  (metric name -> number on the validation data) into
                                  SCRATCHFLOW_OUTPUT_DIR and exit 0. Resumed from a checkpoint already
                                  there, evaluate it and write validation.json without training
    SCRATCHFLOW_TRACKING_DIR      TensorBoard's folder, on scratch: published to the run's, kept across
                                  pieces, with each checkpoint and as the piece ends
    WANDB_MODE, WANDB_DIR, WANDB_RUN_ID, ...
                                  with tracking: wandb, W&B's own variables (tracking.wandb_environment):
                                  a bare wandb.init() logs this piece offline beside the TensorBoard folder
    SCRATCHFLOW_NODES, SCRATCHFLOW_PROCESSES_PER_NODE
                                  the train rule's shape, for a program that starts its own processes

On the stop signal (checkpointing.stop_signal, named in SCRATCHFLOW_STOP_SIGNAL) or SIGTERM the job
forwards the signal to the program's process group, waits up to checkpointing.stop_grace_seconds for
it to exit, mirrors its newest complete checkpoint, and records
the piece as paused: the retry resumes. After a stop the program's exit status does not matter
(0, or 128 + the signal's number, are both fine): it paused unless it wrote metrics.json, which means
it finished. `python` in the command is the workflow's own environment's (first on PATH).
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
import re
import shutil
import signal
from pathlib import Path
from typing import Any

from scratchflow import SCRATCHFLOW_DIR, tracking, trainer_script
from scratchflow.dataset import DatasetError
from scratchflow.failures import Diverged
from scratchflow.files import read_json
from scratchflow.program import DIVERGED_FILE
from scratchflow.record import git_state
from scratchflow.search import swept_keys
from scratchflow.signals import STOP_FILE_NAME
from scratchflow.tasks import PredictContext, Predicted, TrainContext, Trained

log = logging.getLogger(__name__)

CHECKPOINT_MARKER = "COMPLETE"
# The program starts its own processes (the shape is in its environment); it runs once per job.
LAUNCHES_OWN_PROCESSES = True
# No METRICS: whatever the program writes into metrics.json (the config names the one that ranks).
METRICS_FILE = "metrics.json"
VALIDATION_FILE = "validation.json"  # a rung's validation metrics (and at the end, if written)


class CommandFailed(RuntimeError):
    """The program exited with an error, or left no usable metrics: the lab's program's failure, told
    by its own output, not by scratchflow's traceback (the job's log holds no traceback of the piece)."""

    traceback_says_nothing = True

    def __init__(self, message: str, exit_status: int | None = None) -> None:
        super().__init__(message)
        self.exit_status = exit_status  # the program's (negative: the signal that killed it); None: it exited 0


# Interpreters whose first argument that is not an option is the script they run, and the options
# that mean there is no script file (code given inline, or a module) or that take a value.
INTERPRETERS = {
    "python": ({"-c", "-m"}, {"-W", "-X"}),
    "bash": ({"-c"}, {"-o", "-O"}),
    "sh": ({"-c"}, {"-o"}),
    "zsh": ({"-c"}, {"-o"}),
    "Rscript": ({"-e"}, set()),
    "julia": ({"-e", "-E", "--eval", "--print"}, {"-t", "--threads", "-p", "--procs", "--project"}),
    "perl": ({"-e", "-E"}, set()),
    "ruby": ({"-e"}, set()),
    "node": ({"-e", "--eval", "-p", "--print"}, set()),
}


def check_settings(config: dict[str, Any]) -> None:
    """The program exists here, and so does the script a known interpreter is given (relative to the
    working directory, where the job runs it); every grid key is one of the program's parameters."""
    training = config["training"]
    check_program(training["command"])
    script = trainer_script.launched_script(training["command"])
    if script is not None:
        if not Path(script).expanduser().is_file():
            raise ValueError(f"training.command: {trainer_script.MODULE} would run {script!r}, which is not here")
        problem = trainer_script.script_problem(Path(script).expanduser(), sorted(set(training) - {"command"}))
        if problem:
            raise ValueError(problem)
    section = "grid" if "grid" in config else "search.space"
    unknown = sorted(set(swept_keys(config)) - set(training))
    if unknown:
        near = difflib.get_close_matches(unknown[0], training, n=1)
        raise ValueError(
            f"{section}.{unknown[0]}: not a parameter of the program: a {section} key of task command must name "
            "a key of training:, which declares the program's parameters and their defaults"
            + (f" (did you mean {near[0]!r}?)" if near else "")
            + f"; training: has {', '.join(sorted(key for key in training if key != 'command'))}. "
            "Add it to training: with its default if the program takes it"
        )


def check_program(argv: list[str]) -> None:
    program = argv[0]
    if "/" in program:
        path = Path(program).expanduser()
        if not path.is_file():
            raise ValueError(f"training.command: {program!r} does not exist (resolved to {path.resolve()})")
        if not os.access(path, os.X_OK):
            raise ValueError(
                f"training.command: {program!r} is not executable; chmod +x it, or start the command "
                "with its interpreter, e.g. [python, script.py]"
            )
    elif shutil.which(program) is None:
        raise ValueError(f"training.command: program {program!r} is not found on PATH")
    script = interpreted_script(argv)
    if script is not None and not Path(script).expanduser().is_file():
        raise ValueError(
            f"training.command: {Path(program).name} would run {script!r}, which does not exist here "
            f"(resolved to {Path(script).expanduser().resolve()}; the job runs the command in the directory "
            "you run snakemake in)"
        )


def interpreted_script(argv: list[str]) -> str | None:
    """The script file a known interpreter (python3.11 counts as python) runs, or None (another
    program, inline code, a module, or an interactive interpreter)."""
    name = re.sub(r"[0-9.]+$", "", Path(argv[0]).name)
    if name not in INTERPRETERS:
        return None
    no_script, with_value = INTERPRETERS[name]
    arguments = iter(argv[1:])
    for argument in arguments:
        if argument in no_script or argument == "-":
            return None
        if argument in with_value:
            next(arguments, None)
        elif not argument.startswith("-"):
            return argument
    return None


def program_file(argv: list[str]) -> Path | None:
    """The file of the program (the script the Trainer launcher or a known interpreter runs, or the
    program itself), as `program_git` finds it; None for a program found on PATH."""
    program = Path(trainer_script.launched_script(argv) or interpreted_script(argv) or argv[0]).expanduser()
    return program if program.is_file() else None


def check_data(dataset: dict[str, Any], sources: dict[str, Path]) -> None:
    """The program reads the data itself, in its own format; that each location holds a file to read
    is all that can be checked here."""
    for name, location in sources.items():
        if location.is_dir() and not any(path.is_file() for path in location.rglob("*")):
            raise DatasetError(f"{location} ({name}): the dataset has no files")


def check_model(model_dir: Path) -> None:
    """The program loads the model itself."""


def read_metrics(path: Path) -> dict[str, Any]:
    """metrics.json: a JSON object of metric name -> number, and any nested detail (a dict or list,
    as a `confusion_matrix`)."""
    if not path.is_file():
        raise CommandFailed(f"{path.name} is missing: the command must write {path.name} into $SCRATCHFLOW_OUTPUT_DIR")
    try:
        metrics = read_json(path)
    except ValueError as error:
        raise CommandFailed(f"{path.name} is not valid JSON: {error}") from None
    if not isinstance(metrics, dict) or not metrics:
        raise CommandFailed(f"{path.name} must be a JSON object of metric name -> number, got {metrics!r:.200}")
    bad = {
        name: value
        for name, value in metrics.items()
        if not isinstance(value, dict | list)
        and (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value))
    }
    if bad:
        raise CommandFailed(f"{path.name}: not a finite number (nor nested detail, a dict or list): {bad!r:.300}")
    return metrics


def data_locations(data: dict[str, Path]) -> tuple[Path, Path | None]:
    """SCRATCHFLOW_DATA_DIR, always a folder (the dataset's own folder, the one holding its single
    file, or the one holding its split files), and SCRATCHFLOW_DATA_FILE, that single file or None."""
    if "all" not in data:
        return next(iter(data.values())).parent, None
    whole = data["all"]
    return (whole.parent, whole) if whole.is_file() else (whole, None)


def train(context: TrainContext) -> Trained | None:
    params = {key: value for key, value in context.params.items() if key != "command"}
    output_dir = context.work_dir / "output"
    output_dir.mkdir()
    params_file = context.work_dir / "params.json"
    params_file.write_text(json.dumps(params, indent=2, sort_keys=True))
    data_dir, data_file = data_locations(context.data)
    env = {
        **os.environ,
        "SCRATCHFLOW_DATA_DIR": str(data_dir),
        "SCRATCHFLOW_DATA_FILE": str(data_file or ""),
        "SCRATCHFLOW_CHECKPOINT_DIR": str(context.checkpoint_dir),
        "SCRATCHFLOW_RESUME_FROM": str(context.resume_from or ""),
        "SCRATCHFLOW_OUTPUT_DIR": str(output_dir),
        "SCRATCHFLOW_PARAMS": str(params_file),
        "SCRATCHFLOW_RUN_ID": context.run_id,
        "SCRATCHFLOW_PIECE": str(context.piece),
        "SCRATCHFLOW_SAVE_EVERY_SECONDS": str(context.checkpoint_every.minutes * 60),
        "SCRATCHFLOW_TRACKING_DIR": str(context.tracking_dir),
        "SCRATCHFLOW_STOP_FILE": str(context.work_dir / STOP_FILE_NAME),
        "SCRATCHFLOW_NODES": str(context.nodes),
        "SCRATCHFLOW_PROCESSES_PER_NODE": str(context.processes_per_node),
        "SCRATCHFLOW_BUDGET_EPOCHS": str(context.budget_epochs or ""),
        **({"SCRATCHFLOW_MODEL_DIR": str(context.model)} if context.model else {}),
        # Last, so that nothing of the program's own is shadowed: for `python -m scratchflow.trainer_script`.
        "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(SCRATCHFLOW_DIR / "scripts")])),
    }
    if context.checkpoint_every.steps is not None:
        env["SCRATCHFLOW_SAVE_EVERY_STEPS"] = str(context.checkpoint_every.steps)
    if context.tracking == "wandb":  # a bare wandb.init() in the program logs this piece offline
        env.update(tracking.wandb_environment(context.tracking_dir.parent, context.run_id, context.piece))
    argv = context.params["command"]
    log.info("running %s", argv)
    code, tail = context.run_program(argv, env)
    # A rung's job is done when the program has written the rung's validation metrics.
    expected = output_dir / (VALIDATION_FILE if context.budget_epochs else METRICS_FILE)
    finished = code == 0 and expected.is_file()
    diverged = output_dir / DIVERGED_FILE
    if code == 0 and diverged.is_file():  # scratchflow.program.end_as_diverged
        said = json.loads(diverged.read_text())
        raise Diverged(said.get("step"), said.get("detail", "it said so"))
    if context.stop_requested() and not finished:
        return None  # paused: its newest complete checkpoint is on shared storage
    if code != 0:
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
        said = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "nothing")
        raise CommandFailed(f"the command {argv} {how}, its last line: {said}; its last lines:\n{tail}", code)
    read_metrics(expected)
    validation = output_dir / VALIDATION_FILE
    return Trained(
        output=output_dir,
        metrics={
            "command": argv,
            "exit_code": code,
            "program_git": program_git(argv),
            **({"validation": read_metrics(validation)} if validation.is_file() else {}),
        },
    )


def program_git(argv: list[str]) -> dict[str, Any] | None:
    """The commit of the repository the program's file is in (the script a known interpreter runs or
    scratchflow.trainer_script launches, or the program itself), and whether it had uncommitted
    changes; None for a program on PATH."""
    program = program_file(argv)
    return git_state(program.resolve().parent) if program else None


def predict(context: PredictContext) -> Predicted:
    """The program evaluated what it trained: its metrics.json is the run's."""
    return Predicted(metrics=read_metrics(context.trained / METRICS_FILE))
