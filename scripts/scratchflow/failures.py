"""Which failures of a training a retry cannot fix, and where in the lab's code they came from.

Snakemake retries every failed job alike (`--retries`), whatever the cause, and a job cannot ask not
to be. A piece whose task raised an error of its own (a bug, a shape error, a setting the task
refused) would fail the same way in every retry: each a queued GPU job of the train rule's wall
time. Such a piece ends its run `failed` instead, recorded as its outcome, and its job succeeds
(scratchflow.jobs.train_job); the next run of the workflow trains it again (rules/common.smk,
`failure_to_train_again`). A training that diverged (`Diverged`) ends its run `diverged`, the same
way, but as a result: nothing trains it again. What a retry can fix still fails the job, for
Snakemake's retry: a signal (a node lost, a time limit, an OOM kill), a filesystem error,
scratchflow's own errors (a copy, the space, a launcher of several processes that ended without a
result), and a GPU out of memory the first time (a retry may land on a larger GPU; twice in a row, it will not).

A lab program (the `command` task) is judged by its exit status, as nf-core's pipelines judge a
process's: killed by a signal, or 130 to 145 (128 + a signal's number, as a shell reports it) or
104, is retried; any other non-zero status is the program's own error, but for a GPU out of memory
(its last line says so), retried once as a task's is.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scratchflow.software import describe_failure

# Exit statuses a retry may fix (nf-core's pipeline template: `task.exitStatus in ((130..145) + 104)`).
RETRIED_EXIT_STATUSES = frozenset(range(130, 146)) | {104}
# What a retry may fix, by the error's class name (torch's own are not imported here).
RETRIED_ERRORS = ("OSError", "MemoryError")
OUT_OF_MEMORY = "OutOfMemoryError"  # torch.cuda's: a second one in a row is not retried
# A Python traceback's frame line, in a program's output.
FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)', re.MULTILINE)


# How a run that did not finish ended: its record's `outcome` (else "finished").
FAILED = "failed"  # its task failed in a way a retry cannot fix; the same command trains it again
DIVERGED = "diverged"  # its loss became NaN or infinite: a result (that setting diverges), ranked last


class Diverged(Exception):
    """Raised by a task whose training diverged (its loss, or its weights, became NaN or infinite)
    at `step`, with no checkpoint saved after it: the run ends `diverged`, a result ranked last in
    the comparison and the worst of a halving search's rung, not retried. `detail`: what diverged."""

    def __init__(self, step: int | None, detail: str) -> None:
        super().__init__(f"at step {step}: {detail}")
        self.step, self.detail = step, detail


class ProtocolBroken(TypeError):
    """A task returned what the task protocol does not take (scratchflow.tasks): its own bug, which a
    retry cannot fix. `where`: the task's function that returned it, as file:line (in name)."""

    def __init__(self, message: str, where: str | None) -> None:
        super().__init__(message)
        self.where = where


@dataclass(frozen=True)
class FinalFailure:
    """A failure a retry cannot fix: its cause in one line, and the file and line of the lab's code
    it came from (None where no traceback says); or a divergence (`outcome` DIVERGED, at `step`)."""

    cause: str
    where: str | None
    outcome: str = FAILED
    step: int | None = None


def final_failure(error: BaseException, task_file: Path | None, last_outcome: str | None) -> FinalFailure | None:
    """`error`, raised while a piece trained, as a failure a retry cannot fix; None where a retry
    may (then the job fails, for Snakemake's retry). `task_file`: the task's own file, whose frames
    are where the error came from; `last_outcome`: how the run's piece before this one ended."""
    if not isinstance(error, Exception):  # a signal's SystemExit, a Ctrl-C
        return None
    if isinstance(error, Diverged):
        return FinalFailure(f"diverged {error}", None, DIVERGED, error.step)
    cause = describe_failure(error).splitlines()[0].removesuffix("; its last lines:")  # a program's tail follows
    if isinstance(error, ProtocolBroken):  # raised by scratchflow, about what the task's code returned
        return FinalFailure(cause, error.where)
    exit_status = getattr(error, "exit_status", None)
    if OUT_OF_MEMORY in cause and OUT_OF_MEMORY not in (last_outcome or ""):
        return None  # a retry may land on a larger GPU; twice in a row, it will not
    if exit_status is not None or getattr(error, "traceback_says_nothing", False):  # a lab program's
        if exit_status is not None and (exit_status < 0 or exit_status in RETRIED_EXIT_STATUSES):
            return None
        return FinalFailure(cause, where_in_output(str(error)))
    if type(error).__module__.startswith("scratchflow."):  # its own: a copy, the space, a launcher's end
        return None
    if any(kind.__name__ in RETRIED_ERRORS for kind in type(error).__mro__):
        return None
    return FinalFailure(cause, raised_at(error, task_file))


def raised_at(error: BaseException, module_file: Path | None) -> str | None:
    """Where `error` was raised, as file:line (in function): the innermost place in the task's module
    (`module_file`), else the innermost outside scratchflow and the installed packages, else the
    innermost of all; None where Python says nowhere."""
    frames = traceback.extract_tb(error.__traceback__)
    own = Path(__file__).parent
    inside = [frame for frame in frames if module_file and Path(frame.filename).resolve() == module_file.resolve()]
    labs = [
        frame
        for frame in frames
        if not Path(frame.filename).is_relative_to(own)
        and "-packages" not in frame.filename
        and not frame.filename.startswith("<")
    ]
    chosen = inside or labs or frames
    return f"{chosen[-1].filename}:{chosen[-1].lineno} (in {chosen[-1].name})" if chosen else None


def where_in_output(output: str) -> str | None:
    """Where the last Python traceback a program printed was raised, as `raised_at` says it: its
    innermost frame outside the installed packages."""
    frames = [match for match in FRAME.finditer(output) if "-packages" not in match["file"]]
    return f"{frames[-1]['file']}:{frames[-1]['line']} (in {frames[-1]['name']})" if frames else None


def unfinished_runs(records: dict[str, dict[str, Any]]) -> dict[str, tuple[str, dict[str, Any]]]:
    """The runs whose record says they failed or diverged: (outcome, its `failure` or `divergence`:
    cause, where, piece, step), diverged first, each in the order given."""
    ended = {
        outcome: {run_id: (outcome, record[key]) for run_id, record in records.items() if record.get(key)}
        for outcome, key in ((DIVERGED, "divergence"), (FAILED, "failure"))
    }
    return {**ended[DIVERGED], **ended[FAILED]}


def unfinished_line(run_id: str, outcome: str, said: dict[str, Any]) -> str:
    """A run that failed or diverged in one line: its cause, where in the lab's code, the piece, and
    the step a failed run's newest checkpoint is at (a diverged run's cause says its step)."""
    where = f" at {said['where']}" if said.get("where") else ""
    step = f", its newest checkpoint: step {said['step']}" if said.get("step") is not None and outcome == FAILED else ""
    cause = said["cause"] if outcome == FAILED else said["cause"].removeprefix(f"{DIVERGED} ")
    return f"run {run_id} {outcome}{':' if outcome == FAILED else ''} {cause}{where} (piece {said['piece']}{step})"
