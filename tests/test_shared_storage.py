"""A train job is light on a cluster's shared filesystem: whatever its task calls while it trains,
it writes there (a create, rename, unlink, mkdir or fsync: each a round trip to a metadata server
every user shares) at most once per 10 seconds of training, outside checkpoint publication. Counted
by strace (benchmarks/shared_storage.py), never timed."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import run_workflow, workflow_config, workflow_env, write_config
from scratchflow import dataset, lease, training_process
from scratchflow.checkpoints import CheckpointStore
from scratchflow.lease import RunFolder
from scratchflow.ledger import RunLedger
from scratchflow.piece_spec import PieceSpec
from scratchflow.schedule import CheckpointInterval
from scratchflow.training_process import TrainingProcess

REPO = Path(__file__).resolve().parents[1]


def piece_spec(tmp_path: Path, store: CheckpointStore, training: dict | None = None, tracking_dir: Path | None = None):
    """A command task's piece of run r1, its scratch in tmp_path, a checkpoint every 10 steps."""
    return PieceSpec(
        task="command",
        run_id="r1",
        identity={"dataset": {}, "training": training or {}},
        model=None,
        store=store,
        tracking_dir=tracking_dir or tmp_path / "tensorboard",
        tracking="tensorboard",
        checkpoint_every=CheckpointInterval(steps=10),
        stop_grace_seconds=1,
        threads=1,
        work_dir=tmp_path / "scratch",
    )


