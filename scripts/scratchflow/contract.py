"""The task protocol checked by behaviour, on a task's smallest real config: what
tests/test_task_contract.py runs on scratchflow's tasks, and `scripts/check_task.py` on a lab's own.

Each check raises `ContractBroken` saying what the task did instead:
- `check_declarations`: the protocol's names, a valid schema fragment that refuses unknown keys;
- `check_refuses_empty_data`: an empty dataset refused when the workflow starts;
- `check_stops_and_resumes`: under its piece, a real stop signal makes it save, hand the checkpoint on
  and return; the next piece resumes from that checkpoint and trains to the end;
- `check_rung`: a halving search's rung (1 of 2 epochs) and a retry after it that only evaluates;
- `check_leaves_duties_to_its_piece`: nothing in its code does what its piece does.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema

from scratchflow import signals
from scratchflow.checkpoints import CheckpointMirroring, RunCheckpoints
from scratchflow.dataset import DatasetError, data_sources, resolve_location
from scratchflow.piece import Piece, PieceSpec
from scratchflow.tasks import TASK_NAMES, TrainingStopped, load_task, training_schema


class ContractBroken(AssertionError):
    """A task does not keep the task protocol."""


def check_declarations(task: str) -> None:
    module = load_task(task)  # refuses a module that lacks a name, naming it
    missing = [name for name in TASK_NAMES if not hasattr(module, name)]
    if missing or not (isinstance(module.CHECKPOINT_MARKER, str) and module.CHECKPOINT_MARKER):
        raise ContractBroken(f"{task}: lacks {missing or 'a CHECKPOINT_MARKER file name'}")
    if not (module.METRICS is None or (isinstance(module.METRICS, tuple) and module.METRICS)):
        raise ContractBroken(f"{task}: METRICS is None or a tuple of metric names, not {module.METRICS!r}")
    schema = training_schema(task)
    jsonschema.Draft202012Validator.check_schema(schema)
    if schema.get("additionalProperties") is True:
        raise ContractBroken(f"{task}: its schema fragment takes any key: a typo in training: must be refused")


def check_refuses_empty_data(config: dict[str, Any], work: Path) -> None:
    empty = work / "empty-dataset"
    empty.mkdir(parents=True)
    dataset = {**config["dataset"], "path": str(empty)}
    dataset.pop("splits", None)
    try:
        load_task(config["task"]).check_data(dataset, data_sources(dataset))
    except DatasetError:
        return
    raise ContractBroken(f"{config['task']}: check_data accepted an empty dataset")


class QuickMirroring(CheckpointMirroring):
    """Looks for a program's new checkpoints every 10 ms, not every second: a small program may
    finish between two looks."""

    def watching(self, poll_seconds: float = 0.01):
        return super().watching(poll_seconds)


@dataclasses.dataclass(frozen=True)
class StopsAfterFirstCheckpoint(RunCheckpoints):
    """The run's shared checkpoints; the first one mirrored sends this process the stop signal, as
    Slurm's wall-time warning would, at a moment the check knows."""

    stop: bool = True

    def mirroring(self, local_folder: Path, restored_step: int | None = None) -> CheckpointMirroring:
        return QuickMirroring(self, local_folder, restored_step)

    def mirror(self, local_checkpoint: Path) -> Path:
        destination = super().mirror(local_checkpoint)
        if self.stop and len(self.complete()) == 1:
            os.kill(os.getpid(), signals.stop_signal())
        return destination


def piece_spec(config: dict[str, Any], work: Path, piece: int, run: RunCheckpoints) -> PieceSpec:
    work_dir = work / f"piece-{piece}"
    work_dir.mkdir(parents=True)
    return PieceSpec(
        task=config["task"],
        run_id="contract00",
        piece=piece,
        data=data_sources(config["dataset"]),
        dataset=config["dataset"],
        params=config["training"],
        model=resolve_location(config["model"]["source"]) if config.get("model") else None,  # package: too
        work_dir=work_dir,
        checkpoints=run,
        tracking_dir=work / "tensorboard",
        tracking="tensorboard",
        save_every_steps=config["checkpointing"]["every_steps"],
        stop_grace_seconds=30,
        threads=1,
    )


