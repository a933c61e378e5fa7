"""The whole lifecycle through Snakemake, on real data with a tiny real transformer."""

from __future__ import annotations

import ast
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import (
    different_curves,
    drawn_figure,
    job_process,
    jobs_run,
    jobs_started,
    long_run,
    published_checkpoint,
    recipe,
    run_workflow,
    same_results,
    start_workflow,
    wait_until_gone,
    wandb_offline_runs,
    workflow_config,
    write_config,
    write_recipe_data,
)
from scratchflow.checkpoints import step_of
from scratchflow.classification import TRAINER_CHECKPOINT_MARKER
from scratchflow.dataset import load_examples
from scratchflow.ledger import piece_time
from scratchflow.plan import TENSORBOARD_FOLDER
from scratchflow.tracking import read_curves

pytestmark = pytest.mark.slow
STATUS_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "status.py"


def run_dirs(workdir: Path) -> list[Path]:
    return sorted((workdir / "results" / "runs").iterdir())


@pytest.fixture(scope="module")
def finished(tmp_path_factory, bbc_subset, tiny_model):
    workdir = tmp_path_factory.mktemp("workflow")
    scratch = workdir / "scratch"
    config = workflow_config(bbc_subset, tiny_model, scratch)
    # The archive in two compressed parts, as the README's recipe has it: every job stages both at
    # once (one archive elsewhere).
    shape = recipe("tracked-parts-zstd.yaml")["dataset"]
    config["dataset"].update(compression=shape["compression"], archive_parts=shape["archive_parts"])
    write_config(workdir, config, prefetched=False)
    # No network namespace: proves that no step needs the internet (compute nodes may have none).
    result = run_workflow(workdir, offline=True)
    return workdir, scratch, result


def test_a_grid_runs_through_the_whole_lifecycle(finished):
    workdir, _, result = finished
    runs = pd.read_csv(workdir / "results" / "runs.tsv", sep="\t")
    assert sorted(runs["learning_rate"]) == [1.0e-3, 2.0e-3]
    assert set(runs["run_id"]) == {path.name for path in run_dirs(workdir)}
    # Only what tells the runs apart: the learning rate, not the one seed nor the epochs.
    assert not {"seed", "epochs"} & set(runs.columns)
    assert list(runs.columns[2:4]) == ["macro_f1", "accuracy"], "the metric the runs are ranked by first"
    # One seed per setting: a setting per run, its mean the run's value.
    summary = pd.read_csv(workdir / "results" / "summary.tsv", sep="\t")
    assert sorted(summary["run_ids"]) == sorted(runs["run_id"])
    assert sorted(summary["macro_f1_mean"]) == sorted(runs["macro_f1"])
    best = json.loads((workdir / "results" / "best_run.json").read_text())
    assert best["run"]["run_id"] == runs.loc[runs["macro_f1"].idxmax(), "run_id"]
    assert best["setting"]["run_ids"] == [best["run"]["run_id"]]
    for figure in ("comparison.png", "curves.png"):
        assert drawn_figure(workdir / "results" / figure)[0] >= 800
    assert str(workdir / "results" / "summary.tsv") in result.stdout
    # A classifier's best run reports its confusion matrix: drawn, listed, and on the page.
    assert drawn_figure(workdir / "results" / "best_confusion_matrix.png")[0] > 0
    assert str(workdir / "results" / "best_confusion_matrix.png") in result.stdout
    assert "<figcaption>best_confusion_matrix: " in (workdir / "results" / "summary.html").read_text()
    assert f"tensorboard --logdir {workdir / 'results' / 'runs'}" in result.stdout
    status = subprocess.run([sys.executable, STATUS_SCRIPT, workdir], capture_output=True, text=True, check=True)
    *_, total, spend = status.stdout.splitlines()
    assert total == "2 runs: 2 finished"
    assert spend.startswith("spent so far: no Slurm accounting: GPU-hours not known, ")
    # What each run cost without Slurm: its pieces' time (its prediction's too, made by its train
    # job) times their threads.
    assert runs["gpu_hours"].isna().all() and (runs["lost_cpu_hours"] == 0).all()
    for _, run in runs.iterrows():
        folder = workdir / "results" / "runs" / run["run_id"]
        record, predicted = (json.loads((folder / name).read_text()) for name in ("record.json", "predict_record.json"))
        seconds = sum(
            (piece_time(piece["ended_at"]) - piece_time(piece["started_at"])) * piece["threads"]
            for piece in record["pieces"]
        )
        assert predicted["predicted_in_training"]["timings_seconds"]["predict"] > 0
        assert run["cpu_hours"] == pytest.approx(seconds / 3600, abs=5e-7)  # as runs.tsv rounds it: 6 decimals
    assert sorted(summary["cpu_hours"]) == sorted(runs["cpu_hours"])
    assert "What the grid cost: no Slurm accounting" in (workdir / "results" / "summary.html").read_text()
    assert sorted(path.name for path in (workdir / "archives").iterdir()) == [
        "bbc-subset.2.tar.zst",
        "bbc-subset.manifest.json",
        "bbc-subset.tar.zst",
    ]
    for log in (workdir / "logs" / "train").iterdir():
        assert "from 2 part(s) of bbc-subset.tar.zst" in log.read_text()
    # The tiny model learns the topics far above chance (0.2) from 210 articles.
    assert runs["accuracy"].max() > 0.5


