"""The command task's own mechanics, with real processes and signals: the grace period after a
stop, metrics files that are not what the contract says, programs that cannot run."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest
from scratchflow.checkpoints import RunCheckpoints
from scratchflow.processes import StopForwarder, run_program
from scratchflow.tasks.command import CheckpointMirror, CommandFailed, check_settings, read_metrics

IGNORES_STOPS = """
import signal, time
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
print("ignoring", flush=True)
time.sleep(60)
"""


def test_a_program_that_ignores_the_stop_is_killed_after_the_grace_period(tmp_path):
    mirror = CheckpointMirror(tmp_path / "local", RunCheckpoints(tmp_path / "shared", "COMPLETE"))
    stop = StopForwarder(tmp_path / "stop-requested")
    threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGUSR1)).start()
    started = time.monotonic()
    argv = [sys.executable, "-c", IGNORES_STOPS]
    code, tail = run_program(argv, dict(os.environ), stop, grace_seconds=1, alongside=mirror)
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