def check_stops_and_resumes(config: dict[str, Any], work: Path) -> None:
    """With USR2 as the stop signal (not the default: the piece listens for the one configured)."""
    task, marker = config["task"], load_task(config["task"]).CHECKPOINT_MARKER
    signals.use_stop_signal("USR2")
    try:
        first = StopsAfterFirstCheckpoint(work / "shared", marker)
        try:
            Piece(piece_spec(config, work, 1, first)).train()
        except TrainingStopped as stopped:
            if not re.match(r"stopped on SIGUSR2 at step \d+ and paused; checkpoint-", str(stopped)):
                raise ContractBroken(f"{task}: paused, but not at a saved checkpoint: {stopped}") from None
        else:
            raise ContractBroken(f"{task}: trained to its end through a stop signal (saved one checkpoint first)")
        stopped_at = first.newest_step()
        if signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN:
            raise ContractBroken(f"{task}: left the stop signal ignored")
        resumed = StopsAfterFirstCheckpoint(work / "shared", marker, stop=False)
        trained = Piece(piece_spec(config, work, 2, resumed)).train()
    finally:
        signals.use_stop_signal(signals.DEFAULT_STOP_SIGNAL)
    figures = trained.metrics
    if figures.get("resumed_from_step") != stopped_at or not figures.get("global_steps", 0) > stopped_at:
        raise ContractBroken(
            f"{task}: the next piece did not resume from checkpoint-{stopped_at} and train on: "
            f"resumed_from_step {figures.get('resumed_from_step')}, global_steps {figures.get('global_steps')}"
        )
    if not (trained.output.is_dir() and any(trained.output.iterdir())):
        raise ContractBroken(f"{task}: what it trained ({trained.output}) is not a folder with something in it")


def check_rung(config: dict[str, Any], work: Path) -> None:
    """1 of the run's 2 epochs, then a checkpoint and the validation metrics there; a retry after that
    checkpoint trains no further and reports the same; the run's last job resumes from the rung."""
    task = config["task"]
    config = {**config, "training": {**config["training"], "epochs": 2}}
    run = RunCheckpoints(work / "shared-rung", load_task(task).CHECKPOINT_MARKER)
    rung = Piece(dataclasses.replace(piece_spec(config, work / "rung", 1, run), budget_epochs=1)).train()
    retried = Piece(dataclasses.replace(piece_spec(config, work / "rung", 2, run), budget_epochs=1)).train()
    if not rung.metrics.get("validation") or retried.metrics.get("validation") != rung.metrics["validation"]:
        raise ContractBroken(f"{task}: a rung's validation metrics, and its retry's the same: {rung.metrics}")
    if not retried.metrics["global_steps"] == rung.metrics["global_steps"] == run.newest_step():
        raise ContractBroken(f"{task}: a retried rung trained on, or its checkpoint is not the rung's end")
    last = Piece(piece_spec(config, work / "rung", 3, run)).train()
    if last.metrics["resumed_from_step"] != rung.metrics["global_steps"] or (
        last.metrics["global_steps"] != 2 * rung.metrics["global_steps"]
    ):
        raise ContractBroken(f"{task}: the run's last job did not resume from the rung and train to the end")


# What a task leaves to its piece (scratchflow.piece); none of it may be in the task's code.
PIECE_DUTIES = {
    "listening for signals": r"signal\.signal\(|scratchflow\.signals import (?!STOP_FILE_NAME$)|listening\(",
    "running programs itself": r"scratchflow\.processes|subprocess",
    "barriers or collectives": r"torch\.distributed",
    "mirroring to shared storage": r"RunCheckpoints|\.mirror|restore_newest_to",
    "deciding that it stopped": r"TrainingStopped",
}


def check_leaves_duties_to_its_piece(module_file: Path) -> None:
    source = module_file.read_text()
    found = [duty for duty, pattern in PIECE_DUTIES.items() if re.search(pattern, source, re.MULTILINE)]
    if found:
        raise ContractBroken(f"{module_file} does what its piece does: {', '.join(found)}")


def check_all(config: dict[str, Any]) -> Iterator[tuple[str, ContractBroken | None]]:
    """Every check of `config`'s task on `config` (validated, its defaults filled in), each in a
    folder of its own: (what was checked, how it broke or None)."""
    task = config["task"]
    checks: dict[str, Callable[[Path], None]] = {
        "declarations": lambda work: check_declarations(task),
        "an empty dataset refused": lambda work: check_refuses_empty_data(config, work),
        "stopped by the stop signal, then resumed": lambda work: check_stops_and_resumes(config, work),
        "a halving search's rung": lambda work: check_rung(config, work),
        "its piece's duties left to it": lambda work: check_leaves_duties_to_its_piece(Path(load_task(task).__file__)),
    }
    for name, check in checks.items():
        with tempfile.TemporaryDirectory(prefix="check-task-") as work:
            try:
                check(Path(work))
            except ContractBroken as broken:
                yield name, broken
            else:
                yield name, None