def test_each_run_records_what_reproduces_it(finished):
    workdir, _, _ = finished
    for run in run_dirs(workdir):
        record = json.loads((run / "record.json").read_text())
        assert record["run_id"] == run.name
        assert record["run"]["training"] == json.loads((run / "params.json").read_text())
        assert record["config"]["checkpointing"]["keep"] == 2  # the config as validated and resolved
        assert record["config"]["checkpointing"]["every_minutes"] == 10  # a default filled in
        assert record["config"]["aggregate"]["metric"] == "macro_f1"
        (piece,) = record["pieces"]
        assert [cost["step"] for cost in piece["checkpoints"]] == [record["training"]["global_steps"]], "the final"
        assert set(record["timings_seconds"]) == {"stage", "train", "sync", "predict", "cleanup"}
        assert record["data"]["files"] == 300
        assert record["environment"]["packages"]["torch"].startswith("2.13.0")
        assert "commit" in record["environment"]["git"]
        predictions = pd.read_csv(run / "predictions.csv")
        metrics = json.loads((run / "metrics.json").read_text())
        assert len(predictions) == metrics["examples"] == 60
        assert metrics["accuracy"] == pytest.approx((predictions["label"] == predictions["predicted"]).mean())
        assert (run / "model" / "config.json").is_file()


def test_each_run_logs_its_progress_and_keeps_its_curves_on_shared_storage(finished):
    workdir, _, result = finished
    for run in run_dirs(workdir):
        log = (workdir / "logs" / "train" / f"{run.name}.log").read_text()
        # 210 training articles in batches of 16, 20 epochs: 280 steps, a line every 10.
        progress = r"step (\d+)/280 \(\d+%\), loss [\d.]+, [\d.]+ samples/s, [\w ]+ left"
        lines = re.findall(progress, log)
        assert [int(step) for step in lines] == list(range(10, 281, 10))
        shown = re.findall(rf"^scratchflow: run {run.name}: {progress}$", result.stdout, re.MULTILINE)
        assert [int(step) for step in shown] == list(range(10, 281, 10)), "the console shows them too"
        assert "\r" not in log, "no progress bars in log files"
        curves = read_curves(run / TENSORBOARD_FOLDER)
        assert [step for step, _ in curves["train/loss"]] == list(range(10, 281, 10))
        assert [step for step, _ in curves["eval/accuracy"]] == list(range(14, 281, 14)), "one per epoch"
        assert drawn_figure(run / "curves.png")[0] >= 800  # a panel per curve worth one


@contextlib.contextmanager
def headless_chromium():
    """Debian's chromium (installed by `make setup-dev`), driven by selenium."""
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    options.binary_location = shutil.which("chromium")
    browser = webdriver.Chrome(service=webdriver.ChromeService(shutil.which("chromedriver")), options=options)
    try:
        yield browser
    finally:
        browser.quit()


