"""Faults a real cluster has, made on this machine. A stop signal that reaches a copying tool
mid-copy (Slurm signals every process of a job): the copy of a checkpoint to shared storage, the
sync back of the trained model, the staging of the data; whatever the tool's exit status, nothing
incomplete is put in place. A checkpoint damaged after it was published: the run resumes from the
one before. A full disk: a clear line, no blind retry. Each run ends with the weights of an
uninterrupted one.

To catch a copy in the middle, the tests slow the real tools down while a flag file exists: rsync
with its own --bwlimit, tar with its own --checkpoint-action=sleep. The signal then reaches the real
rsync or tar, as on a cluster."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    COMMAND_EXAMPLE,
    SLOWING,
    command_config,
    image_config,
    job_process,
    live_pieces,
    run_workflow,
    same_metrics,
    same_results,
    same_weights,
    slowed_tools,
    start_workflow,
    write_config,
)
from scratchflow.checkpoints import CheckpointStore, checkpoint_damage
from scratchflow.classification import TRAINER_CHECKPOINT_MARKER
from scratchflow.files import NoSpace
from scratchflow.lease import LEASE_FOLDER, RunFolder, take_term
from scratchflow.ledger import RunLedger, piece_records
from scratchflow.processes import StopForwarder, child_pids, run_program

pytestmark = pytest.mark.slow


def job_tree(pid: int) -> list[int]:
    """A process and all its descendants."""
    tree, pending = [], [pid]
    while pending:
        current = pending.pop()
        tree.append(current)
        pending.extend(child_pids(current))
    return tree


def signal_mid_copy(workflow: subprocess.Popen, workdir: Path, flag: Path, stop: signal.Signals) -> None:
    """Once the train job runs a slowed tool, send `stop` to every process of the job (as Slurm does),
    then let the tools run at full speed again."""
    job = job_process(workdir)
    deadline = time.monotonic() + 240
    while not any(option in _command_line(pid) for pid in job_tree(job) for option in SLOWING):
        assert workflow.poll() is None and time.monotonic() < deadline, (
            f"nothing slowed: {workflow.communicate()[0][-3000:]}"
        )
        time.sleep(0.02)
    time.sleep(0.5)  # into the copy
    for pid in job_tree(job):
        if _command_line(pid):  # not ended meanwhile
            os.kill(pid, stop)
    flag.unlink()


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def pieces_of(workdir: Path) -> list[dict]:
    (record,) = (workdir / "results" / "runs").glob("*/record.json")
    return json.loads(record.read_text())["pieces"]


def test_usr2_reaching_rsync_mid_checkpoint_copy_pauses_with_every_checkpoint_whole(
    tmp_path, bbc_subset, uninterrupted_command_run
):
    """stop_signal USR2, on which rsync exits 0 with its copy cut short (before, that partial copy
    was renamed into place as a checkpoint): the copy is made again, the command task's program saves
    and stops, every checkpoint on shared storage is whole, and the next run resumes to the weights
    of the uninterrupted run."""
    config = command_config(bbc_subset, tmp_path / "scratch")
    config["checkpointing"]["stop_signal"] = "USR2"
    write_config(tmp_path, config)
    env, flag = slowed_tools(tmp_path, "*checkpoints/*/.checkpoint-*")
    workflow = start_workflow(tmp_path, "--retries", "0", env=env)
    signal_mid_copy(workflow, tmp_path, flag, signal.SIGUSR2)
    output = workflow.communicate(timeout=300)[0]
    assert workflow.returncode != 0, "paused: the job ends unfinished"

    (paused,) = live_pieces(tmp_path)
    assert (paused["outcome"], paused["signal"], paused["phase"]) == ("paused", "SIGUSR2", "training"), output[-3000:]
    assert "is not whole" in (tmp_path / paused["log"]).read_text(), "USR2 should have cut a copy short"
    (run,) = (tmp_path / "checkpoints").iterdir()
    published = sorted(run.glob("checkpoint-*"), key=lambda checkpoint: int(checkpoint.name.split("-")[1]))
    saved_on_stop = sorted(os.listdir(published[-1]))  # copied after the signal: whole
    assert saved_on_stop == ["COMPLETE", "contents.json", "state.pt"]
    for checkpoint in published:
        assert sorted(os.listdir(checkpoint)) == saved_on_stop, f"{checkpoint.name} is not whole"
    assert not [name for name in os.listdir(run) if name.startswith(".")], "no partial copy left"

    run_workflow(tmp_path)
    first, second = pieces_of(tmp_path)
    assert second["resumed_from_step"] == first["reached_step"] > 0
    assert same_weights(tmp_path, uninterrupted_command_run, "model.pt")


def test_hup_reaching_rsync_mid_sync_back_finishes_the_run_with_its_whole_model(
    tmp_path, animal_images, tiny_resnet, uninterrupted_image_run
):
    """stop_signal HUP reaches the rsync that copies the trained image model back to results/ after
    training (rsync exits 20): the copy is made again, and the run ends in one piece with the model
    of the uninterrupted run."""
    config = image_config(animal_images, tiny_resnet, tmp_path / "scratch")
    config["checkpointing"] = {**config.get("checkpointing", {}), "stop_signal": "HUP"}
    write_config(tmp_path, config)
    env, flag = slowed_tools(tmp_path, "*results/runs/*/.model.partial*")
    workflow = start_workflow(tmp_path, env=env)
    signal_mid_copy(workflow, tmp_path, flag, signal.SIGHUP)
    output = workflow.communicate(timeout=300)[0]
    assert workflow.returncode == 0, output[-3000:]

    (piece,) = pieces_of(tmp_path)
    assert piece["outcome"] == "finished"
    (run,) = (tmp_path / "results" / "runs").iterdir()
    assert "is not whole" in (tmp_path / "logs" / "train" / f"{run.name}.log").read_text()
    assert same_results(tmp_path, uninterrupted_image_run) == [], "metrics, predictions and weights, byte for byte"


def test_term_reaching_tar_mid_staging_pauses_before_training_and_the_retry_trains_it_all(
    tmp_path, bbc_subset, uninterrupted_command_run
):
    """scancel's TERM while tar extracts the data into scratch: the piece pauses there, before
    training (no checkpoint yet, nothing half-staged left), and the retry trains the run from the start
    to the weights of the uninterrupted run."""
    write_config(tmp_path, command_config(bbc_subset, tmp_path / "scratch"))
    env, flag = slowed_tools(tmp_path, "staging")
    workflow = start_workflow(tmp_path, env=env)
    signal_mid_copy(workflow, tmp_path, flag, signal.SIGTERM)
    output = workflow.communicate(timeout=300)[0]
    assert workflow.returncode == 0, output[-3000:]

    first, second = pieces_of(tmp_path)
    assert (first["outcome"], first["signal"], first["phase"]) == ("paused", "SIGTERM", "staging"), first
    assert first["reached_step"] is None and second["resumed_from_step"] is None
    assert same_weights(tmp_path, uninterrupted_command_run, "model.pt")
    assert list((tmp_path / "scratch").iterdir()) == []


def test_a_damaged_newest_checkpoint_is_set_aside_and_the_run_resumes_from_the_one_before(
    tmp_path, animal_images, tiny_resnet, uninterrupted_image_run
):
    """An image run paused after its first checkpoint (two on shared storage: that one, and the one
    saved on the stop); then the newest one's weights lose half their bytes (a user's rm, a
    filesystem fault). The next piece finds it by its contents.json before loading it, sets it aside
    as checkpoint-<step>.damaged, resumes from the one before and ends with the uninterrupted run's
    metrics, predictions and weights."""
    write_config(tmp_path, image_config(animal_images, tiny_resnet, tmp_path / "scratch"))
    workflow = start_workflow(tmp_path, "--retries", "0")
    deadline = time.monotonic() + 240
    while not list(tmp_path.glob(f"checkpoints/*/checkpoint-*/{TRAINER_CHECKPOINT_MARKER}")):
        assert workflow.poll() is None and time.monotonic() < deadline, workflow.communicate()[0][-3000:]
        time.sleep(0.05)
    os.kill(job_process(tmp_path), signal.SIGUSR1)
    assert workflow.wait(timeout=300) != 0, "paused: the job ends unfinished"
    (run,) = (tmp_path / "checkpoints").iterdir()
    before, newest = sorted(run.glob("checkpoint-*"), key=lambda checkpoint: int(checkpoint.name.split("-")[1]))
    weights = newest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

    run_workflow(tmp_path)
    paused, resumed = pieces_of(tmp_path)
    assert resumed["resumed_from_step"] == int(before.name.split("-")[1]) < paused["reached_step"]
    (last_piece_log,) = (tmp_path / "logs" / "train").glob("??????????.log")
    assert f"{newest.name} is damaged (model.safetensors has" in last_piece_log.read_text()
    assert same_results(tmp_path, uninterrupted_image_run) == [], "metrics, predictions and weights, byte for byte"


def test_a_piece_whose_run_a_newer_piece_took_over_writes_nothing_more_and_the_run_ends_whole(
    tmp_path, bbc_subset, uninterrupted_command_run
):
    """Once its first checkpoint is on shared storage, a training's run is taken over by hand, as a
    Slurm job requeued while its node had stopped answering takes it (a newer term, from another
    node, which no lease can see alive) while the old piece trains on. At its next write the old
    piece stops: superseded, in one line, not failed; after the newer term began it wrote nothing to
    the run's shared folders (no checkpoint, ledger, progress, curves, model or record), and its end
    is noted beside its term, which the ledger reads. The next piece resumes from its last
    checkpoint and ends with the uninterrupted run's weights and metrics (a command task's program:
    its checkpoints copied by the job's watcher, which the fence stops)."""
    write_config(tmp_path, command_config(bbc_subset, tmp_path / "scratch"))
    workflow = start_workflow(tmp_path, "--retries", "0")
    deadline = time.monotonic() + 240
    while not list(tmp_path.glob("checkpoints/*/checkpoint-*/COMPLETE")):
        assert workflow.poll() is None and time.monotonic() < deadline, workflow.communicate()[0][-3000:]
        time.sleep(0.05)
    (run,) = (tmp_path / "checkpoints").iterdir()
    newer = take_term(run, {"host": "another-node", "pid": 4242, "slurm_job_id": "17"})
    took_over = (run / LEASE_FOLDER / f"{newer:06d}").stat().st_mtime
    output = workflow.communicate(timeout=300)[0]
    assert workflow.returncode != 0, output[-3000:]
    assert (
        "scratchflow: superseded, not failed: a newer piece holds the run (term 2: Slurm job 17 on another-node)"
        in output
    ), output[-3000:]
    (piece,) = RunLedger(RunFolder(run)).pieces()
    published = CheckpointStore(RunFolder(run), "COMPLETE").published()
    assert (piece.outcome, piece.term) == ("superseded", 1), piece
    assert piece.reached_step == int(published[-1]["checkpoint"].split("-")[1]) > 0
    assert all(line["term"] == 1 and line["at"] <= took_over for line in published)
    results = tmp_path / "results" / "runs" / run.name
    written_after = [
        path
        for path in (*run.rglob("*"), *results.rglob("*"))
        if path.is_file() and path.parent.name != LEASE_FOLDER and path.stat().st_mtime > took_over
    ]
    assert written_after == [], "the superseded piece wrote after the newer one held the run"
    assert not (results / "model").exists()

    run_workflow(tmp_path)  # the newer piece's part, here the next piece on this machine
    superseded, resumed = piece_records(pieces_of(tmp_path))
    assert superseded.outcome == "superseded" and resumed.resumed_from_step == piece.reached_step
    assert same_metrics(tmp_path, uninterrupted_command_run)
    assert same_weights(tmp_path, uninterrupted_command_run, "model.pt")


