"""The other tasks through the whole lifecycle: images (a tiny ResNet on animal silhouettes) and a
lab's own program (config/examples/command/train.py, plain PyTorch), each interrupted and resumed to
exactly the metrics of an uninterrupted run; datasets that ship their own split files."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import (
    REPO,
    command_config,
    different_curves,
    image_config,
    job_process,
    jobs_run,
    jobs_started,
    metrics_of,
    published_checkpoint,
    recipe,
    run_workflow,
    same_metrics,
    same_weights,
    start_workflow,
    workflow_config,
    write_config,
    write_recipe_data,
)
from scratchflow.classification import TRAINER_CHECKPOINT_MARKER
from scratchflow.lease import RunFolder
from scratchflow.record import git_state

pytestmark = pytest.mark.slow


def wait_for_checkpoint(workdir: Path, workflow: subprocess.Popen, marker: str) -> Path:
    """The run's shared checkpoint folder, once it holds a published checkpoint."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and workflow.poll() is None:
        found = [path for path in (workdir / "checkpoints").glob("*") if path.is_dir()]
        if found and published_checkpoint(found[0], marker) is not None:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint appeared; the workflow said:\n{workflow.communicate()[0][-4000:]}")


def wait_for_checkpoint_on_scratch(scratch: Path, workflow: subprocess.Popen) -> None:
    """Until the program training under `scratch` has written its first complete checkpoint there: a
    stop sent then arrives seconds before the end (the shared copy of a checkpoint may come only once
    the program has finished)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and workflow.poll() is None:
        try:
            if any(scratch.rglob("checkpoint-*/COMPLETE")):
                return
        except OSError:  # a checkpoint pruned while it was looked at
            pass
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint on scratch; the workflow said:\n{workflow.communicate()[0][-4000:]}")


def run_log(workdir: Path) -> str:
    """The rule's log of the one run (beside it, each piece's)."""
    (log,) = (workdir / "logs" / "train").glob("??????????.log")
    return log.read_text()


def record_of(workdir: Path) -> dict:
    (record,) = (workdir / "results" / "runs").glob("*/record.json")
    return json.loads(record.read_text())


def test_an_image_run_killed_midway_resumes_to_identical_metrics(
    tmp_path, animal_images, tiny_resnet, uninterrupted_image_run
):
    write_config(tmp_path, image_config(animal_images, tiny_resnet, tmp_path / "scratch"))
    workflow = start_workflow(tmp_path)
    run_id = wait_for_checkpoint(tmp_path, workflow, TRAINER_CHECKPOINT_MARKER).name
    os.killpg(workflow.pid, signal.SIGKILL)
    workflow.wait()
    assert not (tmp_path / "results" / "runs" / run_id / "record.json").exists(), "killed too late"

    run_workflow(tmp_path)

    assert record_of(tmp_path)["training"]["resumed_from_step"] >= 10
    assert same_metrics(tmp_path, uninterrupted_image_run)
    metrics = json.loads((tmp_path / "results" / "runs" / run_id / "metrics.json").read_text())
    assert metrics["accuracy"] > 0.4, "four animals: chance is 0.25"
    predictions = pd.read_csv(tmp_path / "results" / "runs" / run_id / "predictions.csv")
    assert len(predictions) == metrics["examples"] == 32
    assert (tmp_path / "results" / "runs" / run_id / "model" / "preprocessor_config.json").is_file()
    assert list((tmp_path / "scratch").iterdir()) == []


def test_a_command_run_stopped_by_usr1_pauses_and_the_retry_resumes_to_identical_metrics(
    tmp_path, bbc_subset, uninterrupted_command_run
):
    """USR1 to the job only: the job passes it on to the program, which saves and exits; the piece is
    recorded as paused with its own log, and the local profile's retry resumes from the checkpoint."""
    write_config(tmp_path, command_config(bbc_subset, tmp_path / "scratch"))
    workflow = start_workflow(tmp_path)
    wait_for_checkpoint_on_scratch(tmp_path / "scratch", workflow)
    os.kill(job_process(tmp_path), signal.SIGUSR1)
    output = workflow.communicate(timeout=300)[0]
    assert workflow.returncode == 0, output[-3000:]

    record = record_of(tmp_path)
    first, second = record["pieces"]
    assert (first["outcome"], first["signal"], first["phase"]) == ("paused", "SIGUSR1", "training"), output[-3000:]
    # The program's own repository (here scratchflow's: config/examples/command/train.py).
    assert record["training"]["program_git"]["commit"] == git_state(REPO)["commit"]
    assert first["reached_step"] == second["resumed_from_step"] > 0
    assert "SIGUSR1 received" in (tmp_path / first["log"]).read_text()
    assert "resumed at step" not in (tmp_path / first["log"]).read_text()
    assert same_weights(tmp_path, uninterrupted_command_run, "model.pt")
    assert same_metrics(tmp_path, uninterrupted_command_run), (
        metrics_of(tmp_path),
        metrics_of(uninterrupted_command_run),
        first,
        second,
    )
    (run,) = (tmp_path / "results" / "runs").iterdir()
    assert "resumed at step" in (tmp_path / "logs" / "train" / f"{run.name}.log").read_text()
    assert different_curves(tmp_path, uninterrupted_command_run, rel=0) == [], "the program's own curves"
    assert (run / "model" / "model.pt").is_file()
    runs = pd.read_csv(tmp_path / "results" / "runs.tsv", sep="\t")
    assert list(runs.columns[:5]) == ["run_id", "test_loss", "accuracy", "macro_f1", "steps"], (
        "the ranking metric first"
    )
    assert not {"hidden", "features", "learning_rate"} & set(runs.columns), (
        "one run: no parameter tells it from another"
    )
    assert json.loads((tmp_path / "results" / "best_run.json").read_text())["goal"] == "min"
    assert list((tmp_path / "scratch").iterdir()) == []