def test_the_report_opens_in_a_browser_with_every_run_in_a_table_that_sorts(finished):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    workdir, _, _ = finished
    run_workflow(workdir, "--report", "results/report.html")
    run_ids = sorted(run.name for run in run_dirs(workdir))
    with headless_chromium() as browser:
        browser.get((workdir / "results" / "report.html").as_uri())
        find = WebDriverWait(browser, 30).until
        find(lambda page: page.find_element(By.XPATH, "//span[text()='Comparison']")).click()
        row = "//td[text()='results/summary.html']/.."
        find(lambda page: page.find_element(By.XPATH, f"{row}//a[@iconname='eye']")).click()
        browser.switch_to.frame(find(lambda page: page.find_element(By.TAG_NAME, "iframe")))

        def column(name: str) -> list[str]:
            heads = [head.text.strip(" ▲▼") for head in browser.find_elements(By.CSS_SELECTOR, "#runs th")]
            index = heads.index(name)
            return [
                row.find_elements(By.TAG_NAME, "td")[index].text
                for row in browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")
            ]

        def sort_by(name: str) -> None:
            next(
                head for head in browser.find_elements(By.CSS_SELECTOR, "#runs th") if head.text.strip(" ▲▼") == name
            ).click()

        find(lambda page: page.find_element(By.CSS_SELECTOR, "#runs tbody tr"))
        assert sorted(column("run_id")) == run_ids, "every run, once"
        sort_by("run_id")
        assert column("run_id") == run_ids
        sort_by("run_id")
        assert column("run_id") == run_ids[::-1], "a second click sorts the other way"
        sort_by("macro_f1")
        values = [float(value) for value in column("macro_f1")]
        assert values == sorted(values)
        assert "Provenance" in browser.find_element(By.TAG_NAME, "body").text


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except OSError:
        return False


