"""A run's prediction made by its train job as the run ends (scratchflow.prediction), and what its
predict job does with it: moves it into place where it was made for the run's model; predicts in a
job of its own where it was not, or where none was made (a failing predict, a stop while predicting)."""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO
from scratchflow import prediction
from scratchflow.jobs import PredictJob, predict_job, train_job
from scratchflow.piece import TrainingStopped
from scratchflow.tasks import PredictContext, command
from test_run_folder import a_train_job


@pytest.fixture
def job(tmp_path, monkeypatch):
    """A command task's train job in this process, in the folder a workflow runs in."""
    for variable in ("SCRATCHFLOW_STOP_SIGNAL", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # the job sets them
        monkeypatch.setenv(variable, "")
    monkeypatch.chdir(tmp_path)
    job = a_train_job(tmp_path)
    job.log.parent.mkdir(parents=True)
    return job


def its_predict_job(job) -> PredictJob:
    run = job.ends_with.record.parent
    return PredictJob(
        run_id=job.run_id,
        task=job.task,
        identity=job.identity,
        archive=job.archive,
        manifest=job.manifest,
        trained=job.ends_with.model,
        scratch_root=job.scratch_root,
        threads=1,
        workflow_dir=job.workflow_dir,
        metrics_out=run / "metrics.json",
        record_out=run / "predict_record.json",
        curves_out=run / "curves.png",
        predictions_out=None,
        tracking="tensorboard",
        train_record=job.ends_with.record,
        figures_out=run / "figures",
        predicted_in_training=job.prediction_at_end,
    )


def test_the_train_jobs_prediction_is_moved_into_place_by_the_predict_job(job):
    train_job(job)
    made = json.loads((job.prediction_at_end / "made.json").read_text())
    (piece,) = json.loads(job.ends_with.record.read_text())["pieces"]
    assert (made["piece"], made["piece_started_at"]) == (piece["piece"], piece["started_at"])
    assert "predict" in piece["timings_seconds"], "its time is the piece's"
    predict = its_predict_job(job)
    predict_job(predict)
    assert json.loads(predict.metrics_out.read_text()) == {"accuracy": 0.5}
    record = json.loads(predict.record_out.read_text())
    assert record["predicted_in_training"]["piece"] == 1 and "stage" not in record["timings_seconds"]
    assert not job.prediction_at_end.exists(), "moved out, and its folder gone"
    assert predict.curves_out.is_file()


def test_a_predict_job_that_moves_the_prediction_into_place_loads_no_pandas_nor_torch(job):
    """Moving the train job's prediction into place and drawing the curves is all that job does:
    it imports neither pandas (0.5 s of CPU, once spent on a log line) nor torch nor transformers."""
    train_job(job)
    predict = its_predict_job(job)
    code = "import pickle, sys\nfrom scratchflow.jobs import predict_job\n"
    code += "predict_job(pickle.loads(sys.stdin.buffer.read()))\nprint(*sorted(sys.modules))"
    scripts = str(REPO / "scripts")
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [scripts, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(predict), capture_output=True, env=environ)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert json.loads(predict.metrics_out.read_text()) == {"accuracy": 0.5}
    loaded = {name.split(".")[0] for name in done.stdout.decode().split()}
    assert not loaded & {"pandas", "torch", "transformers"}


def test_a_prediction_made_for_another_piece_is_not_taken_the_predict_job_predicts(job):
    train_job(job)
    made_file = job.prediction_at_end / "made.json"
    made_file.write_text(json.dumps({**json.loads(made_file.read_text()), "piece": 7}))
    (job.prediction_at_end / "metrics.json").write_text('{"accuracy": 0.01}')
    predict = its_predict_job(job)
    predict_job(predict)
    assert json.loads(predict.metrics_out.read_text()) == {"accuracy": 0.5}, "predicted again, from the model"
    record = json.loads(predict.record_out.read_text())
    assert "predicted_in_training" not in record and {"stage", "predict"} <= set(record["timings_seconds"])
    assert not job.prediction_at_end.exists(), "the stale one removed"


def test_a_failing_predict_leaves_the_run_trained_and_its_predict_job_to_predict(job, monkeypatch, caplog):
    def failing(context):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(command, "predict", failing)
    with caplog.at_level(logging.WARNING):
        train_job(job)
    assert job.ends_with.record.is_file() and not job.prediction_at_end.exists()
    assert "predicting at the end of training failed (the predict job predicts): ZeroDivisionError" in caplog.text


@pytest.mark.parametrize("stop", [signal.SIGUSR1, signal.SIGTERM], ids=["the stop signal", "SIGTERM"])
def test_a_stop_while_predicting_cuts_the_prediction_short_not_the_run(job, monkeypatch, stop):
    """The stop signal (the wall time's warning) ends the prediction, the run is recorded; SIGTERM (the
    job is ending: its Snakemake removes the outputs) ends the piece paused, as a stop while syncing."""

    def slow(context):
        os.kill(os.getpid(), stop)
        time.sleep(30)

    monkeypatch.setattr(command, "predict", slow)
    started = time.monotonic()
    if stop == signal.SIGTERM:
        with pytest.raises(TrainingStopped, match="SIGTERM"):
            train_job(job)
    else:
        train_job(job)
        assert job.ends_with.record.is_file()
    assert time.monotonic() - started < 20 and not job.prediction_at_end.exists()


def test_no_prediction_with_a_stop_asked_before_or_too_little_time_left(tmp_path, monkeypatch):
    monkeypatch.setattr(prediction.slurm_job, "seconds_before_the_warning", lambda lead: 120.0)
    calls = []
    monkeypatch.setattr(prediction, "predict_into", lambda *given: calls.append(given))
    context = PredictContext("r1", {}, {}, {}, tmp_path, tmp_path, 1)
    prediction.predict_at_end(context, "command", None, None, tmp_path / "out", tmp_path, 300)
    (tmp_path / "stop-requested").write_text("SIGUSR1")
    monkeypatch.setattr(prediction.slurm_job, "seconds_before_the_warning", lambda lead: None)
    prediction.predict_at_end(context, "command", None, None, tmp_path / "out", tmp_path, None)
    assert calls == [] and not (tmp_path / "out").exists()


def test_a_prediction_is_taken_only_whole_and_made_by_the_piece_that_finished_the_run(tmp_path):
    record = {"pieces": [{"piece": 1, "started_at": "a"}, {"piece": 2, "started_at": "b"}]}
    folder = tmp_path / "predicted-in-training"
    folder.mkdir()
    (folder / "metrics.json").write_text("{}")
    made = {"files": ["metrics.json"], "piece": 2, "piece_started_at": "b"}
    (folder / "made.json").write_text(json.dumps(made))
    assert prediction.made_for(folder, record) == made
    assert prediction.made_for(folder, record, predictions=True) is None, "a task's predictions.csv missing"
    assert prediction.made_for(folder, {"pieces": [*record["pieces"], {"piece": 3, "started_at": "c"}]}) is None
    (folder / "made.json").write_text(json.dumps({**made, "files": ["metrics.json", "figures"]}))
    assert prediction.made_for(folder, record) is None, "a file it names is not there"