def test_a_command_that_raises_fails_its_run_once_telling_the_tail_of_its_output_and_its_line(tmp_path, bbc_subset):
    """A lab program that raises fails for good: no retry (the local profile has one), its job ends
    the run `failed` with the program's last line and the file and line its traceback names, no
    scratchflow frames; nothing to compare, said in one line."""
    script = tmp_path / "broken.py"
    script.write_text("import sys\nprint('loading the data')\nraise KeyError('no such column')\n")
    write_config(tmp_path, command_config(bbc_subset, tmp_path / "scratch", command=["python", str(script)]))
    result = run_workflow(tmp_path, check=False)
    assert result.returncode != 0
    assert jobs_started(result.stdout)["train"] == 1, "not retried"
    log = run_log(tmp_path)
    assert "exited with 1, its last line: KeyError: 'no such column'; its last lines:" in log
    assert "scratchflow/" not in "".join(re.findall(r'File "[^"]+"', log)), "the program's frames, none of ours"
    (record,) = tmp_path.glob("results/runs/*/record.json")
    failure = json.loads(record.read_text())["failure"]
    assert failure["where"] == f"{script}:3 (in <module>)" and failure["cause"].startswith(
        "CommandFailed: the command ['python'"
    )
    assert f"a retry cannot fix it: CommandFailed: the command ['python', '{script}'] exited with 1" in result.stdout
    assert "no run finished, none to compare" in result.stdout
    assert list((tmp_path / "scratch").iterdir()) == []


SOMETIMES_SILENT = """import json, os, pathlib
if not json.loads(pathlib.Path(os.environ["SCRATCHFLOW_PARAMS"]).read_text())["silent"]:
    pathlib.Path(os.environ["SCRATCHFLOW_OUTPUT_DIR"], "metrics.json").write_text('{"accuracy": 0.5, "test_loss": 1.0}')
print("trained")
"""


