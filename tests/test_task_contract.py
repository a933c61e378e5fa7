"""Every task in scripts/scratchflow/tasks/ through the checks of the `Task` protocol
(scratchflow.contract, which a lab runs on its own tasks with scripts/check_task.py): the names it
must define, its schema fragment (valid, defaults filled in), an empty dataset refused at start-up,
train -> stop -> resume on tiny data under its piece with a real stop signal, predict on what it
trained, a rung, and nothing of its piece's duties in its code (read as code: imports and calls,
not words). A task module that
lacks a name of the protocol is refused naming it. A lab's own plain-PyTorch task that reports no
step counts passes check_task.py; what a lab's task raises in a check is that check's FAILED line,
with where it raised it, and the other checks run; a contract config that cannot run is one line."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, command_config, drawn_figure, image_config, validated, workflow_config, workflow_env
from scratchflow import contract
from scratchflow.config import ConfigError, configured_task
from scratchflow.lease import RunFolder
from scratchflow.tasks import (
    Predicted,
    UnknownTask,
    WrongPredicted,
    available_tasks,
    load_task,
    predicted_problem,
    raised_at,
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
def test_a_task_predicts_what_it_trained_as_the_workflow_writes_it(tiny_config, tmp_path):
    contract.check_predicts(tiny_config, tmp_path)


@pytest.mark.parametrize("tiny_config", TASKS, indirect=True)
def test_a_task_trains_a_rungs_epochs_and_a_retry_after_the_rung_only_evaluates(tiny_config, tmp_path):
    contract.check_rung(tiny_config, tmp_path)


@pytest.mark.parametrize(
    "module", [*(f"tasks/{task.replace('-', '_')}.py" for task in TASKS), "hf_trainer.py", "classification.py"]
)
def test_a_task_leaves_signals_mirroring_barriers_and_the_outcome_to_its_piece(module):
    contract.check_leaves_duties_to_its_piece(REPO / "scripts" / "scratchflow" / module)


# A task's code that does what its piece does: (its source, the duty and the line the check names).
DOES_ITS_PIECES_DUTY = {
    "a signal handler": (
        "import signal\nsignal.signal(signal.SIGUSR1, print)\n",
        "listening for signals (line 2: signal.signal)",
    ),
    "a timer signal, imported by name": (
        "from signal import ITIMER_REAL, setitimer\nsetitimer(ITIMER_REAL, 5)\n",
        "listening for signals (line 2: signal.setitimer)",
    ),
    "scratchflow's listening": (
        "from scratchflow import signals\nwith signals.listening(print):\n    pass\n",
        "listening for signals (line 2: scratchflow.signals.listening)",
    ),
    "a barrier": (
        "import torch\ntorch.distributed.barrier()\n",
        "barriers or collectives (line 2: torch.distributed.barrier)",
    ),
    "a collective, under another name": (
        "import torch.distributed as dist\ndef train(context):\n    dist.all_reduce(context.params['x'])\n",
        "barriers or collectives (line 3: torch.distributed.all_reduce)",
    ),
    "a process group": (
        "from torch.distributed import init_process_group\ninit_process_group('gloo')\n",
        "barriers or collectives (line 2: torch.distributed.init_process_group)",
    ),
    "scratchflow's mirroring": (
        "from scratchflow.checkpoints import CheckpointStore\n",
        "mirroring to shared storage (line 1: scratchflow.checkpoints.CheckpointStore)",
    ),
    "a mirror of its own": (
        "def train(context, run):\n    run.mirror(context.checkpoint_dir)\n",
        "mirroring to shared storage (line 2: run.mirror)",
    ),
    "raising TrainingStopped": (
        "import scratchflow.tasks\nraise scratchflow.tasks.TrainingStopped('asked')\n",
        "deciding that it stopped (line 2: scratchflow.tasks.TrainingStopped)",
    ),
    "importing TrainingStopped": (
        "from scratchflow.tasks import TrainingStopped as Stopped\n",
        "deciding that it stopped (line 1: scratchflow.tasks.TrainingStopped)",
    ),
    "scratchflow's processes": (
        "from scratchflow.processes import run_program\n",
        "running programs itself (line 1: scratchflow.processes.run_program)",
    ),
}
# What a task may do: the words in its text, other programs, asking where it is among the processes.
LEAVES_ITS_PIECES_DUTIES = {
    "subprocess for something else": "import subprocess\nsubprocess.run(['nvidia-smi'])\n",
    "its rank and the world's size": (
        "import torch.distributed as dist\n"
        "rank = dist.get_rank() if dist.is_initialized() else 0\nsize = dist.get_world_size()\n"
    ),
    "signals named, not handled": (
        '"""Never calls signal.signal( or raises TrainingStopped; CheckpointStore mirror for it."""\n'
        "import signal\nname = signal.Signals(10).name\nprint(signal.getsignal(signal.SIGUSR1))\n"
    ),
    "the stop file's name": "from scratchflow.signals import STOP_FILE_NAME\n",
    "reading its own checkpoints": "from scratchflow.checkpoints import newest_complete_checkpoint, step_of\n",
    "a mirror image, not a copy": "import torch\nflipped = torch.flip(torch.zeros(2, 2), [1])\n",
}


@pytest.mark.parametrize("case", DOES_ITS_PIECES_DUTY)
def test_the_duties_check_refuses_a_task_that_does_what_its_piece_does_naming_the_line(case, tmp_path):
    source, found = DOES_ITS_PIECES_DUTY[case]
    module = tmp_path / "task.py"
    module.write_text(source)
    with pytest.raises(contract.ContractBroken) as broken:
        contract.check_leaves_duties_to_its_piece(module)
    assert str(broken.value) == f"{module} does what its piece does: {found}"


@pytest.mark.parametrize("case", LEAVES_ITS_PIECES_DUTIES)
def test_the_duties_check_reads_code_not_words(case, tmp_path):
    module = tmp_path / "task.py"
    module.write_text(LEAVES_ITS_PIECES_DUTIES[case])
    contract.check_leaves_duties_to_its_piece(module)


def test_the_duties_check_names_every_duty_a_task_does(tmp_path):
    module = tmp_path / "task.py"
    module.write_text("from scratchflow.tasks import TrainingStopped\nimport torch\ntorch.distributed.barrier()\n")
    with pytest.raises(contract.ContractBroken, match=r"barriers or collectives \(line 3: .*\), deciding that it"):
        contract.check_leaves_duties_to_its_piece(module)


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


def test_a_labs_task_written_for_0_2_is_refused_at_start_up_naming_the_line_and_the_fix(tmp_path, monkeypatch):
    """It saved every `context.save_every_steps` steps, which 0.3 replaced with checkpoints by time:
    refused when the workflow starts, in one line, instead of failing its first train job."""
    lab = shutil.copytree(REPO / "tests" / "plain_pytorch_lab" / "ourlab", tmp_path / "oldlab")
    task = lab / "mlp.py"
    source = task.read_text().replace("context.checkpoint_due(step)", "step % context.save_every_steps == 0")
    task.write_text(source)
    line = source[: source.index("save_every_steps")].count("\n") + 1
    monkeypatch.syspath_prepend(str(tmp_path))
    config = {"task": "oldlab.mlp", "dataset": {}, "training": {}, "grid": {}, "aggregate": {"metric": None}}
    with pytest.raises(ConfigError) as refused:
        configured_task(config)
    assert str(refused.value) == (
        f"config key task: 'oldlab.mlp' ({task}:{line}) uses context.save_every_steps, gone since scratchflow 0.3: "
        "save a checkpoint at a step's end when context.checkpoint_due(step) says so "
        '(docs/tasks.md, "What `train` does, and returns")'
    )


def test_the_contract_finds_a_model_shipped_in_a_package_as_the_workflow_does(tmp_path):
    """`model.source: package:…` (the demo's, which a lab copies first): the checks train the
    package's model, not a hub id of that name (before: transformers refused the name)."""
    from scratchflow.checkpoints import CheckpointStore

    config = validated(yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    spec = contract.piece_spec(config, tmp_path, 1, CheckpointStore(RunFolder(tmp_path / "shared"), "marker"))
    assert spec.model.is_dir() and (spec.model / "config.json").is_file(), spec.model


# A lab's folder with a plain-PyTorch task of its own (ourlab.mlp: an MLP on a CSV of numbers, no
# Hugging Face, no step counts reported), written from docs/tasks.md alone, and its contract config.
PLAIN_PYTORCH_LAB = REPO / "tests" / "plain_pytorch_lab"
CHECKS = (
    "declarations",
    "an empty dataset refused",
    "stopped by the stop signal, then resumed",
    "predicted what it trained",
    "a halving search's rung",
    "its piece's duties left to it",
    "resumed to the uninterrupted run's results",
)


def check_task(lab: Path, *configs: str) -> subprocess.CompletedProcess:
    """scripts/check_task.py run in the lab's folder, as the lab's `make test` runs it."""
    return subprocess.run(
        [sys.executable, REPO / "scripts" / "check_task.py", *configs],
        cwd=lab,
        capture_output=True,
        text=True,
        env=workflow_env(),
    )


def test_a_plain_pytorch_task_that_reports_no_step_counts_passes_every_check(tmp_path):
    lab = shutil.copytree(PLAIN_PYTORCH_LAB, tmp_path / "ourlab-pipeline")
    checked = check_task(lab, "contract/mlp.yaml")
    assert checked.returncode == 0, checked.stdout + checked.stderr[-3000:]
    assert checked.stdout.splitlines() == [f"contract/mlp.yaml: ourlab.mlp: {check}: ok" for check in CHECKS]


def lab_task(tmp_path: Path, monkeypatch, *edits: tuple[str, str]) -> tuple[dict, Path]:
    """The plain-PyTorch lab task with `edits` (text, its replacement) made to its code, as a module
    of its own, importable here; its contract config, validated, and the module's file."""
    package = re.sub(r"\W", "_", f"lab_{tmp_path.name}")
    (tmp_path / package).mkdir()
    source = (PLAIN_PYTORCH_LAB / "ourlab" / "mlp.py").read_text()
    for text, replacement in edits:
        assert text in source, text
        source = source.replace(text, replacement)
    module = tmp_path / package / "mlp.py"
    module.write_text(source)
    shutil.copy(PLAIN_PYTORCH_LAB / "ourlab" / "mlp.schema.yaml", tmp_path / package)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = yaml.safe_load((PLAIN_PYTORCH_LAB / "contract" / "mlp.yaml").read_text())
    config["task"] = f"{package}.mlp"
    config["dataset"]["path"] = str(PLAIN_PYTORCH_LAB / "data" / "numbers.csv")
    return validated(config), module


def line_of(module: Path, text: str) -> int:
    return next(number for number, line in enumerate(module.read_text().splitlines(), 1) if text in line)


def test_what_a_task_raises_in_a_check_is_that_checks_failure_where_it_raised_it_and_the_next_check_runs(
    tmp_path, monkeypatch
):
    """A lab's bug is reported, never a crash of the checks: the train that raises fails the three
    checks that train, naming the exception, its message and the task's line; the others pass."""
    raising = "params['global_steps']"
    config, module = lab_task(tmp_path, monkeypatch, ("    step = 0\n", f"    step = {raising}\n"))
    results = dict(contract.check_all(config))
    assert list(results) == list(CHECKS)
    where = f"(raised at {module}:{line_of(module, raising)} (in train))"
    for check in ("stopped by the stop signal, then resumed", "predicted what it trained", "a halving search's rung"):
        assert str(results[check]) == f"KeyError: 'global_steps' {where}"
    assert [check for check, failure in results.items() if failure is None] == [CHECKS[0], CHECKS[1], CHECKS[5]]


def test_an_error_raised_inside_a_library_is_placed_at_the_tasks_line_that_called_it(tmp_path, monkeypatch):
    """The innermost place in the task's own module, not torch's, nor the piece's."""
    config, module = lab_task(
        tmp_path, monkeypatch, ("    model = mlp(features.shape[1],", "    model = mlp(features.shape[0],")
    )
    results = dict(contract.check_all(config))
    failure = str(results["stopped by the stop signal, then resumed"])
    assert failure.startswith("RuntimeError: mat1 and mat2 shapes cannot be multiplied"), failure
    assert failure.endswith(f"(raised at {module}:{line_of(module, 'model(features[rows])')} (in train))")


def test_an_error_raised_outside_the_tasks_module_is_placed_where_it_was_raised():
    """Where the traceback never passes through the task's module: its innermost place."""
    with pytest.raises(ValueError) as raised:
        json.loads("{")
    where = raised_at(raised.value, PLAIN_PYTORCH_LAB / "ourlab" / "mlp.py")
    assert where.startswith(f"{json.decoder.__file__}:") and where.endswith("(in raw_decode)"), where


def test_check_data_that_refuses_an_empty_dataset_with_another_exception_is_told_to_raise_dataset_error(
    tmp_path, monkeypatch
):
    raising = '        raise DatasetError(f"{path}: not a CSV file of numbers (dataset.path)")'
    config, module = lab_task(tmp_path, monkeypatch, (raising, raising.replace("DatasetError", "ValueError")))
    with pytest.raises(contract.ContractBroken) as broken:
        contract.check_refuses_empty_data(config, tmp_path / "work")
    assert str(broken.value).startswith(
        f"{config['task']}: check_data must refuse an empty dataset with scratchflow.dataset.DatasetError"
    )
    assert f"it raised ValueError: {tmp_path}/work/empty-dataset: not a CSV file" in str(broken.value)
    assert str(broken.value).endswith(f"(raised at {module}:{line_of(module, 'not a CSV file')} (in read_table))")


def test_check_data_that_accepts_an_empty_dataset_fails_the_check(tmp_path, monkeypatch):
    config, _ = lab_task(
        tmp_path,
        monkeypatch,
        ("    found = splits(sources, dataset)\n", "    return\n    found = splits(sources, dataset)\n"),
    )
    with pytest.raises(contract.ContractBroken, match="check_data accepted an empty dataset"):
        contract.check_refuses_empty_data(config, tmp_path / "work")


def test_a_task_that_hands_its_piece_no_checkpoint_is_told_how(tmp_path, monkeypatch):
    config, _ = lab_task(tmp_path, monkeypatch, ("    context.checkpoint_saved(folder)\n", ""))
    with pytest.raises(contract.ContractBroken, match=r"without a complete checkpoint handed to its piece: save"):
        contract.check_stops_and_resumes(config, tmp_path / "work")


def test_a_progress_report_make_status_could_not_read_fails_naming_what_it_lacks(tmp_path, monkeypatch):
    config, _ = lab_task(
        tmp_path,
        monkeypatch,
        ("context.report_progress(step, end, loss.item())", "context.report_progress(step, end, str(loss.item()))"),
    )
    with pytest.raises(contract.ContractBroken, match=r"report_progress\(.*\): not a number: loss"):
        contract.check_stops_and_resumes(config, tmp_path / "work")


def test_a_rung_without_validation_metrics_fails_the_rung_check_not_the_checks(tmp_path, monkeypatch):
    config, _ = lab_task(
        tmp_path, monkeypatch, ('metrics={"validation": validation})', 'metrics={"accuracy": validation})')
    )
    with pytest.raises(contract.ContractBroken, match=r"a rung returns Trained\(metrics=\{'validation': \{...\}\}\)"):
        contract.check_rung(config, tmp_path / "work")


PREDICTING = "    return Predicted(metrics=metrics, predictions=predictions)\n"


def test_predictions_that_are_not_a_dataframe_fail_the_predict_check_naming_it(tmp_path, monkeypatch):
    """The lab's report: predictions as a list of dicts passed every check, then crashed the workflow's
    predict jobs inside scratchflow (AttributeError: 'list' object has no attribute 'to_csv')."""
    config, _ = lab_task(
        tmp_path,
        monkeypatch,
        (PREDICTING, PREDICTING.replace("predictions=predictions", "predictions=predictions.to_dict('records')")),
    )
    results = dict(contract.check_all(config))
    assert str(results["predicted what it trained"]) == (
        f"task {config['task']}: predict returned predictions that are a list, not a pandas DataFrame "
        "(WRITES_PREDICTIONS is True: they are written to predictions.csv)"
    )
    assert [check for check, failure in results.items() if failure is not None] == ["predicted what it trained"]


def test_a_predict_that_raises_fails_the_predict_check_with_its_line(tmp_path, monkeypatch):
    config, module = lab_task(tmp_path, monkeypatch, (PREDICTING, "    1 / 0\n" + PREDICTING))
    results = dict(contract.check_all(config))
    where = f"{module}:{line_of(module, '1 / 0')} (in predict)"
    assert str(results["predicted what it trained"]) == f"ZeroDivisionError: division by zero (raised at {where})"


@pytest.mark.parametrize(
    "returned, problem",
    [
        ("metrics", "a dict, not a Predicted(metrics, predictions) (from scratchflow.tasks import Predicted)"),
        (
            "Predicted(metrics={'accuracy': 1.0}, predictions=predictions)",
            "metrics without loss as a number (METRICS names accuracy, loss): it reported accuracy",
        ),
        (
            "Predicted(metrics={**metrics, 'loss': torch.tensor(0.5)}, predictions=predictions)",
            "metrics that are not name -> number (or nested detail, a dict or list): {'loss': tensor(0.5000)}",
        ),
        ("Predicted(metrics=metrics, predictions=predictions[:0])", "an empty predictions DataFrame (no rows"),
        ("Predicted(metrics=metrics)", "predictions that are None, not a pandas DataFrame"),
    ],
)
def test_what_predict_returns_is_checked_as_the_workflow_writes_it(returned, problem, tmp_path, monkeypatch):
    config, _ = lab_task(tmp_path, monkeypatch, (PREDICTING, f"    return {returned}\n"))
    with pytest.raises(contract.ContractBroken) as broken:
        contract.check_predicts(config, tmp_path / "work")
    assert str(broken.value).startswith(f"task {config['task']}: predict returned {problem}"), broken.value


def test_predictions_from_a_task_that_writes_none_are_refused(tmp_path, monkeypatch):
    config, _ = lab_task(tmp_path, monkeypatch, ("WRITES_PREDICTIONS = True", "WRITES_PREDICTIONS = False"))
    with pytest.raises(
        contract.ContractBroken, match=r"predictions \(a pandas\.DataFrame\) though WRITES_PREDICTIONS is False"
    ):
        contract.check_predicts(config, tmp_path / "work")


def test_a_predict_job_refuses_what_a_task_returned_wrongly_naming_the_task_and_what_it_returned(tmp_path, monkeypatch):
    """The workflow's predict job, on the lab's report's task (predictions a list): one line naming
    the task, not an AttributeError inside scratchflow; nothing written."""
    from scratchflow.jobs import predict_job

    config, _ = lab_task(
        tmp_path, monkeypatch, (PREDICTING, PREDICTING.replace("predictions=predictions", "predictions=[{}]"))
    )
    job = predict_job_of(config, tmp_path)
    with pytest.raises(WrongPredicted) as refused:
        predict_job(job)
    assert str(refused.value) == (
        f"task {config['task']}: predict returned predictions that are a list, not a pandas DataFrame "
        "(WRITES_PREDICTIONS is True: they are written to predictions.csv)"
    )
    assert not (tmp_path / "results").exists()


def predict_job_of(config: dict, tmp_path: Path):
    """The workflow's predict job for a run of `config` trained here (one piece), its outputs under
    tmp_path/results."""
    from scratchflow.checkpoints import CheckpointStore
    from scratchflow.jobs import PredictJob
    from scratchflow.staging import archive_dataset

    run = CheckpointStore(RunFolder(tmp_path / "shared"), "COMPLETE")
    trained = contract.trained_piece(contract.piece_spec(config, tmp_path / "train", 1, run))
    archive_dataset(config["dataset"], tmp_path / "data.tar", tmp_path / "data.manifest.json")
    results = tmp_path / "results"
    (tmp_path / "record.json").write_text(json.dumps({"run_id": "run0", "outcome": "finished"}))
    return PredictJob(
        run_id="run0",
        task=config["task"],
        identity={"dataset": config["dataset"], "training": config["training"]},
        archive=tmp_path / "data.tar",
        manifest=tmp_path / "data.manifest.json",
        trained=trained.output,
        scratch_root=str(tmp_path / "scratch"),
        threads=1,
        workflow_dir=REPO,
        metrics_out=results / "metrics.json",
        record_out=results / "predict_record.json",
        curves_out=results / "curves.png",
        predictions_out=results / "predictions.csv",
        tracking="tensorboard",
        train_record=tmp_path / "record.json",
        figures_out=results / "figures",
        predicted_in_training=results / "predicted-in-training",
    )


DRAWING = """    from matplotlib.figure import Figure

    figure = Figure(figsize=(4, 3))
    figure.add_subplot().scatter(predictions["label"], predictions["predicted"])
    return Predicted(metrics=metrics, predictions=predictions, figures={"predicted_vs_true": figure})
"""


def test_a_figure_predict_returns_is_saved_as_a_png_in_the_runs_figures_and_an_older_one_goes(tmp_path, monkeypatch):
    """A regression's predicted-against-true figure: results/runs/<run>/figures/predicted_vs_true.png;
    a figure an earlier prediction of the run drew, and this one did not, is not left there."""
    from scratchflow.jobs import predict_job

    config, _ = lab_task(tmp_path, monkeypatch, (PREDICTING, DRAWING))
    monkeypatch.chdir(tmp_path)  # where the job reads the run's curves (results/runs/run0/tensorboard)
    job = predict_job_of(config, tmp_path)
    job.figures_out.mkdir(parents=True)
    (job.figures_out / "residuals.png").write_bytes(b"an earlier prediction's")
    predict_job(job)
    assert [path.name for path in job.figures_out.iterdir()] == ["predicted_vs_true.png"]
    assert drawn_figure(job.figures_out / "predicted_vs_true.png") == (400, 300), "4 x 3 inches at 100 dpi"


@pytest.mark.parametrize(
    "figures, problem",
    [
        ([], "figures that are a list, not a dict of name -> matplotlib Figure"),
        (
            {"true/predicted": None, "": None},
            "figures named 'true/predicted', '': a figure's name is its file's (<name>.png): letters, digits, _ and -",
        ),
        (
            {"curve": [1, 2], "image": "x.png"},
            "figures that are not a matplotlib Figure: curve (a list), image (a str)",
        ),
    ],
)
def test_figures_that_are_not_named_matplotlib_figures_are_refused_in_a_line(figures, problem):
    predicted = Predicted(metrics={"loss": 0.5}, figures=figures)
    assert predicted_problem(predicted, ("loss",), writes_predictions=False) == problem


def test_a_contract_config_whose_data_or_task_is_missing_is_one_line_naming_it(tmp_path):
    """Missing data (dataset.path, a split's file), a task module that fails as it is imported, and an
    empty file: one line each, no traceback; each config is checked."""
    lab = shutil.copytree(PLAIN_PYTORCH_LAB, tmp_path / "ourlab-pipeline")
    contract_config = yaml.safe_load((lab / "contract" / "mlp.yaml").read_text())
    configs = {
        "no-data.yaml": {**contract_config, "dataset": {**contract_config["dataset"], "path": "data/gone.csv"}},
        "no-split.yaml": {
            **contract_config,
            "dataset": {**contract_config["dataset"], "splits": {"train": "data/numbers.csv", "test": "data/t.csv"}},
        },
        "import-fails.yaml": {**contract_config, "task": "ourlab.broken"},
    }
    for name, config in configs.items():
        (lab / "contract" / name).write_text(yaml.safe_dump(config))
    (lab / "ourlab" / "broken.py").write_text("import numbers_we_never_installed\n")
    (lab / "contract" / "empty.yaml").touch()
    checked = check_task(lab, *(f"contract/{name}" for name in configs), "contract/empty.yaml")
    assert checked.returncode == 1 and "Traceback" not in checked.stdout + checked.stderr, checked.stderr[-3000:]
    not_run = "not a config scratchflow runs: config key"
    assert checked.stdout.splitlines() == [
        f"contract/no-data.yaml: {not_run} dataset.path: {lab}/data/gone.csv is not there",
        f"contract/no-split.yaml: {not_run} dataset.splits.test: {lab}/data/t.csv is not there",
        "contract/import-fails.yaml: ourlab.broken: loaded, its settings checked: FAILED: its module, as it was "
        "imported, raised ModuleNotFoundError: "
        f"No module named 'numbers_we_never_installed' (raised at {lab}/ourlab/broken.py:1 (in <module>)): the "
        f"environment of {sys.executable} lacks it; add the package that provides it to your pipeline's "
        'requirements.txt and install that file there (docs/lab-pipeline.md, "Your environment and your packages")',
        "contract/empty.yaml: not a config scratchflow runs: it holds no mapping of config keys (task:, dataset:, "
        "grid:, ...)",
    ]


def test_a_task_whose_resumed_run_draws_its_batches_otherwise_fails_the_exact_resume_check(tmp_path, monkeypatch):
    """The commonest bug of a resumable task: batches drawn from the process's random state, which a
    resumed piece does not have. Every other check passes; the last names the weights that differ."""
    config, _ = lab_task(
        tmp_path,
        monkeypatch,
        ('generator=torch.Generator().manual_seed(params["seed"] * 1000 + epoch)', "generator=None"),
    )
    results = dict(contract.check_all(config))
    assert [check for check, failure in results.items() if failure is not None] == [CHECKS[-1]]
    assert str(results[CHECKS[-1]]).startswith(
        f"{config['task']}: stopped and resumed, the run ended otherwise than uninterrupted: model.pt differs"
    )


def test_a_task_written_for_0_4_passes_as_it_is(tmp_path, monkeypatch):
    """What a 0.4 task still writes is taken: every declaration, METRICS as a tuple (the config's
    goal then), a whole progress report of six numbers, its own pruning of scratch checkpoints."""
    config, _ = lab_task(
        tmp_path,
        monkeypatch,
        (
            'METRICS = {"accuracy": "max", "loss": "min"}',
            'CHECKPOINT_MARKER = "COMPLETE"\nNEEDS_MODEL = False\nMETRICS = ("accuracy", "loss")\n'
            "LAUNCHES_OWN_PROCESSES = False\n\n\ndef check_model(model_dir):\n    pass",
        ),
        (
            "context.report_progress(step, end, loss.item())",
            'context.report_progress({"step": step, "max_steps": end, "loss": loss.item(), '
            '"samples_per_second": 1.0, "seconds_left": 1.0, "at": __import__("time").time()})',
        ),
        (
            "    context.checkpoint_saved(folder)\n",
            "    context.checkpoint_saved(folder)\n"
            "    for old in sorted(context.checkpoint_dir.glob('checkpoint-*'), key=lambda old: int(old.name[11:]))"
            "[: -context.keep_checkpoints]:\n        shutil.rmtree(old)\n",
        ),
        ("import csv\n", "import csv\nimport shutil\n"),
    )
    assert config["aggregate"]["goal"] == "max"
    results = dict(contract.check_all(config))
    assert results == dict.fromkeys(CHECKS), results