def test_tensorboards_hparams_view_lists_the_grid_with_its_test_metrics_and_cost(finished):
    """`tensorboard --logdir results/runs` (the command the workflow prints), opened in a browser:
    the HParams view has a row per run with its parameters, test metrics and CPU-hours."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    workdir, _, _ = finished
    runs = pd.read_csv(workdir / "results" / "runs.tsv", sep="\t")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [str(Path(sys.executable).parent / "tensorboard"), "--logdir", "results/runs", "--port", str(port)]
    server = subprocess.Popen(command, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not answers(f"http://127.0.0.1:{port}/"):
            assert server.poll() is None and time.monotonic() < deadline, "TensorBoard did not start"
            time.sleep(0.2)
        with headless_chromium() as browser:
            browser.get(f"http://127.0.0.1:{port}/#hparams")

            def whole_text(page) -> str | bool:
                text = page.find_element(By.TAG_NAME, "body").text
                return text if all(f"{run_id}/tensorboard/hparams" in text for run_id in runs["run_id"]) else False

            shown = WebDriverWait(browser, 60, poll_frequency=0.5).until(whole_text)
    finally:
        server.terminate()
        server.wait()
    for column in ("learning_rate", "seed", "test/macro_f1", "test/accuracy", "cost/cpu_hours"):
        assert column in shown, column
    assert "Number of matching session groups: 2" in shown
    assert "cost/gpu_hours" not in shown, "no GPU figure without Slurm: no column, not a column of zeros"


def test_scratch_and_checkpoints_are_gone_after_success(finished):
    workdir, scratch, _ = finished
    assert list(scratch.iterdir()) == []
    assert list((workdir / "checkpoints").iterdir()) == []


def test_a_second_run_has_nothing_to_do(finished):
    workdir, _, _ = finished
    result = run_workflow(workdir)
    assert "Nothing to be done" in result.stdout


def test_predict_reruns_without_retraining_and_predicts_what_the_train_job_predicted_as_it_ended(finished):
    workdir, _, _ = finished
    trained = {run.name: (run / "record.json").stat().st_mtime_ns for run in run_dirs(workdir)}
    predicted = {run.name: prediction_of(run) for run in run_dirs(workdir)}
    for run in run_dirs(workdir):  # the train job predicted; its predict job moved that into place
        made = json.loads((run / "predict_record.json").read_text())["predicted_in_training"]
        assert made["piece"] == 1 and not (run / "predicted-in-training").exists()
    result = run_workflow(workdir, "--forcerun", "predict")
    assert jobs_run(result.stdout) == {"predict": 2, "aggregate": 1, "all": 1}
    assert {run.name: (run / "record.json").stat().st_mtime_ns for run in run_dirs(workdir)} == trained
    for run in run_dirs(workdir):  # predicted again, in a job of its own, from the synced model
        assert "predicted_in_training" not in json.loads((run / "predict_record.json").read_text())
        metrics, predictions = prediction_of(run)
        assert metrics == predicted[run.name][0]
        pd.testing.assert_frame_equal(predictions, predicted[run.name][1], check_exact=False, atol=2e-6)


def prediction_of(run: Path) -> tuple[dict, pd.DataFrame]:
    return json.loads((run / "metrics.json").read_text()), pd.read_csv(run / "predictions.csv")


def test_a_new_grid_value_runs_only_the_new_runs(finished):
    workdir, _, _ = finished
    before = {run.name: (run / "record.json").stat().st_mtime_ns for run in run_dirs(workdir)}
    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    # The same dataset settings in another order: in the config, or as an older scratchflow recorded
    # them (in the config's order) in Snakemake's metadata. Nothing to do: no archive, no training.
    config["dataset"] = dict(reversed(config["dataset"].items()))
    write_config(workdir, config)
    for metadata in (workdir / ".snakemake" / "metadata").iterdir():  # the archive's and its manifest's
        if base64.urlsafe_b64decode(metadata.name).decode().startswith("archives/"):
            record = json.loads(metadata.read_text())
            settings = next(ast.literal_eval(param) for param in record["params"] if param.startswith("{"))
            record["params"] = [
                repr(dict(reversed(settings.items()))) if param.startswith("{") else param for param in record["params"]
            ]
            metadata.write_text(json.dumps(record))
    assert "Nothing to be done" in run_workflow(workdir, "--dry-run").stdout
    config["grid"]["learning_rate"].append(5.0e-4)
    write_config(workdir, config)
    result = run_workflow(workdir)
    assert jobs_run(result.stdout) == {"train": 1, "predict": 1, "aggregate": 1, "all": 1}
    for run_id, mtime in before.items():
        assert (workdir / "results" / "runs" / run_id / "record.json").stat().st_mtime_ns == mtime
    assert len(pd.read_csv(workdir / "results" / "summary.tsv", sep="\t")) == 3


def test_a_table_dataset_runs_the_same_lifecycle(tmp_path, bbc_subset, tiny_model):
    """Nothing in the rules assumes a folder per label (or BBC): a CSV with named columns works (the
    README's recipe, config/tests/text-table.yaml, with the tiny model and one run)."""
    write_recipe_data(tmp_path, bbc_subset)
    examples = load_examples(bbc_subset, "folder", "text", "label")
    dataset = recipe("text-table.yaml")["dataset"]
    config = workflow_config(bbc_subset, tiny_model, tmp_path / "scratch", dataset=dataset, grid={"seed": [0]})
    write_config(tmp_path, config)
    run_workflow(tmp_path)
    (run,) = run_dirs(tmp_path)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["examples"] == 60
    assert sorted(metrics["per_class"]) == sorted({e.label for e in examples})


def test_the_archive_is_rebuilt_when_a_data_file_changes(tmp_path, bbc_subset, tiny_model):
    data = shutil.copytree(bbc_subset, tmp_path / "data")
    write_config(tmp_path, workflow_config(data, tiny_model, tmp_path / "scratch"))
    run_workflow(tmp_path, "archives/bbc-subset.tar")
    assert "Nothing to be done" in run_workflow(tmp_path, "archives/bbc-subset.tar").stdout
    article = next((data / "tech").iterdir())
    article.write_text(article.read_text() + " An edit.")
    result = run_workflow(tmp_path, "archives/bbc-subset.tar")
    assert jobs_run(result.stdout) == {"archive_dataset": 1}


def test_a_corrupted_archive_stops_the_run_before_training(tmp_path, bbc_subset, tiny_model):
    scratch = tmp_path / "scratch"
    write_config(tmp_path, workflow_config(bbc_subset, tiny_model, scratch))
    run_workflow(tmp_path, "archives/bbc-subset.tar")
    with open(tmp_path / "archives" / "bbc-subset.tar", "r+b") as archive:
        archive.seek(4096)
        archive.write(b"\0bitrot\0")
    result = run_workflow(tmp_path, check=False)
    assert result.returncode != 0
    assert "checksum mismatch" in result.stdout
    assert not list((tmp_path / "results").glob("runs/*/record.json"))
    assert list(scratch.iterdir()) == []
    for log in (tmp_path / "logs" / "train").iterdir():
        assert "checksum mismatch" in log.read_text()
        assert "epoch" not in log.read_text(), "training must not have started"


def wait_for_first_checkpoint(workdir: Path, workflow: subprocess.Popen, step: int = 0) -> Path:
    """The run's checkpoint folder, once it holds a published checkpoint (of `step` or later)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and workflow.poll() is None:
        found = [path for path in (workdir / "checkpoints").glob("*") if path.is_dir()]
        newest = published_checkpoint(found[0], TRAINER_CHECKPOINT_MARKER) if found else None
        if newest is not None and step_of(newest) >= step:
            return found[0]
        time.sleep(0.01)
    raise AssertionError(f"no checkpoint appeared; the workflow said:\n{workflow.communicate()[0][-4000:]}")


def wait_for_progress(folder: Path, workflow: subprocess.Popen, step: int) -> None:
    """Until the run's progress line in its train log (every 10 steps) says `step` or later (the run's
    progress.json, which `make status` reads, is written once a minute)."""
    log = folder.parent.parent / "logs" / "train" / f"{folder.name}.log"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and workflow.poll() is None:
        with contextlib.suppress(FileNotFoundError):
            if any(int(reached) >= step for reached in re.findall(r" step (\d+)/\d+ \(", log.read_text())):
                return
        time.sleep(0.02)
    raise AssertionError(f"no progress to step {step}; the workflow said:\n{workflow.communicate()[0][-4000:]}")


def test_a_run_killed_then_paused_between_logging_steps_ends_like_an_uninterrupted_run(
    tmp_path, bbc_subset, tiny_model, uninterrupted_long_run
):
    """SIGKILL snakemake and its jobs as the checkpoint at an epoch's end (step 140: epochs of 14
    steps, checkpoints every 20) appears; the same command then resumes from it; a USR1 to that job
    between two logging steps and inside an epoch pauses it, and the local profile's retry resumes.
    The run ends with the uninterrupted run's weights and metrics and with its curves, every tag
    point for point, in TensorBoard and (tracking: wandb) in W&B's offline runs: nothing the stop did
    (an evaluation, a summary) and nothing it cut (the loss since the last logged step, an epoch's
    evaluation) shows. An epoch's last checkpoint is saved after the epoch's evaluation: saved before
    it, a kill during the evaluation left a checkpoint that the resume took as evaluated, and that
    epoch's point was missing from every eval/ curve."""
    scratch = long_run(tmp_path, bbc_subset, tiny_model, tracking="wandb")
    workflow = start_workflow(tmp_path)
    run_id = wait_for_first_checkpoint(tmp_path, workflow, step=140).name
    os.killpg(workflow.pid, signal.SIGKILL)
    epoch_end = tmp_path / "checkpoints" / run_id / "checkpoint-140"
    history = json.loads((epoch_end / TRAINER_CHECKPOINT_MARKER).read_text())["log_history"]
    assert [entry["step"] for entry in history if "eval_loss" in entry][-1] == 140, "saved before its evaluation"
    workflow.wait()
    assert not (tmp_path / "results" / "runs" / run_id / "record.json").exists(), "killed too late"
    assert list(scratch.iterdir()), "the killed job's scratch is left behind, as SIGKILL allows"

    workflow = start_workflow(tmp_path)  # the same command, again
    wait_for_progress(tmp_path / "checkpoints" / run_id, workflow, 150)
    os.kill(job_process(tmp_path), signal.SIGUSR1)
    output = workflow.communicate(timeout=600)[0]
    assert workflow.returncode == 0, output[-4000:]

    record = json.loads((tmp_path / "results" / "runs" / run_id / "record.json").read_text())
    killed, paused, last = record["pieces"]
    assert (killed["outcome"], killed["reached_step"]) == ("killed", paused["resumed_from_step"])
    assert paused["resumed_from_step"] == 140 and (paused["outcome"], paused["signal"]) == ("paused", "SIGUSR1")
    stopped_at = paused["reached_step"]
    assert stopped_at % 10 and stopped_at % 14, "the stop is between logging steps and inside an epoch"
    assert last["resumed_from_step"] == record["training"]["resumed_from_step"] == stopped_at
    # Each phase over the pieces that could time themselves (a SIGKILL leaves no figure).
    assert not killed["timings_seconds"] and set(paused["timings_seconds"]) == {"stage", "train", "cleanup"}
    assert record["timings_seconds"]["train"] == pytest.approx(
        paused["timings_seconds"]["train"] + last["timings_seconds"]["train"], abs=0.002
    )
    # Each piece's log is kept: Snakemake deletes the rule's log before it runs the job again.
    killed_log = (tmp_path / killed["log"]).read_text()
    assert f"run {run_id}, piece 1:" in killed_log and "checkpoint checkpoint-120 saved" in killed_log
    assert "resuming from" not in killed_log
    paused_log = (tmp_path / paused["log"]).read_text()
    assert "SIGUSR1 received" in paused_log and "INFO scratchflow: paused, not failed: stopped on SIGUSR1" in paused_log
    assert "Traceback" not in paused_log, "a planned pause is no error"
    assert f"this piece's log: {(tmp_path / paused['log']).resolve()}" in output
    assert (tmp_path / last["log"]).samefile(tmp_path / "logs" / "train" / f"{run_id}.log")
    assert list(scratch.iterdir()) == [], "the retry removed the killed job's scratch"
    assert same_results(tmp_path, uninterrupted_long_run) == []
    assert different_curves(tmp_path, uninterrupted_long_run) == []
    assert (tmp_path / "results" / "runs" / run_id / "curves.png").read_bytes()[:4] == b"\x89PNG"

    # W&B cannot resume an offline run: each piece is one, and the predict job writes the whole run.
    # The killed piece's run holds at most what wandb had written out before SIGKILL (often nothing).
    run_folder = tmp_path / "results" / "runs" / run_id
    wandb_runs = wandb_offline_runs(run_folder)
    assert set(wandb_runs) - {f"{run_id}-piece1"} == {f"{run_id}-piece2", f"{run_id}-piece3", run_id}
    assert {run["group"] for run in wandb_runs.values()} == {run_id}
    for piece in (paused, last):
        logged = [row["train/global_step"] for row in wandb_runs[f"{run_id}-piece{piece['piece']}"]["history"].values()]
        assert min(logged) > piece["resumed_from_step"], "a piece logs from where it resumed"
    whole = wandb_runs[run_id]
    assert whole["config"]["seed"] == 7
    for tag, points in read_curves(run_folder / TENSORBOARD_FOLDER).items():
        assert [(step, whole["history"][step][tag]) for step, _ in points] == points, tag
    assert list(whole["history"]) == sorted(whole["history"]), "steps ascending, each once"
    metrics = json.loads((run_folder / "metrics.json").read_text())
    assert whole["summary"]["test_macro_f1"] == pytest.approx(metrics["macro_f1"])
    assert f"wandb sync {tmp_path.resolve() / 'results' / 'runs'}/*/wandb/offline-run-*" in output
    run_workflow(tmp_path, "--forcerun", "predict")
    assert len(list(run_folder.glob(f"wandb/offline-run-*-{run_id}"))) == 1, "predict again: the whole run replaced"


