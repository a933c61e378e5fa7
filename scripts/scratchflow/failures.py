"""Which failures of a training a retry cannot fix, and where in the lab's code they came from.

Snakemake retries every failed job alike (`--retries`), whatever the cause, and a job cannot ask not
to be. A piece whose task raised an error of its own (a bug, a shape error, a setting the task
refused) would fail the same way in every retry: each a queued GPU job of the train rule's wall
time. Such a piece ends its run `failed` instead, recorded as its outcome, and its job succeeds
(scratchflow.jobs.train_job); the next run of the workflow trains it again (rules/common.smk,
`after_failures`). What a retry can fix still fails the job, for Snakemake's retry: a signal (a
node lost, a time limit, an OOM kill), a filesystem error, scratchflow's own errors (a copy, the
space, a launcher of several processes that ended without a result), and a GPU out of memory the
first time (a retry may land on a larger GPU; twice in a row, it will not).

A lab program (the `command` task) is judged by its exit status, as nf-core's pipelines judge a
process's: killed by a signal, or 130 to 145 (128 + a signal's number, as a shell reports it) or
104, is retried; any other non-zero status is the program's own error.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Exit statuses a retry may fix (nf-core's pipeline template: `task.exitStatus in ((130..145) + 104)`).
RETRIED_EXIT_STATUSES = frozenset(range(130, 146)) | {104}
# What a retry may fix, by the error's class name (torch's own are not imported here).
RETRIED_ERRORS = ("OSError", "MemoryError")
OUT_OF_MEMORY = "OutOfMemoryError"  # torch.cuda's: a second one in a row is not retried
# A Python traceback's frame line, in a program's output.
FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)', re.MULTILINE)


@dataclass(frozen=True)
class FinalFailure:
    """A failure a retry cannot fix: its cause in one line, and the file and line of the lab's code
    it came from (None where no traceback says)."""

    cause: str
    where: str | None


def final_failure(error: BaseException, task_file: Path | None, last_outcome: str | None) -> FinalFailure | None:
    """`error`, raised while a piece trained, as a failure a retry cannot fix; None where a retry
    may (then the job fails, for Snakemake's retry). `task_file`: the task's own file, whose frames
    are where the error came from; `last_outcome`: how the run's piece before this one ended."""
    if not isinstance(error, Exception):  # a signal's SystemExit, a Ctrl-C
        return None
    name = type(error).__name__
    cause = f"{name}: {error}".splitlines()[0].removesuffix("; its last lines:")  # a program's tail follows
    exit_status = getattr(error, "exit_status", None)
    if exit_status is not None or getattr(error, "traceback_says_nothing", False):  # a lab program's
        if exit_status is not None and (exit_status < 0 or exit_status in RETRIED_EXIT_STATUSES):
            return None
        return FinalFailure(cause, where_in_output(str(error)))
    if type(error).__module__.startswith("scratchflow."):  # its own: a copy, the space, a launcher's end
        return None
    if any(kind.__name__ in RETRIED_ERRORS for kind in type(error).__mro__):
        return None
    if name == OUT_OF_MEMORY and not (last_outcome or "").startswith(f"{OUT_OF_MEMORY}:"):
        return None
    return FinalFailure(cause, where_in_traceback(error, task_file))


def where_in_traceback(error: BaseException, task_file: Path | None) -> str | None:
    """The innermost frame of `error`'s traceback in `task_file`, else the innermost outside
    scratchflow and the installed packages: "<file>:<line>"."""
    frames = traceback.extract_tb(error.__traceback__)
    own = Path(__file__).parent
    chosen = [frame for frame in frames if task_file and Path(frame.filename) == task_file] or [
        frame
        for frame in frames
        if not Path(frame.filename).is_relative_to(own)
        and "-packages" not in frame.filename
        and not frame.filename.startswith("<")
    ]
    return f"{chosen[-1].filename}:{chosen[-1].lineno}" if chosen else None


def where_in_output(output: str) -> str | None:
    """The innermost frame of the last Python traceback a program printed: "<file>:<line>"."""
    frames = [match for match in FRAME.finditer(output) if "-packages" not in match["file"]]
    return f"{frames[-1]['file']}:{frames[-1]['line']}" if frames else None


def failed_runs(records: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The runs whose record says they failed (in a way a retry cannot fix), with why and where."""
    return {run_id: record["failure"] for run_id, record in records.items() if record.get("failure")}


def failure_line(run_id: str, failure: dict[str, Any]) -> str:
    """A failed run in one line: its cause, where in the lab's code, and the piece and step."""
    where = f" at {failure['where']}" if failure.get("where") else ""
    step = f", step {failure['step']}" if failure.get("step") is not None else ""
    return f"run {run_id} failed: {failure['cause']}{where} (piece {failure['piece']}{step})"
