"""Every signal handler scratchflow sets, in one place.

A job is asked to stop by two signals: the stop signal, Slurm's warning before the wall time
(`--signal=<name>@<seconds>` in the profile; `checkpointing.stop_signal`, USR1 unless set), and
SIGTERM (scancel, preemption, the time limit itself). USR2 and HUP are the alternatives: NCCL 2.12
caught SIGUSR1 for itself (NVIDIA/nccl#704), which is why submitit moved to USR2 and then to HUP.
The job's train step names its stop signal in `SCRATCHFLOW_STOP_SIGNAL`, which its training
processes and a command task's program inherit. From the moment a train job has its scratch, any
stop leaves the stop file there (`leaving_stop_file`): a stop while the data is staged pauses the
piece before it trains, and one that comes before the trainer listens is read by it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

STOP_SIGNAL_VARIABLE = "SCRATCHFLOW_STOP_SIGNAL"
STOP_SIGNAL_NAMES = ("USR1", "USR2", "HUP")
DEFAULT_STOP_SIGNAL = "USR1"
STOP_FILE_NAME = "stop-requested"

Handler = Callable[[int, Any], None]


def stop_signal(environ: dict[str, str] | os._Environ = os.environ) -> signal.Signals:
    name = environ.get(STOP_SIGNAL_VARIABLE, DEFAULT_STOP_SIGNAL)
    if name not in STOP_SIGNAL_NAMES:
        raise ValueError(f"{STOP_SIGNAL_VARIABLE}={name!r}: the stop signal is one of {', '.join(STOP_SIGNAL_NAMES)}")
    return signal.Signals[f"SIG{name}"]


def stop_signals() -> tuple[signal.Signals, signal.Signals]:
    """The signals that ask a job to stop: the configured stop signal and SIGTERM."""
    return stop_signal(), signal.SIGTERM


def use_stop_signal(name: str) -> None:
    """Name the stop signal for this process and every process it starts."""
    os.environ[STOP_SIGNAL_VARIABLE] = name
    stop_signal()  # refuses a name that is not one


def ignore_stop_signal() -> None:
    """For a process the stop signal reaches but must not stop (Slurm signals every process of a job
    step: the step's own Snakemake, a node's launcher); its children inherit it ignored until they
    listen."""
    signal.signal(stop_signal(), signal.SIG_IGN)


@contextlib.contextmanager
def listening(handler: Handler) -> Iterator[None]:
    """`handler` receives the stop signals while the block runs; the earlier handlers come back after."""
    numbers = stop_signals()
    previous = {number: signal.getsignal(number) for number in numbers}
    for number in numbers:
        signal.signal(number, handler)
    try:
        yield
    finally:
        for number, earlier in previous.items():
            signal.signal(number, earlier)


def listen_by_stop_file(stop_file: Path) -> None:
    """Until a process has a handler of its own: a stop signal leaves `stop_file`, which the code that
    listens later reads as a request to stop."""
    for number in stop_signals():
        signal.signal(number, _stop_file_writer(stop_file))


@contextlib.contextmanager
def leaving_stop_file(stop_file: Path) -> Iterator[None]:
    """listen_by_stop_file while the block runs; the earlier handlers come back after."""
    with listening(_stop_file_writer(stop_file)):
        yield


def _stop_file_writer(stop_file: Path) -> Handler:
    return lambda number, _frame: write_stop_file(stop_file, signal.Signals(number).name)


def exit_on_sigterm() -> None:
    """Make SIGTERM (Snakemake or Slurm cancelling a job) unwind the stack like an exception, so that
    `finally` blocks remove scratch directories. SIGKILL cannot be caught; see remove_leftovers."""

    def raise_system_exit(number: int, _frame: Any) -> None:
        raise SystemExit(128 + number)

    signal.signal(signal.SIGTERM, raise_system_exit)


def write_stop_file(stop_file: Path, signal_name: str) -> None:
    """The stop file, holding the signal's name; never seen empty. Several processes of a job may
    write it at once (Slurm signals them all; the job and its node's launcher share a scratch
    folder): each through a partial file of its own."""
    partial = stop_file.with_name(f".{stop_file.name}.partial{os.getpid()}")
    partial.write_text(signal_name)
    os.replace(partial, stop_file)