def test_with_tracking_wandb_sigterm_to_every_process_of_a_job_still_pauses_it(tmp_path, bbc_subset, tiny_model):
    """scancel signals every process of a job, W&B's service process too, which dies of it; logging to
    it then fails. The piece must still save its checkpoint and pause, as without W&B."""
    long_run(tmp_path, bbc_subset, tiny_model, tracking=recipe("tracked-parts-zstd.yaml")["tracking"])
    workflow = start_workflow(tmp_path)
    try:
        checkpoints = wait_for_first_checkpoint(tmp_path, workflow)
        job = job_process(tmp_path)
        every_process = [
            job,
            *map(int, subprocess.run(["pgrep", "-P", str(job)], capture_output=True, text=True).stdout.split()),
        ]
        assert any("wandb" in Path(f"/proc/{pid}/cmdline").read_text() for pid in every_process), "W&B's service runs"
        for pid in every_process:
            os.kill(pid, signal.SIGTERM)
        wait_until_gone(job, seconds=30)  # Slurm's KillWait: after it, SIGKILL
    finally:
        os.killpg(workflow.pid, signal.SIGKILL)
        workflow.wait()
    piece = json.loads((checkpoints / "pieces.json").read_text())[0]  # the local profile's retry may follow
    assert (piece["outcome"], piece["signal"], piece["phase"]) == ("paused", "SIGTERM", "training"), piece
    assert piece["reached_step"] is not None, "paused at a saved checkpoint"
    assert "WandbCallback stopped logging" in (tmp_path / piece["log"]).read_text()