@contextlib.contextmanager
def small_filesystem(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `folder` (root only), unmounted after."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small filesystem")
def test_a_full_checkpoint_filesystem_fails_with_the_figures_and_its_retry_fails_at_once(
    tmp_path, bbc_subset, uninterrupted_command_run
):
    """checkpoints/ on a 5 MB filesystem, a command task's checkpoint 3 MB: the second checkpoint's
    copy finds the disk full. The job fails with one line naming the folder, the filesystem, the bytes
    needed and free; its partial is removed; the newest complete checkpoint stays whole. The retry
    sees there is no room for a checkpoint and fails at once, without training. With space freed,
    the same command resumes and ends with the uninterrupted run's weights."""
    config = command_config(bbc_subset, tmp_path / "scratch")
    # The program held at its first checkpoint until the watcher, looking every second, has copied
    # it: the program trains its 810 steps in about 4 s, and left alone it could end before a first
    # look, its final checkpoint the one copy, which fits. The next copy, at the latest the final
    # one's, finds no room (the program keeps its newest two: a copy may find its checkpoint pruned).
    config["checkpointing"].update(every_steps=100, keep=10)
    write_config(tmp_path, config)
    with small_filesystem(tmp_path / "checkpoints", "5m") as checkpoints:
        workflow = start_workflow(tmp_path)
        held_until_copied(workflow, tmp_path, checkpoints)
        stdout = workflow.communicate(timeout=600)[0]
        assert workflow.returncode != 0
        assert f"no space in {checkpoints}/" in stdout and f"(tmpfs at {checkpoints}) has" in stdout, stdout[-3000:]
        (run,) = checkpoints.iterdir()
        full, retry = json.loads((run / "pieces.json").read_text())
        for piece in (full, retry):
            assert piece["outcome"].startswith(f"NoSpace: no space in {run} for "), piece
        assert re.search(r"it needs 3\.\d MB and its filesystem .* has [0-2]\.\d MB free", full["outcome"]), full[
            "outcome"
        ]
        assert not retry["timings_seconds"], "the retry failed at once, before staging or training"
        (kept,) = run.glob("checkpoint-*")
        assert checkpoint_damage(kept) is None, "the newest complete checkpoint stays whole"
        assert not [name for name in os.listdir(run) if name.startswith(".")], "no partial left"

        subprocess.run(["mount", "-o", "remount,size=64m", str(checkpoints)], check=True)
        run_workflow(tmp_path)
        last = pieces_of(tmp_path)[-1]
        assert last["resumed_from_step"] == int(kept.name.split("-")[1]) and last["outcome"] == "finished"
        assert same_weights(tmp_path, uninterrupted_command_run, "model.pt")


