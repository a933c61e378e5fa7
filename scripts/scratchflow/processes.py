"""Running a child program inside a job: its output relayed into the job's log (the tail kept for an
error message), and Slurm's stop signals passed on to it with a grace period. Used by the command
task (the lab's own program) and by the multi-process launcher (torchrun)."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from scratchflow import signals
from scratchflow.signals import write_stop_file

log = logging.getLogger(__name__)

TAIL_LINES = 30


def child_pids(parent: int) -> list[int]:
    """The processes whose parent is `parent` (from /proc)."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # ended meanwhile
                continue
            # pid (comm) state ppid ...: comm may hold spaces and parentheses.
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                children.append(int(entry.name))
    return children


class StopForwarder:
    """While a program runs, the stop signals (`scratchflow.signals`) to the job go on to the
    program's process group, or, with `to_children`, to the program's own child processes only
    (torchrun's workers); the first one
    also creates `stop_file`, holding the signal's name (for code that cannot take signals, or had
    no handler yet)."""

    def __init__(self, stop_file: Path, to_children: bool = False):
        self.stop_file = stop_file
        self.to_children = to_children
        self.received: str | None = None
        self.received_at = 0.0
        self.program: int | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopForwarder]:
        with signals.listening(self._receive):
            yield self

    def _receive(self, number: int, _frame: Any) -> None:
        if self.received is None:
            self.received, self.received_at = signal.Signals(number).name, time.monotonic()
            write_stop_file(self.stop_file, self.received)
            log.warning("%s received: passing it on to the training processes, then pausing the run", self.received)
        self.pass_on(number)

    def stop_program(self, number: int) -> None:
        """Stop the program as a stop signal to the job would; its grace period counts from now."""
        self.received, self.received_at = signal.Signals(number).name, time.monotonic()
        write_stop_file(self.stop_file, self.received)
        self.pass_on(number)

    def pass_on(self, number: int) -> None:
        if self.program is None:
            return
        with contextlib.suppress(ProcessLookupError):
            if not self.to_children:
                os.killpg(self.program, number)
                return
            for child in child_pids(self.program):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, number)


def _relay_output(stream: Any, tail: collections.deque[str]) -> None:
    """The program's output into the job's log, keeping the last lines for an error message."""
    for line in iter(stream.readline, b""):
        text = line.decode(errors="replace")
        tail.append(text)
        sys.stdout.write(text)
        sys.stdout.flush()


def set_parent_death_signal() -> None:
    """This process gets SIGKILL when the process that started it dies (Linux's parent-death signal)."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _start_as_launcher() -> None:
    set_parent_death_signal()
    signals.ignore_stop_signal()


# A program run through this dies with the process that started it (its parent, here the job; `argv`
# after the parent's pid): it sets the parent-death signal, makes sure its parent did not die before
# that, then becomes the program (exec keeps the signal and the pid). A job killed outright (SIGKILL,
# which no handler sees; its own Ctrl-C path ends the group itself) leaves no program training on as
# an orphan. Not a preexec_fn: it runs where the job has threads (the checkpoint watcher).
DIES_WITH_ITS_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(128 + signal.SIGKILL)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def dying_with_this_process(argv: list[str]) -> list[str]:
    """`argv`, run so that it dies when this process does (DIES_WITH_ITS_PARENT)."""
    return [sys.executable, "-c", DIES_WITH_ITS_PARENT, str(os.getpid()), *argv]


def run_program(
    argv: list[str],
    env: dict[str, str],
    stop: StopForwarder,
    grace_seconds: float,
    alongside: contextlib.AbstractContextManager[Any] | None = None,
    stop_when: Callable[[], BaseException | None] | None = None,
) -> tuple[int, str]:
    """Run a program in its own process group to its end, or until a stop and its grace period;
    return its exit code and the tail of its output. `alongside` is entered while it runs (a
    checkpoint watcher); `stop_when`, asked as it runs, returns a reason to stop the program (the
    watcher's failed copy: a program that cannot have its checkpoints saved trains on for nothing).
    What the program leaves running in its group is killed at the end, however it ends (an
    exception here, a Ctrl-C's KeyboardInterrupt included); killed outright, this process takes the
    program with it (DIES_WITH_ITS_PARENT).

    The program starts with the default stop signals: the rule's Snakemake ignores the stop signal
    (`checkpointing.stop_signal`), which would stay ignored across exec, but here both it and TERM are
    caught while it starts, and a caught signal is reset to its default by exec. A launcher
    (torchrun), whose workers get the stop straight from `stop` (`to_children`; see
    scratchflow.distributed), instead starts with the stop signal ignored, and is killed when this
    process is: a launcher killed must not leave torchrun and its workers training on, out of
    Slurm's sight."""
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    with stop.installed(), alongside or contextlib.nullcontext():
        process = subprocess.Popen(
            argv if stop.to_children else dying_with_this_process(argv),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Not next to a thread (`alongside` starts one): preexec_fn is unsafe there.
            preexec_fn=_start_as_launcher if stop.to_children and alongside is None else None,
        )
        stop.program = process.pid
        try:
            if stop.received:  # a stop that came while the program started
                stop.pass_on(signal.Signals[stop.received])
            relay = threading.Thread(target=_relay_output, args=(process.stdout, tail), daemon=True)
            relay.start()
            code = _wait_for(process, argv[0], stop, grace_seconds, stop_when)
            relay.join(timeout=10)
        finally:
            # However this ends (a Ctrl-C's KeyboardInterrupt included): the program runs in a
            # session of its own, which no terminal signal reaches, so nothing of it may outlive this.
            stop.program = None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
    return code, "".join(tail)


def _wait_for(
    process: subprocess.Popen[bytes],
    name: str,
    stop: StopForwarder,
    grace_seconds: float,
    stop_when: Callable[[], BaseException | None] | None,
) -> int:
    """The program's exit code, once it ends: stopped where `stop_when` gives a reason, killed once a
    stop's grace period has passed."""
    while True:
        try:
            return process.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            reason = stop_when() if stop_when and not stop.received else None
            if reason is not None:
                log.warning("stopping %s with SIGTERM: %s", name, reason)
                stop.stop_program(signal.SIGTERM)
            if stop.received and time.monotonic() - stop.received_at > grace_seconds:
                log.warning("%s did not exit within %s s of %s: killing it", name, grace_seconds, stop.received)
                os.killpg(process.pid, signal.SIGKILL)
