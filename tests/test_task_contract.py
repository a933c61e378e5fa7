"""Every task in scripts/scratchflow/tasks/ through the same checks of the `Task` protocol: the names it
must define, its schema fragment (valid, defaults filled in), an empty dataset refused at start-up,
and train -> stop -> resume on tiny data under its piece, called directly (no workflow, no Slurm),
and nothing of its piece's duties in its code. A task module that lacks a name of the protocol is
refused naming it."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import sys
from pathlib import Path

import jsonschema
import pytest
from conftest import REPO, command_config, image_config, validated, workflow_config
from scratchflow import signals
from scratchflow.checkpoints import CheckpointMirroring, RunCheckpoints
from scratchflow.config import ConfigError, configured_task
from scratchflow.dataset import DatasetError, data_sources
from scratchflow.piece import Piece, PieceSpec
from scratchflow.tasks import (
    TASK_NAMES,
    TrainingStopped,
    UnknownTask,
    available_tasks,
    load_task,
    training_schema,
)

TASKS = available_tasks()


@pytest.fixture
def tiny_config(request, tmp_path):
    """The task's smallest real config: tiny data and model, a checkpoint every 2 steps."""
    task = request.param
    if task == "text-classification":
        config = workflow_config(request.getfixturevalue("bbc_subset"), request.getfixturevalue("tiny_model"), None)
        config["training"].update(epochs=1)
    elif task == "image-classification":
        config = image_config(
            request.getfixturevalue("animal_images"), request.getfixturevalue("tiny_resnet"), None, epochs=1
        )
    else:
        # About 900 steps, a checkpoint every 20: long enough to stop midway. This interpreter
        # (with torch), as the jobs would find it first on PATH.
        config = command_config(request.getfixturevalue("bbc_subset"), None)
        config["training"]["command"][0] = sys.executable
    if task != "command":
        config["checkpointing"]["every_steps"] = 2
    return validated(config)


def test_the_contract_test_covers_every_task():
    assert set(TASKS) == {"command", "image-classification", "text-classification"}


@pytest.mark.parametrize("task", TASKS)
def test_a_task_defines_every_name_of_the_protocol_and_a_valid_schema_fragment(task):
    module = load_task(task)
    for name in TASK_NAMES:
        assert hasattr(module, name), name
    assert isinstance(module.CHECKPOINT_MARKER, str) and module.CHECKPOINT_MARKER
    assert module.METRICS is None or (isinstance(module.METRICS, tuple) and module.METRICS)
    schema = training_schema(task)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema.get("additionalProperties") is not True, "a typo in training: must be refused"


@pytest.mark.parametrize("tiny_config", TASKS, indirect=True)
def test_the_defaults_of_a_tasks_schema_fill_training(tiny_config):
    """A config that sets only what the task requires gets every default of its schema fragment."""
    schema = training_schema(tiny_config["task"])
    defaults = {key: item["default"] for key, item in schema["properties"].items() if "default" in item}
    required = {key: tiny_config["training"][key] for key in schema.get("required", [])}
    # A grid of one point over a key training: already has (a command task's grid keys must be its).
    grid = {key: [value] for key, value in list(required.items())[:1]} or {"seed": [0]}
    config = validated({**tiny_config, "training": required, "grid": grid})
    assert {key: config["training"][key] for key in defaults} == defaults