def held_until_copied(workflow: subprocess.Popen, workdir: Path, checkpoints: Path) -> None:
    """SIGSTOP the train job's program once its first checkpoint is whole on scratch, SIGCONT once
    the job's watcher has copied a checkpoint to `checkpoints`."""
    deadline = time.monotonic() + 240
    job = job_process(workdir)
    while not list(workdir.glob("scratch/**/checkpoint-*/COMPLETE")):
        assert workflow.poll() is None and time.monotonic() < deadline, workflow.communicate()[0][-3000:]
        time.sleep(0.01)
    (program,) = (pid for pid in job_tree(job) if str(COMMAND_EXAMPLE) in _command_line(pid))
    os.kill(program, signal.SIGSTOP)
    try:
        while not list(checkpoints.glob("*/checkpoint-*/COMPLETE")):
            assert workflow.poll() is None and time.monotonic() < deadline, workflow.communicate()[0][-3000:]
            time.sleep(0.05)
    finally:
        os.kill(program, signal.SIGCONT)


SAVES_THEN_TRAINS_ON = """
import os, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # saved, and stopped
checkpoint = pathlib.Path(sys.argv[1]) / "checkpoint-10"
checkpoint.mkdir(parents=True)
(checkpoint / "state.pt").write_bytes(os.urandom(2_000_000))
(checkpoint / "COMPLETE").touch()
print("saved, training on", flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small filesystem")
def test_a_command_tasks_program_is_stopped_once_its_checkpoint_cannot_be_saved(tmp_path):
    """The checkpoint folder's filesystem too small for the program's checkpoint: the watcher's
    copy fails, and the program gets SIGTERM at once instead of training on to its end for nothing
    (the fault test above uses a program too quick to show it); the copy's error is the job's."""
    with small_filesystem(tmp_path / "shared", "1m") as shared:
        mirroring = CheckpointStore(RunFolder(shared / "run"), "COMPLETE").mirroring(tmp_path / "local")
        stop = StopForwarder(tmp_path / "stop-requested")
        argv = [sys.executable, "-c", SAVES_THEN_TRAINS_ON, str(tmp_path / "local")]
        started = time.monotonic()
        with pytest.raises(NoSpace, match=r"for copying checkpoint-10 there: it needs 2\.0 MB"):
            run_program(
                argv, dict(os.environ), stop, 30, alongside=mirroring.watching(), stop_when=lambda: mirroring.failure
            )
        assert time.monotonic() - started < 30, "stopped, not left to sleep"
        assert stop.received == "SIGTERM"