def test_a_run_that_fails_for_good_costs_one_job_the_grid_is_compared_without_it_and_a_fix_trains_it_alone(
    tmp_path, bbc_subset
):
    """Of a grid of two, the run whose program forgets metrics.json fails once, naming the file (a
    retry could not fix it); the other trains and is compared alone; the page, runs.tsv and `make
    status` name the failed run and why; the workflow exits non-zero saying so. The same command
    after the fix trains only the failed run, and once more nothing."""
    script = tmp_path / "sometimes_silent.py"
    script.write_text(SOMETIMES_SILENT)
    config = command_config(bbc_subset, tmp_path / "scratch", command=["python", str(script)], silent=False)
    config["grid"] = {"silent": [False, True]}
    write_config(tmp_path, config)
    result = run_workflow(tmp_path, check=False)
    assert result.returncode != 0
    assert jobs_started(result.stdout)["train"] == 2, "one job each: no retry"
    runs = {json.loads(path.read_text())["silent"]: path.parent for path in tmp_path.glob("results/runs/*/params.json")}
    silent = runs[True].name
    said = f"run {silent} failed: CommandFailed: metrics.json is missing"
    assert "scratchflow: 1 of 2 runs failed, each in a way a retry cannot fix" in result.stdout
    assert said in result.stdout
    table = pd.read_csv(tmp_path / "results" / "runs.tsv", sep="\t")
    assert list(table["outcome"]) == ["finished", "failed"] and table["accuracy"].notna().tolist() == [True, False]
    assert json.loads((tmp_path / "results" / "best_run.json").read_text())["run"]["run_id"] == runs[False].name
    assert said in (tmp_path / "results" / "summary.html").read_text()
    status = subprocess.run(
        [sys.executable, REPO / "scripts" / "status.py", tmp_path], capture_output=True, text=True
    ).stdout
    assert f"{silent}  failed" in status and "after a fix, the same command trains it again" in status, status

    script.write_text(SOMETIMES_SILENT.replace("if not ", "if True or not "))  # the fix
    rerun = run_workflow(tmp_path)
    assert jobs_run(rerun.stdout)["train"] == 1, "the failed run only"
    assert list(pd.read_csv(tmp_path / "results" / "runs.tsv", sep="\t")["outcome"]) == ["finished", "finished"]
    assert "Nothing to be done" in run_workflow(tmp_path).stdout, "trained: nothing more"


def recipe_on_tiny_data(name: str, workdir: Path, bbc_subset: Path, tiny_model: Path, epochs: int) -> dict:
    """A README recipe of a text dataset (config/tests/<name>) as it is, on the tests' data, with the
    tiny model and a few epochs."""
    splits = write_recipe_data(workdir, bbc_subset)
    config = {**workflow_config(bbc_subset, tiny_model, workdir / "scratch"), **recipe(name)}
    config["model"] = {"name": "tiny-bert", "source": str(tiny_model)}
    config["training"] = {**workflow_config(bbc_subset, tiny_model, None)["training"], "epochs": epochs}
    write_config(workdir, config)
    return splits


def test_a_dataset_with_its_own_parquet_split_files_trains_and_tests_on_them(tmp_path, bbc_subset, tiny_model):
    splits = recipe_on_tiny_data("split-files.yaml", tmp_path, bbc_subset, tiny_model, epochs=2)["with_validation"]
    run_workflow(tmp_path)
    (run,) = (tmp_path / "results" / "runs").iterdir()
    predictions = pd.read_csv(run / "predictions.csv")
    assert len(predictions) == len(splits["test"]) == 60
    record = json.loads((run / "record.json").read_text())
    assert record["training"]["train_examples"] == len(splits["train"])
    assert record["data"]["files"] == 3
    assert record["run"]["dataset"]["splits"] == ["test", "train", "validation"]


