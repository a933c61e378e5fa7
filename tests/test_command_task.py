"""The command task's own mechanics, with real processes and signals: the grace period after a
stop, metrics files that are not what the contract says, programs that cannot run, the tracking
environment a program gets."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import (
    command_config,
    job_process,
    processes_matching,
    start_workflow,
    wait_until_gone,
    wandb_offline_runs,
    write_config,
)
from scratchflow.checkpoints import CheckpointStore
from scratchflow.files import read_json
from scratchflow.lease import RunFolder
from scratchflow.piece_spec import PieceSpec
from scratchflow.plan import TENSORBOARD_FOLDER
from scratchflow.processes import StopForwarder, run_program
from scratchflow.schedule import CheckpointInterval
from scratchflow.tasks.command import (
    CommandFailed,
    check_settings,
    data_locations,
    interpreted_script,
    read_metrics,
)
from scratchflow.training_process import TrainingProcess

IGNORES_STOPS = """
import pathlib, signal, sys, time
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
print("ignoring", flush=True)
pathlib.Path(sys.argv[1]).touch()
time.sleep(60)
"""


# A program that trains silently: a step every 50 ms, a complete checkpoint every 20. Were it to print,
# its next write to a closed pipe would end it; silent, and making its folders as it needs them (as
# the HF Trainer does), only its process group's end does.
SILENT_PROGRAM = """
import os, pathlib, time
checkpoints = pathlib.Path(os.environ["SCRATCHFLOW_CHECKPOINT_DIR"])
step = 0
while True:
    time.sleep(0.05)
    step += 1
    if step % 20 == 0:
        (checkpoints / f"checkpoint-{step}").mkdir(parents=True)
        (checkpoints / f"checkpoint-{step}" / "COMPLETE").touch()
"""


def signal_once_ready(ready: Path, number: int) -> threading.Thread:
    """Sends `number` to this process (the job) once the program has made `ready`: no race with its start."""

    def wait_then_signal() -> None:
        while not ready.exists():
            time.sleep(0.05)
        os.kill(os.getpid(), number)

    thread = threading.Thread(target=wait_then_signal, daemon=True)
    thread.start()
    return thread


def test_a_program_that_ignores_the_stop_is_killed_after_the_grace_period(tmp_path):
    mirror = CheckpointStore(RunFolder(tmp_path / "shared"), "COMPLETE").mirroring(tmp_path / "local")
    stop = StopForwarder(tmp_path / "stop-requested")
    signal_once_ready(tmp_path / "ready", signal.SIGUSR1)
    started = time.monotonic()
    argv = [sys.executable, "-c", IGNORES_STOPS, str(tmp_path / "ready")]
    code, tail = run_program(argv, dict(os.environ), stop, grace_seconds=1, alongside=mirror.watching())
    assert code == -signal.SIGKILL
    assert time.monotonic() - started < 15, "killed after the grace period, not after its own sleep"
    assert stop.received == "SIGUSR1" and (tmp_path / "stop-requested").exists()
    assert "ignoring" in tail
    assert signal.getsignal(signal.SIGUSR1) is not stop._receive, "the job's own handlers are back"


@pytest.mark.parametrize(
    ("content", "complaint"),
    [
        (None, "metrics.json is missing"),
        ("accuracy: 0.9", "not valid JSON"),
        ("[0.9]", "must be a JSON object"),
        ('{"accuracy": "high"}', "not a finite number"),
        ('{"loss": NaN}', "not a finite number"),
    ],
)
def test_metrics_that_break_the_contract_name_the_file(tmp_path, content, complaint):
    if content is not None:
        (tmp_path / "metrics.json").write_text(content)
    with pytest.raises(CommandFailed, match=complaint):
        read_metrics(tmp_path / "metrics.json")


def test_a_program_file_that_is_not_executable_is_refused(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("echo hi\n")
    with pytest.raises(ValueError, match="not executable; chmod"):
        check_settings({"training": {"command": [str(script)]}})
    script.chmod(0o755)
    check_settings({"training": {"command": [str(script)]}})


@pytest.mark.parametrize(
    ("argv", "script"),
    [
        (["python", "train.py", "--lr", "1"], "train.py"),
        (["/usr/bin/python3.11", "-u", "-W", "ignore", "src/train.py"], "src/train.py"),
        (["python", "-m", "lab.train"], None),
        (["python", "-c", "print(1)"], None),
        (["bash", "-eu", "run.sh"], "run.sh"),
        (["Rscript", "fit.R"], "fit.R"),
        (["julia", "--threads", "4", "train.jl"], "train.jl"),
        (["torchrun", "train.py"], None),  # not an interpreter: its arguments are its own
        (["python"], None),
    ],
)
def test_the_script_a_known_interpreter_runs_is_found_in_its_arguments(argv, script):
    assert interpreted_script(argv) == script


LOGS_TO_WANDB = """
import json, os, wandb
run = wandb.init()  # no arguments: the job's environment says offline, where, and which run
for step in (10, 20):
    run.log({"train/loss": 1 / step}, step=step)
