"""Every task in scripts/scratchflow/tasks/ through the checks of the `Task` protocol
(scratchflow.contract, which a lab runs on its own tasks with scripts/check_task.py): the names it
must define, its schema fragment (valid, defaults filled in), an empty dataset refused at start-up,
train -> stop -> resume on tiny data under its piece with a real stop signal, a rung, and nothing
of its piece's duties in its code. A task module that lacks a name of the protocol is refused naming it."""

from __future__ import annotations

import shutil
import sys

import pytest
import yaml
from conftest import REPO, command_config, image_config, validated, workflow_config
from scratchflow import contract
from scratchflow.config import ConfigError, configured_task
from scratchflow.tasks import UnknownTask, available_tasks, load_task, training_schema

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
    contract.check_declarations(task)


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
    contract.check_refuses_empty_data(tiny_config, tmp_path)


@pytest.mark.parametrize("tiny_config", TASKS, indirect=True)
def test_a_task_stops_on_the_stop_signal_and_the_next_piece_resumes_from_its_checkpoint(tiny_config, tmp_path):
    contract.check_stops_and_resumes(tiny_config, tmp_path)


@pytest.mark.parametrize("tiny_config", TASKS, indirect=True)
def test_a_task_trains_a_rungs_epochs_and_a_retry_after_the_rung_only_evaluates(tiny_config, tmp_path):
    contract.check_rung(tiny_config, tmp_path)


@pytest.mark.parametrize(
    "module", [*(f"tasks/{task.replace('-', '_')}.py" for task in TASKS), "hf_trainer.py", "classification.py"]
)
def test_a_task_leaves_signals_mirroring_barriers_and_the_outcome_to_its_piece(module):
    contract.check_leaves_duties_to_its_piece(REPO / "scripts" / "scratchflow" / module)


def test_the_checks_find_a_task_that_does_its_pieces_duties(tmp_path):
    """The check itself can fail: hf_trainer as it was, listening and mirroring itself."""
    old = tmp_path / "hf_trainer.py"
    old.write_text("from scratchflow.tasks import TrainingStopped\nimport torch\ntorch.distributed.barrier()\n")
    with pytest.raises(contract.ContractBroken, match="barriers or collectives, deciding that it stopped"):
        contract.check_leaves_duties_to_its_piece(old)


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


def test_the_contract_finds_a_model_shipped_in_a_package_as_the_workflow_does(tmp_path):
    """`model.source: package:…` (the demo's, which a lab copies first): the checks train the
    package's model, not a hub id of that name (before: transformers refused the name)."""
    from scratchflow.checkpoints import RunCheckpoints

    config = validated(yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    spec = contract.piece_spec(config, tmp_path, 1, RunCheckpoints(tmp_path / "shared", "marker"))
    assert spec.model.is_dir() and (spec.model / "config.json").is_file(), spec.model