def test_a_text_dataset_of_train_and_test_files_only_trains_without_validation(tmp_path, bbc_subset, tiny_model):
    """dataset.splits with no validation file (it is optional): nothing is evaluated during training."""
    shape = "split-files-without-validation.yaml"
    splits = recipe_on_tiny_data(shape, tmp_path, bbc_subset, tiny_model, epochs=1)["without_validation"]
    run_workflow(tmp_path)
    record = record_of(tmp_path)
    assert record["training"]["validation_examples"] == 0
    assert record["training"]["train_examples"] == len(splits["train"])
    assert "validation" not in record["training"]
    (run,) = (tmp_path / "results" / "runs").iterdir()
    assert len(pd.read_csv(run / "predictions.csv")) == len(splits["test"])


def test_an_image_dataset_of_train_and_test_folders_only_trains_without_validation(
    tmp_path, animal_images, tiny_resnet
):
    folders = {name: tmp_path / "data" / name for name in ("train", "test")}
    for label_folder in sorted(animal_images.iterdir()):
        for index, image in enumerate(sorted(label_folder.iterdir())):
            target = folders["test" if index % 4 == 0 else "train"] / label_folder.name
            target.mkdir(parents=True, exist_ok=True)
            (target / image.name).write_bytes(image.read_bytes())
    config = image_config(animal_images, tiny_resnet, tmp_path / "scratch", epochs=1)
    del config["dataset"]["path"], config["dataset"]["split_seed"]
    config["dataset"]["splits"] = {name: str(folder) for name, folder in folders.items()}
    write_config(tmp_path, config)
    run_workflow(tmp_path)
    record = record_of(tmp_path)
    assert record["training"]["validation_examples"] == 0
    assert record["training"]["train_examples"] == 120
    (run,) = (tmp_path / "results" / "runs").iterdir()
    assert len(pd.read_csv(run / "predictions.csv")) == 40


def test_a_rung_jobs_progress_counts_to_the_rungs_end(tmp_path):
    """Inside rung 0 (1 of 2 epochs, 60 steps in all) the status and the console said "step 10 of 60
    (17%)" and the time left to step 60, where the job stops at step 30."""
    from types import SimpleNamespace

    from scratchflow.hf_trainer import ProgressLog
    from scratchflow.ledger import PROGRESS_FILE, RunLedger

    context = SimpleNamespace(
        run_id="rung0run00", budget_epochs=1, report_progress=RunLedger(RunFolder(tmp_path)).report_progress
    )
    progress = ProgressLog(context)
    args = SimpleNamespace(num_train_epochs=2, per_device_train_batch_size=8, world_size=1)
    state = SimpleNamespace(global_step=1, max_steps=60, is_world_process_zero=True)
    progress.on_train_begin(args, state, None)
    progress.on_step_end(args, state, None)
    progress.last = (1, progress.last[1] - 9.0)  # 9 steps in 9 s
    state.global_step = 10
    progress.on_log(args, state, None, logs={"loss": 1.5})
    reported = json.loads((tmp_path / PROGRESS_FILE).read_text())
    assert reported["max_steps"] == 30
    assert reported["seconds_left"] == pytest.approx(20, rel=0.01)


def test_the_trainers_metrics_lines_are_printed_by_the_jobs_first_process_only(capsys):
    """Each node's first process printed them, and a two-node job's log had every line twice."""
    from types import SimpleNamespace

    from scratchflow.hf_trainer import PrintLogsOnce

    printer = PrintLogsOnce()
    second_node = SimpleNamespace(is_local_process_zero=True, is_world_process_zero=False)
    printer.on_log(None, second_node, None, logs={"loss": 0.5})
    first_node = SimpleNamespace(is_local_process_zero=True, is_world_process_zero=True)
    printer.on_log(None, first_node, None, logs={"loss": 0.5})
    assert capsys.readouterr().out.splitlines() == ["{'loss': '0.5'}"]