@pytest.mark.parametrize("tiny_config", TASKS, indirect=True)
def test_a_task_refuses_an_empty_dataset_at_start_up(tiny_config, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    dataset = {**tiny_config["dataset"], "path": str(empty)}
    with pytest.raises(DatasetError):
        load_task(tiny_config["task"]).check_data(dataset, data_sources(dataset))


class QuickMirroring(CheckpointMirroring):
    """Looks for a program's new checkpoints every 10 ms instead of every second: the command task's
    program here runs for a few seconds, and on a loaded machine it once finished between two looks."""

    def watching(self, poll_seconds: float = 0.01):
        return super().watching(poll_seconds)


@dataclasses.dataclass(frozen=True)
class StopsAfterFirstCheckpoint(RunCheckpoints):
    """The run's shared checkpoints; the first one mirrored sends this job the stop signal, as
    Slurm's wall-time warning would, at a moment the test knows."""

    stop: bool = True

    def mirroring(self, local_folder: Path, restored_step: int | None = None) -> CheckpointMirroring:
        return QuickMirroring(self, local_folder, restored_step)

    def mirror(self, local_checkpoint: Path) -> Path:
        destination = super().mirror(local_checkpoint)
        if self.stop and len(self.complete()) == 1:
            os.kill(os.getpid(), signals.stop_signal())
        return destination


def piece_spec(config: dict, tmp_path: Path, piece: int, run: RunCheckpoints) -> PieceSpec:
    work_dir = tmp_path / f"piece-{piece}"
    work_dir.mkdir()
    return PieceSpec(
        task=config["task"],
        run_id="contract00",
        piece=piece,
        data=data_sources(config["dataset"]),
        dataset=config["dataset"],
        params=config["training"],
        model=Path(config["model"]["source"]) if config.get("model") else None,
        work_dir=work_dir,
        checkpoints=run,
        tracking_dir=tmp_path / "tensorboard",
        tracking="tensorboard",
        save_every_steps=config["checkpointing"]["every_steps"],
        stop_grace_seconds=30,
        threads=1,
    )


@pytest.mark.parametrize("tiny_config", TASKS, indirect=True)
def test_a_task_stops_on_the_stop_signal_and_the_next_piece_resumes_from_its_checkpoint(tiny_config, tmp_path):
    """The task under its piece, as a job runs it: the stop signal (a real one) makes the task save,
    hand its checkpoint on and return; the piece says it paused; the next piece resumes from it."""
    task = load_task(tiny_config["task"])
    shared = tmp_path / "shared"
    signals.use_stop_signal("USR2")  # not the default: the piece listens for the one configured
    try:
        first = StopsAfterFirstCheckpoint(shared, task.CHECKPOINT_MARKER)
        with pytest.raises(TrainingStopped, match=r"stopped on SIGUSR2 at step \d+ and paused; checkpoint-"):
            Piece(piece_spec(tiny_config, tmp_path, 1, first)).train()
        stopped_at = first.newest_step()
        assert stopped_at is not None, "the stop saved a checkpoint to shared storage"
        assert signal.getsignal(signal.SIGUSR2) is not signal.SIG_IGN
        resumed = StopsAfterFirstCheckpoint(shared, task.CHECKPOINT_MARKER, stop=False)
        trained = Piece(piece_spec(tiny_config, tmp_path, 2, resumed)).train()
    finally:
        signals.use_stop_signal(signals.DEFAULT_STOP_SIGNAL)
    assert trained.metrics["resumed_from_step"] == stopped_at
    assert trained.metrics["global_steps"] > stopped_at
    assert trained.output.is_dir() and any(trained.output.iterdir())


@pytest.mark.parametrize("tiny_config", TASKS, indirect=True)
def test_a_task_trains_a_rungs_epochs_and_a_retry_after_the_rung_only_evaluates(tiny_config, tmp_path):
    """A halving search's rung (TrainContext.budget_epochs): 1 of the run's 2 epochs, then a checkpoint
    and the validation metrics there; a job retried after that checkpoint (killed before its record
    was written) trains no further and reports the same; the run's last job resumes from the rung."""
    task = load_task(tiny_config["task"])
    tiny_config["training"]["epochs"] = 2
    run = RunCheckpoints(tmp_path / "shared", task.CHECKPOINT_MARKER)
    rung = Piece(dataclasses.replace(piece_spec(tiny_config, tmp_path, 1, run), budget_epochs=1)).train()
    retried = Piece(dataclasses.replace(piece_spec(tiny_config, tmp_path, 2, run), budget_epochs=1)).train()
    assert rung.metrics["validation"] and retried.metrics["validation"] == rung.metrics["validation"]
    assert retried.metrics["global_steps"] == rung.metrics["global_steps"] == run.newest_step()
    last = Piece(piece_spec(tiny_config, tmp_path, 3, run)).train()
    assert last.metrics["resumed_from_step"] == rung.metrics["global_steps"]
    assert last.metrics["global_steps"] == 2 * rung.metrics["global_steps"]


# What a task leaves to its piece (scratchflow.piece): it must not do it itself.
PIECE_DUTIES = {
    "listening for signals": r"signal\.signal\(|scratchflow\.signals import (?!STOP_FILE_NAME$)|listening\(",
    "running programs itself": r"scratchflow\.processes|subprocess",
    "barriers or collectives": r"torch\.distributed",
    "mirroring to shared storage": r"RunCheckpoints|\.mirror|restore_newest_to",
    "deciding that it stopped": r"TrainingStopped",
}


@pytest.mark.parametrize(
    "module", [*(f"tasks/{task.replace('-', '_')}.py" for task in TASKS), "hf_trainer.py", "classification.py"]
)
def test_a_task_leaves_signals_mirroring_barriers_and_the_outcome_to_its_piece(module):
    source = (REPO / "scripts" / "scratchflow" / module).read_text()
    found = {duty: pattern for duty, pattern in PIECE_DUTIES.items() if re.search(pattern, source, re.MULTILINE)}
    assert not found, f"{module} does what its piece does: {', '.join(found)}"


def test_a_task_copied_from_another_that_forgot_a_name_is_refused_naming_it(tmp_path, monkeypatch):
    """A lab copies image_classification.py, renames predict and forgets the schema fragment."""
    import scratchflow.tasks

    monkeypatch.delitem(sys.modules, "scratchflow.tasks.lab_images", raising=False)  # removed again after

    source = (REPO / "scripts" / "scratchflow" / "tasks" / "image_classification.py").read_text()
    (tmp_path / "lab_images.py").write_text(source.replace("def predict(", "def predict_images("))
    monkeypatch.setattr(scratchflow.tasks, "__path__", [*scratchflow.tasks.__path__, str(tmp_path)])
    with pytest.raises(
        UnknownTask, match=r"'lab-images' .* lacks predict, its schema fragment lab_images\.schema\.yaml"
    ):
        load_task("lab-images")
    shutil.copy(
        REPO / "scripts" / "scratchflow" / "tasks" / "image_classification.schema.yaml",
        tmp_path / "lab_images.schema.yaml",
    )
    config = {"task": "lab-images", "dataset": {}, "training": {}, "grid": {}, "aggregate": {"metric": None}}
    with pytest.raises(ConfigError, match=r"lacks predict \(what a task defines: the Task protocol"):
        configured_task(config)