@pytest.mark.slow
def test_a_task_reporting_progress_every_step_writes_to_shared_storage_at_most_every_10_seconds(tmp_path):
    """The plain-PyTorch lab task reporting after each of its 0.4 ms steps: before, every report was
    a create, an fsync and a rename on shared storage (1,800 reports a 6-second training)."""
    figures = tmp_path / "figures.json"
    command = [sys.executable, str(REPO / "benchmarks" / "shared_storage.py"), "--tasks", "mlp"]
    command += ["--epochs", "300", "--json", str(figures)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    job = json.loads(figures.read_text())["mlp"]
    training = job.get("training", {})
    writes = sum(training.get(kind, 0) for kind in ("create", "rename", "unlink", "mkdir", "fsync"))
    assert job["training_seconds"] > 2, "too short a training to tell"
    assert writes <= 1 + job["training_seconds"] / 10, training
    assert job["checkpoints"] >= 1, "the checkpoint was published"


def test_progress_reaches_shared_storage_once_an_interval_and_as_a_failing_piece_ends(tmp_path, monkeypatch):
    """However often a task reports, its piece writes the latest report once every
    PROGRESS_WRITE_SECONDS; a piece whose task fails writes its last one, which the ledger reads
    to record how far it trained past its newest checkpoint."""
    clock = [1000.0]
    monkeypatch.setattr(training_process.time, "monotonic", lambda: clock[0])
    folder = tmp_path / "shared"
    spec = piece_spec(tmp_path, CheckpointStore(RunFolder(folder), "COMPLETE"))
    trainer = TrainingProcess(spec)
    written = []
    monkeypatch.setattr(
        RunLedger, "report_progress", lambda _ledger, progress, _publication=None: written.append(progress["step"])
    )
    for step in range(1, 101):  # a report a second for 100 seconds
        clock[0] += 1
        trainer.report_progress({"step": step})
    interval = int(training_process.PROGRESS_WRITE_SECONDS)
    assert written == list(range(interval, 101, interval))

    def failing_train(context):
        context.report_progress({"step": 101})
        raise RuntimeError("the loss is NaN")

    monkeypatch.setattr(trainer.task, "train", failing_train)
    (tmp_path / "scratch").mkdir()
    with pytest.raises(RuntimeError):
        trainer.train()
    assert written[-1] == 101


def test_a_step_reported_becomes_a_whole_report_with_the_speed_and_the_time_left(tmp_path, monkeypatch):
    """`context.report_progress(step, max_steps, loss)`: the piece works out the samples a second
    (the run's batch size, over this piece's reports) and the seconds left at that speed; a loss given
    as a tensor is kept as its number, which JSON holds."""
    import torch

    clock = [1000.0]
    monkeypatch.setattr(training_process.time, "monotonic", lambda: clock[0])
    spec = piece_spec(tmp_path, CheckpointStore(RunFolder(tmp_path / "shared"), "COMPLETE"), training={"batch_size": 4})
    trainer = TrainingProcess(spec)
    trainer.report_step(10, 100, None)
    assert {key: trainer.progress[key] for key in ("step", "max_steps")} == {"step": 10, "max_steps": 100}
    assert "seconds_left" not in trainer.progress, "one report: no speed yet"
    clock[0] += 10
    trainer.report_step(30, 100, torch.tensor(0.25))
    progress = dict(trainer.progress)
    assert progress.pop("at") == pytest.approx(time.time(), abs=5)
    assert progress == {"step": 30, "max_steps": 100, "loss": 0.25, "samples_per_second": 8.0, "seconds_left": 35.0}


def test_a_checkpoint_reaches_shared_storage_after_the_curves_to_its_step(tmp_path, monkeypatch):
    """The task's TensorBoard events are on scratch; a checkpoint on shared storage must find its
    curves there: a piece killed between the two would leave a gap that the next piece, resuming
    from that checkpoint (purge_step after it), never logs again."""
    run_folder = tmp_path / "results" / "runs" / "r1"
    spec = piece_spec(
        tmp_path,
        CheckpointStore(RunFolder(tmp_path / "checkpoints" / "r1", results=run_folder), "COMPLETE"),
        tracking_dir=run_folder / "tensorboard",
    )
    events = spec.local_tracking_dir / "events.out.tfevents.1.vm.1.0"
    events.parent.mkdir(parents=True)
    events.write_bytes(b"the curves to step 10")
    checkpoint = spec.checkpoint_dir / "checkpoint-10"
    checkpoint.mkdir(parents=True)
    (checkpoint / "COMPLETE").touch()
    published = spec.tracking_dir / events.name
    copied_whole = lease.copied_whole
    seen = []

    @contextlib.contextmanager
    def copied_noting_the_curves_as_it_is_renamed(source, destination):
        with copied_whole(source, destination):
            yield
            seen.append(published.read_bytes() if published.exists() else None)  # the rename comes next

    monkeypatch.setattr(lease, "copied_whole", copied_noting_the_curves_as_it_is_renamed)
    TrainingProcess(spec).checkpoint_saved(checkpoint)
    assert seen == [b"the curves to step 10"], "the curves were there when the checkpoint was renamed into place"
    assert (spec.store.folder / "checkpoint-10" / "COMPLETE").is_file()


def test_the_piece_keeps_the_newest_checkpoints_on_scratch_so_a_task_need_not_prune_its_own(tmp_path):
    """Each checkpoint the task saves is copied to shared storage, then the complete ones on scratch
    beyond checkpointing.keep are removed (one being written, without its marker, stays)."""
    spec = piece_spec(tmp_path, CheckpointStore(RunFolder(tmp_path / "shared"), "COMPLETE", keep=2))
    trainer = TrainingProcess(spec)
    for step in (10, 20, 30, 40):
        saved = spec.checkpoint_dir / f"checkpoint-{step}"
        saved.mkdir(parents=True)
        (saved / "state.pt").write_text(str(step))
        (saved / "COMPLETE").touch()
        trainer.checkpoint_saved(saved)
    (spec.checkpoint_dir / "checkpoint-50").mkdir()  # being written: no marker yet
    trainer.checkpoint_saved(spec.checkpoint_dir / "checkpoint-40")
    assert sorted(path.name for path in spec.checkpoint_dir.iterdir()) == [
        "checkpoint-30",
        "checkpoint-40",
        "checkpoint-50",
    ]
    assert spec.store.newest_step() == 40


@pytest.mark.slow
def test_a_jobs_own_snakemake_lists_no_file_of_the_dataset_that_the_workflows_start_listed(
    tmp_path, bbc_subset, tiny_model, monkeypatch
):
    """Every Slurm job runs Snakemake twice (the batch step's, the job step's), and each builds the
    archive job's parameters with its job's, the data's fingerprint among them: each listed and
    stat-ed every file of the dataset: 611 calls to the shared filesystem's metadata server for
    these 300 articles, in each (two a file), every job. The workflow's start
    lists the data once and hands its fingerprint on; a job's Snakemake handed another dataset's
    lists its own."""
    write_config(tmp_path, workflow_config(bbc_subset, tiny_model, tmp_path / "scratch", grid={"seed": [0]}))
    planned = run_workflow(tmp_path, "--dry-run")
    run_id = re.search(r"run_id=([0-9a-f]{10})", planned.stdout).group(1)
    config = yaml.safe_load((tmp_path / "config" / "config.yaml").read_text())
    sources = dataset.data_sources(config["dataset"])
    monkeypatch.delenv(dataset.DATA_FINGERPRINT_VARIABLE, raising=False)
    dataset.shared_fingerprint(sources, main_process=True)  # what the workflow's start hands on
    handed_on = os.environ[dataset.DATA_FINGERPRINT_VARIABLE]
    another = json.dumps(json.loads(handed_on) | {"locations": {"all": str(tmp_path)}})
    assert calls_under(bbc_subset, job_step_traced(tmp_path, run_id, handed_on)) == 0
    assert calls_under(bbc_subset, job_step_traced(tmp_path, run_id, another)) >= 300


def job_step_traced(workdir: Path, run_id: str, handed_on: str) -> list[str]:
    """The file calls (strace) of a train job's own Snakemake for `run_id`, as the Slurm plugin's
    job step starts it (planning only), with `handed_on` from the workflow's start."""
    traced = workdir / "job-step.strace"
    command = ["strace", "-f", "-qq", "-e", "trace=%file,getdents64", "-o", str(traced), sys.executable, "-m"]
    command += ["snakemake", "--snakefile", str(REPO / "Snakefile"), "--target-jobs", f"train:run_id={run_id}"]
    command += ["--allowed-rules", "train", "--mode", "remote", "--cores", "1", "--nolock", "--dry-run"]
    env = workflow_env() | {dataset.DATA_FINGERPRINT_VARIABLE: handed_on}
    result = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return traced.read_text().splitlines()


def calls_under(folder: Path, calls: list[str]) -> int:
    return sum(f'"{folder}/' in call for call in calls)