def test_a_learning_rate_that_diverges_is_a_result_ranked_last_in_one_job_and_not_trained_again(
    tmp_path, bbc_subset, tiny_model
):
    """A grid whose second learning rate is far too high: that run's weights become NaN within a few
    steps (its warm-up); it stops there with no checkpoint of that step, ends `diverged` in its one job, and the
    comparison ranks it last and names it (runs.tsv, the page, `make status`); the workflow succeeds,
    saying so, and the same command trains nothing again."""
    config = workflow_config(bbc_subset, tiny_model, tmp_path / "scratch", grid={"learning_rate": [1.0e-3, 1.0e30]})
    config["training"]["epochs"] = 2
    write_config(tmp_path, config)
    result = run_workflow(tmp_path)
    assert jobs_started(result.stdout)["train"] == 2, "one job each: no retry"
    assert "scratchflow: 1 of 2 runs diverged (ranked last):" in result.stdout
    table = pd.read_csv(tmp_path / "results" / "runs.tsv", sep="\t")
    assert list(table["outcome"]) == ["finished", "diverged"] and list(table["learning_rate"]) == [1.0e-3, 1.0e30]
    diverged = table["run_id"].iloc[1]
    record = json.loads((tmp_path / "results" / "runs" / diverged / "record.json").read_text())
    step = record["divergence"]["step"]
    assert step < 10 and (record["outcome"], record["pieces"][-1]["outcome"]) == ("diverged", "diverged")
    assert table["detail"].iloc[1].startswith(f"at step {step}: its weights became NaN or infinite")
    assert record["pieces"][-1]["checkpoints"] == [], "no checkpoint of the diverged step"
    assert table["lost_cpu_hours"].iloc[1] == 0, "a result: nothing of it is trained again"
    assert f"run {diverged} diverged at step {step}" in (tmp_path / "results" / "summary.html").read_text()
    status = subprocess.run([sys.executable, STATUS_SCRIPT, tmp_path], capture_output=True, text=True).stdout
    assert f"{diverged}  diverged" in status and "a result, ranked last" in status, status
    assert "Nothing to be done" in run_workflow(tmp_path).stdout