run.finish()
with open(os.path.join(os.environ["SCRATCHFLOW_OUTPUT_DIR"], "metrics.json"), "w") as metrics:
    json.dump({"accuracy": 0.5}, metrics)
"""


def test_with_tracking_wandb_a_bare_wandb_init_logs_the_piece_offline_beside_its_tensorboard(tmp_path):
    run_folder = tmp_path / "results" / "runs" / "r1"
    (tmp_path / "data").mkdir()
    (tmp_path / "scratch").mkdir()
    spec = PieceSpec(
        task="command",
        run_id="r1",
        piece=3,
        data={"all": tmp_path / "data"},
        identity={"dataset": {}, "training": {"command": [sys.executable, "-c", LOGS_TO_WANDB]}},
        model=None,
        work_dir=tmp_path / "scratch",
        store=CheckpointStore(RunFolder(tmp_path / "checkpoints"), "COMPLETE"),
        tracking_dir=run_folder / TENSORBOARD_FOLDER,
        tracking="wandb",
        checkpoint_every=CheckpointInterval(steps=10),
        stop_grace_seconds=1,
        threads=1,
    )
    TrainingProcess(spec).train()
    (piece,) = wandb_offline_runs(run_folder).values()
    assert (piece["id"], piece["group"], piece["job_type"]) == ("r1-piece3", "r1", "train-piece")
    assert piece["history"] == {10: {"train/loss": 0.1}, 20: {"train/loss": 0.05}}


def test_the_data_dir_is_always_a_folder_and_a_one_file_dataset_is_named_beside_it(tmp_path):
    """A program that lists $SCRATCHFLOW_DATA_DIR must find a folder, whatever dataset.path is."""
    (tmp_path / "staged" / "train").mkdir(parents=True)
    (tmp_path / "staged" / "articles.csv").write_text("text,label\n")
    assert data_locations({"all": tmp_path / "staged" / "articles.csv"}) == (
        tmp_path / "staged",
        tmp_path / "staged" / "articles.csv",
    )
    assert data_locations({"all": tmp_path / "staged" / "train"}) == (tmp_path / "staged" / "train", None)
    splits = {"train": tmp_path / "staged" / "train", "test": tmp_path / "staged" / "test"}
    assert data_locations(splits) == (tmp_path / "staged", None)


@pytest.mark.parametrize("interruption", ["Ctrl-C", "SIGKILL to its job"])
def test_a_silent_programs_processes_end_with_its_piece_however_the_piece_is_interrupted(
    interruption, tmp_path, bbc_subset
):
    """A terminal's Ctrl-C reaches the workflow's process group, not the program's own session: the
    piece ends the program's group as it ends, and records where it was. A job killed outright
    (SIGKILL: no handler runs) takes its program with it (the parent-death signal). Either way
    nothing trains on as an orphan, holding its node's GPU and writing into a scratch folder nobody
    removes."""
    program = tmp_path / "silent_program.py"
    program.write_text(SILENT_PROGRAM)
    write_config(tmp_path, command_config(bbc_subset, tmp_path / "scratch", command=["python", str(program)]))
    workflow = start_workflow(tmp_path)
    try:
        deadline = time.monotonic() + 300
        while not list(tmp_path.glob("checkpoints/*/checkpoint-*/COMPLETE")):
            assert time.monotonic() < deadline and workflow.poll() is None, workflow.communicate()[0][-4000:]
            time.sleep(0.05)
        training = set(processes_matching(str(program)))
        assert training, "the program trains"
        job = job_process(tmp_path)
        if interruption == "Ctrl-C":
            os.killpg(workflow.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: its foreground group
            output = workflow.communicate(timeout=120)[0]
        else:
            os.kill(job, signal.SIGKILL)
            output = ""
        wait_until_gone(job, seconds=60)
        deadline = time.monotonic() + 10
        while training & set(processes_matching(str(program))) and time.monotonic() < deadline:
            time.sleep(0.1)
        outlived = training & set(processes_matching(str(program)))
    finally:
        with contextlib.suppress(ProcessLookupError):  # its group ended with it
            os.killpg(workflow.pid, signal.SIGKILL)
        for pid in processes_matching(str(program)):  # in a session of its own: nothing above reached it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert not outlived, f"the program outlived its piece:\n{output[-4000:]}"
    if interruption == "Ctrl-C":
        (record,) = read_json(next(tmp_path.glob("checkpoints/*/pieces.json")))
        assert record["outcome"] == "interrupted" and record["reached_step"] >= 20, record
