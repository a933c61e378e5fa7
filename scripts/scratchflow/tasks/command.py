"""command: the lab's own training program, run inside the lifecycle.

The program is `training.command`, an argv list run without a shell, in the workflow's working
directory. It learns where things are from environment variables (the README's contract table):

    SCRATCHFLOW_DATA_DIR          the verified, extracted data on node-local scratch (a file or folder;
                                  with dataset.splits, a folder holding train, validation, test)
    SCRATCHFLOW_CHECKPOINT_DIR    checkpoints on scratch: write `checkpoint-<step>/`, and the file
                                  COMPLETE into it last. Each complete one is mirrored to shared storage
    SCRATCHFLOW_RESUME_FROM       the newest complete checkpoint, copied in from shared storage ('' if none)
    SCRATCHFLOW_OUTPUT_DIR        synced back whole to results/runs/<run_id>/model/; must hold metrics.json
    SCRATCHFLOW_PARAMS            a JSON file of the run's parameters (the training keys but `command`)
    SCRATCHFLOW_RUN_ID, SCRATCHFLOW_PIECE, SCRATCHFLOW_SAVE_EVERY_STEPS, SCRATCHFLOW_MODEL_DIR (if a model)
    SCRATCHFLOW_STOP_FILE         appears when the job is asked to stop (for code that cannot take signals)
    SCRATCHFLOW_TRACKING_DIR      the run's TensorBoard folder on shared storage, kept across pieces
    WANDB_MODE, WANDB_DIR, WANDB_RUN_ID, ...
                                  with tracking: wandb, W&B's own variables (tracking.wandb_environment):
                                  a bare wandb.init() logs this piece offline beside the TensorBoard folder
    SCRATCHFLOW_NODES, SCRATCHFLOW_PROCESSES_PER_NODE
                                  the train rule's shape, for a program that starts its own processes

On SIGUSR1/SIGTERM the job forwards the signal to the program's process group, waits up to
checkpointing.stop_grace_seconds for it to exit, mirrors its newest complete checkpoint, and records
the piece as paused: the retry resumes.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Any

from scratchflow import tracking
from scratchflow.checkpoints import RunCheckpoints, newest_complete_checkpoint, step_of
from scratchflow.files import read_json
from scratchflow.processes import STOP_FILE_NAME, StopForwarder, run_program
from scratchflow.staging import StagingError
from scratchflow.tasks import PredictContext, Predicted, TrainContext, Trained, TrainingStopped

log = logging.getLogger(__name__)

CHECKPOINT_MARKER = "COMPLETE"
NEEDS_MODEL = False
# The program starts its own processes (the shape is in its environment); it runs once per job.
LAUNCHES_OWN_PROCESSES = True
METRICS = None  # whatever the program writes into metrics.json
WRITES_PREDICTIONS = False
METRICS_FILE = "metrics.json"
MIRROR_POLL_SECONDS = 1.0


class CommandFailed(RuntimeError):
    """The program exited with an error, or left no usable metrics."""


def check_settings(config: dict[str, Any]) -> None:
    program = config["training"]["command"][0]
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


def check_data(dataset: dict[str, Any], sources: dict[str, Path]) -> None:
    """The program reads the data itself; that it exists was checked with the paths."""


def check_model(model_dir: Path) -> None:
    """The program loads the model itself."""


def read_metrics(path: Path) -> dict[str, float]:
    """metrics.json: a JSON object of metric name -> number."""
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
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
    }
    if bad:
        raise CommandFailed(f"{path.name}: not a finite number: {bad!r:.300}")
    return metrics


class CheckpointMirror:
    """Copies every new complete checkpoint the program writes on scratch to shared storage, from a
    thread that looks every second, and once more when the program has ended."""

    def __init__(self, local: Path, run: RunCheckpoints, seeded_step: int | None = None):
        self.local, self.run = local, run
        # The checkpoint seeded from shared storage is there already.
        self.mirrored_step: int | None = seeded_step
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> CheckpointMirror:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._done.set()
        self._thread.join()
        self.mirror_newest()
        if self.error is not None:
            raise self.error

    def _watch(self) -> None:
        while not self._done.wait(MIRROR_POLL_SECONDS):
            try:
                self.mirror_newest()
            except BaseException as error:  # raised in the job's thread on exit
                self.error = error
                return

    def mirror_newest(self) -> None:
        newest = newest_complete_checkpoint(self.local, CHECKPOINT_MARKER)
        if newest is None or (self.mirrored_step is not None and step_of(newest) <= self.mirrored_step):
            return
        try:
            self.run.mirror(newest)
        except StagingError:
            if newest.exists():
                raise
            return  # the program pruned it while it was copied: a newer one is there
        self.mirrored_step = step_of(newest)
        log.info("checkpoint %s saved to %s", newest.name, self.run.folder)


def data_dir(data: dict[str, Path]) -> Path:
    return data["all"] if "all" in data else next(iter(data.values())).parent


def train(context: TrainContext) -> Trained:
    params = {key: value for key, value in context.params.items() if key != "command"}
    checkpoint_dir = context.work_dir / "checkpoints"
    output_dir = context.work_dir / "output"
    checkpoint_dir.mkdir()
    output_dir.mkdir()
    params_file = context.work_dir / "params.json"
    params_file.write_text(json.dumps(params, indent=2, sort_keys=True))
    resume_from = context.checkpoints.seed(checkpoint_dir)
    stop_file = context.work_dir / STOP_FILE_NAME
    env = {
        **os.environ,
        "SCRATCHFLOW_DATA_DIR": str(data_dir(context.data)),
        "SCRATCHFLOW_CHECKPOINT_DIR": str(checkpoint_dir),
        "SCRATCHFLOW_RESUME_FROM": str(resume_from or ""),
        "SCRATCHFLOW_OUTPUT_DIR": str(output_dir),
        "SCRATCHFLOW_PARAMS": str(params_file),
        "SCRATCHFLOW_RUN_ID": context.run_id,
        "SCRATCHFLOW_PIECE": str(context.piece),
        "SCRATCHFLOW_SAVE_EVERY_STEPS": str(context.save_every_steps),
        "SCRATCHFLOW_TRACKING_DIR": str(context.tracking_dir),
        "SCRATCHFLOW_STOP_FILE": str(stop_file),
        "SCRATCHFLOW_NODES": str(context.nodes),
        "SCRATCHFLOW_PROCESSES_PER_NODE": str(context.processes_per_node),
        **({"SCRATCHFLOW_MODEL_DIR": str(context.model)} if context.model else {}),
    }
    if context.tracking == "wandb":  # a bare wandb.init() in the program logs this piece offline
        env.update(tracking.wandb_environment(context.tracking_dir.parent, context.run_id, context.piece))
    argv = context.params["command"]
    log.info("running %s", argv)
    resumed_step = step_of(resume_from) if resume_from else None
    mirror = CheckpointMirror(checkpoint_dir, context.checkpoints, seeded_step=resumed_step)
    stop = StopForwarder(stop_file)
    code, tail = run_program(argv, env, stop, context.stop_grace_seconds, alongside=mirror)
    finished = code == 0 and (output_dir / METRICS_FILE).is_file()
    if stop.received and not finished:
        step = mirror.mirrored_step
        raise TrainingStopped(
            f"stopped on {stop.received} at step {step}: paused; "
            + (
                f"checkpoint-{step} is saved in {context.checkpoints.folder} and the next attempt resumes from it"
                if step is not None
                else "no complete checkpoint was written, so the next attempt starts from the beginning"
            )
        )
    if code != 0:
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
        raise CommandFailed(f"the command {argv} {how}; its last lines:\n{tail}")
    read_metrics(output_dir / METRICS_FILE)
    return Trained(
        output=output_dir,
        metrics={
            "command": argv,
            "exit_code": code,
            "resumed_from_step": resumed_step,
            "global_steps": mirror.mirrored_step,
        },
    )


def predict(context: PredictContext) -> Predicted:
    """The program evaluated what it trained: its metrics.json is the run's."""
    return Predicted(metrics=read_metrics(context.trained / METRICS_FILE))