def test_scratch_too_small_stops_the_job_before_training_and_is_left_empty(
    tmp_path, small_disk, bbc_subset, tiny_model
):
    write_config(tmp_path, workflow_config(bbc_subset, tiny_model, small_disk, grid={"seed": [0]}))
    result = run_workflow(tmp_path, check=False)
    assert result.returncode != 0
    assert "MB free, but staging the dataset needs" in result.stdout
    (log,) = (tmp_path / "logs" / "train").glob("??????????.log")
    assert "epoch" not in log.read_text(), "training must not have started"
    assert list(small_disk.iterdir()) == []
    assert not list(tmp_path.glob("results/runs/*/*"))


def test_a_run_saving_by_time_killed_and_paused_ends_like_an_uninterrupted_run_and_records_each_checkpoints_cost(
    tmp_path, bbc_subset, tiny_model, uninterrupted_long_run
):
    """checkpointing.every_minutes alone (0.12 s): the first checkpoint comes after 0.12 s of
    training, each next once a hundred times the last one's cost has passed (checkpoints at most 1 %
    of training). SIGKILL once the first is on shared storage, the same command resumes from it, a
    USR1 pauses that piece, the retry resumes: the run ends with the results and curves of the
    uninterrupted run, which saved every 20 steps (the interval is no part of a run's identity), and
    each piece's entry says what each of its checkpoints cost to save and to publish."""
    long_run(tmp_path, bbc_subset, tiny_model, checkpointing={"every_minutes": 0.002, "keep": 2})
    workflow = start_workflow(tmp_path)
    run_id = wait_for_first_checkpoint(tmp_path, workflow).name
    os.killpg(workflow.pid, signal.SIGKILL)
    workflow.wait()
    assert not (tmp_path / "results" / "runs" / run_id / "record.json").exists(), "killed too late"

    workflow = start_workflow(tmp_path)
    wait_for_progress(tmp_path / "checkpoints" / run_id, workflow, 150)
    os.kill(job_process(tmp_path), signal.SIGUSR1)
    output = workflow.communicate(timeout=600)[0]
    assert workflow.returncode == 0, output[-4000:]

    assert same_results(tmp_path, uninterrupted_long_run) == []
    assert different_curves(tmp_path, uninterrupted_long_run) == []
    record = json.loads((tmp_path / "results" / "runs" / run_id / "record.json").read_text())
    killed, paused, last = record["pieces"]
    assert killed["outcome"] == "killed" and paused["resumed_from_step"] == killed["reached_step"] < 20
    assert (paused["outcome"], last["resumed_from_step"]) == ("paused", paused["reached_step"])
    for piece in (paused, last):
        costs = piece["checkpoints"]
        assert costs and all(cost["save_seconds"] > 0 and cost["publish_seconds"] > 0 for cost in costs), costs
        steps = [cost["step"] for cost in costs]
        assert steps == sorted(steps) and steps[-1] == piece["reached_step"]
    assert [cost["step"] for cost in last["checkpoints"]][-1] == record["training"]["global_steps"] == 280
    paused_log = (tmp_path / paused["log"]).read_text()
    assert re.search(
        r"checkpoint-\d+ saved in [\d.]+ s, published in [\d.]+ s; the next after [\d.]+ minutes", paused_log
    )


def test_a_checkpoint_of_other_parameters_is_refused_not_resumed(tmp_path, bbc_subset, tiny_model):
    config = workflow_config(bbc_subset, tiny_model, tmp_path / "scratch", grid={"seed": [0, 1]})
    config["training"]["epochs"] = 2
    config["checkpointing"]["keep_after_training"] = True
    write_config(tmp_path, config)
    run_workflow(tmp_path)
    first, second = sorted((tmp_path / "checkpoints").iterdir())
    # The second run's checkpoints replaced by the first's (a copy gone wrong, a reused folder).
    shutil.rmtree(second)
    shutil.copytree(first, second)
    shutil.rmtree(tmp_path / "results" / "runs" / second.name)

    result = run_workflow(tmp_path, f"results/runs/{second.name}/record.json", check=False)
    assert result.returncode != 0
    assert f"{second.relative_to(tmp_path)} holds checkpoints of a different run (differs in: run_id, training)" in (
        result.stdout
    )
    log = (tmp_path / "logs" / "train" / f"{second.name}.log").read_text()
    assert "resuming from" not in log and "epoch" not in log
    assert not (tmp_path / "results" / "runs" / second.name).exists()
    assert (tmp_path / "results" / "runs" / first.name / "record.json").is_file()
