"""Where every run of a grid stands, read from what the workflow writes and, where there is a Slurm,
from one `squeue`; nothing is changed. `scripts/status.py` prints it.

A run waits (nothing yet, or a job queued), trains (piece k, step s of N, speed, time left), is
paused between pieces (a stop signal saved its progress; the next job resumes), was interrupted
(its job was killed; the next resumes from its newest checkpoint), failed (with the log to read),
is trained and waits for or runs its prediction, or is finished (its test metric). In a halving
search, a run trains to its rung's epochs, waits for the rung's decision, and goes on, or is stopped
there (its validation metric); a line says which rung the search is in. Where the runs were trained
by different code or packages (scratchflow.provenance.differences), lines say which runs and how,
and the line that trains them again."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scratchflow.accounting import grid_cost
from scratchflow.checkpoints import CheckpointStore, checkpoint_damage, step_of
from scratchflow.failures import FAILED, unfinished_line, unfinished_runs
from scratchflow.lease import ACTIVE_SLURM_STATES, HOLDER_FILE, RunFolder, holder_is_alive
from scratchflow.ledger import (
    INTERRUPTED,
    KILLED,
    PAUSED,
    RUNNING,
    SUPERSEDED,
    PieceRecord,
    RunLedger,
    piece_time,
)
from scratchflow.piece_spec import Paused
from scratchflow.plan import RUNG_LOG, RUNG_RECORD, TRAINING_RULES, Plan
from scratchflow.provenance import difference_lines
from scratchflow.record import plain
from scratchflow.slurm_job import requeue_cause
from scratchflow.tracking import duration

STATES = ("finished", "stopped", "predicts", "trains", "paused", "interrupted", "waits", "diverged", "failed")
# The Slurm plugin's job comment: rule_<rule>_wildcards_<run_id>, or rule_<group> for a group job
# (cluster.pack_runs: the runs of a pack are found through the job id their checkpoints name).
COMMENT_PREFIX = "rule_"
FAILED_MARK = "ERROR scratchflow: job failed: "


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    state: str
    reason: str
    nodes: str

    def describe(self) -> str:
        if self.state == "PENDING":
            return f"Slurm job {self.job_id} pending ({self.reason})"
        return f"Slurm job {self.job_id} {self.state.lower()}" + (f" on {self.nodes}" if self.nodes else "")


@dataclass(frozen=True)
class RunStatus:
    run_id: str
    state: str  # one of STATES
    detail: str
    log: str | None = None  # the log to read, for a failure


def slurm_jobs(workdir: Path, squeue: str | None = None) -> dict[tuple[str, str], SlurmJob] | None:
    """This user's queued and running jobs of the workflow in `workdir` by (rule, run_id), a group
    job's by (group, job id), from one squeue; None without Slurm. Jobs are told apart by their
    working directory (the plugin submits each with -D <workdir>): the same grid run in another
    directory has the same run ids, and its jobs are not this one's."""
    squeue = squeue or shutil.which("squeue")
    if squeue is None:
        return None
    try:
        listed = subprocess.run(
            [squeue, "--me", "-h", "-o", "%i|%T|%r|%N|%Z|%k"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listed.returncode != 0:
        return None
    here = workdir.resolve()
    jobs = {}
    for line in listed.stdout.splitlines():
        job_id, state, reason, nodes, directory, comment = (line.split("|", 5) + [""] * 6)[:6]
        if not comment.startswith(COMMENT_PREFIX) or Path(directory).resolve() != here:
            continue
        rule, _, wildcards = comment.removeprefix(COMMENT_PREFIX).partition("_wildcards_")
        run_id = wildcards.split("_", 1)[0]  # a rung's job: <run_id>_<rung>
        # A halving search's rung job trains its run, as a train job does.
        jobs["train" if rule in TRAINING_RULES else rule, run_id or job_id] = SlurmJob(job_id, state, reason, nodes)
    return jobs


def _read(path: Path) -> Any:
    """A JSON file the workflow writes whole, or None if it is not there (yet, or any more)."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _unfinished(record: Path) -> tuple[str, dict[str, Any]] | None:
    """How a run that failed or diverged ended, from its record; None for any other."""
    said = _read(record)
    return unfinished_runs({"": said}).get("") if said else None


def _newest_checkpoint(store: CheckpointStore) -> tuple[int, float] | None:
    """The step of the run's newest complete checkpoint and when it was saved (when its marker was
    written, last)."""
    newest = store.newest()
    if newest is None:
        return None
    try:
        return step_of(newest), (newest / store.marker).stat().st_mtime
    except FileNotFoundError:  # dropped meanwhile for a newer one
        return _newest_checkpoint(store)


def _failure(log: Path) -> str | None:
    """The failure message a job wrote last into its log, if its last attempt failed."""
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return None
    start = text.rfind(FAILED_MARK)
    if start < 0 or text.rfind("INFO scratchflow: run ") > start:
        return None
    return text[start + len(FAILED_MARK) :].split("\n", 1)[0]


def run_status(
    workdir: Path,
    run_id: str,
    plan: Plan,
    jobs: dict[tuple[str, str], SlurmJob] | None,
    active_jobs: dict[str, SlurmJob] | None,
    now: float,
    decisions: Sequence[dict[str, Any]] = (),
) -> RunStatus:
    paths = plan.paths(run_id)
    rung = len(decisions)  # a halving search's rung now (its last rung: the runs train to the end)
    if plan.halving:
        halving = _halving_status(workdir, run_id, plan, decisions)
        if halving is not None:
            return halving
    metrics = _read(workdir / paths.metrics)
    value = metrics.get(plan.metric) if metrics else None
    if value is None and (ended := _unfinished(workdir / paths.record)):
        outcome, said = ended
        line = unfinished_line(run_id, outcome, said).removeprefix(f"run {run_id} {outcome}").lstrip(": ")
        then = "after a fix, the same command trains it again" if outcome == FAILED else "a result, ranked last"
        return RunStatus(run_id, outcome, f"{line}; not retried: {then}", paths.train_log)
    if metrics is not None:
        shown = f"{value:.4f}" if isinstance(value, int | float) else "not reported"
        return RunStatus(run_id, "finished", f"test {plan.metric} {shown}")
    if (workdir / paths.record).is_file():
        job = (jobs or {}).get(("predict", run_id))
        if job is not None:
            return RunStatus(run_id, "predicts", f"trained; prediction: {job.describe()}")
        failure = _failure(workdir / paths.predict_log)
        if failure:
            return RunStatus(run_id, "failed", f"prediction failed: {failure}", paths.predict_log)
        return RunStatus(run_id, "predicts", "trained; prediction waits")
    store = CheckpointStore(RunFolder(workdir / paths.checkpoints), plan.checkpoint_marker)
    last_rung = plan.last_rung  # None: a grid, no rungs
    in_rung = last_rung is not None and rung < last_rung
    log = RUNG_LOG.format(run_id=run_id, rung=rung) if in_rung else paths.train_log
    status = _training_status(store, run_id, log, (jobs or {}).get(("train", run_id)), active_jobs, now)
    if in_rung:
        return RunStatus(run_id, status.state, f"rung {rung} ({plan.rungs[rung]} epochs): {status.detail}", status.log)
    return status


def _halving_status(workdir: Path, run_id: str, plan: Plan, decisions: Sequence[dict[str, Any]]) -> RunStatus | None:
    """A halving search's run that a decision stopped, or that has trained its rung and waits for the
    rung's decision; None for one that trains (or, at the last rung, any other)."""
    for decision in decisions:
        diverged = decision.get("diverged", {}).get(run_id)
        if diverged and run_id not in decision["promoted"]:
            return RunStatus(
                run_id,
                "diverged",
                f"rung {decision['rung']} ({decision['epochs']} epochs): {diverged['cause']}; stopped",
            )
        if run_id in decision["values"] and run_id not in decision["promoted"]:
            went_on = sum(entry["promoted"] for entry in decision["ranking"])
            return RunStatus(
                run_id,
                "stopped",
                f"rung {decision['rung']} ({decision['epochs']} epochs): validation {decision['metric']} "
                f"{decision['values'][run_id]:.4f}; not among the {went_on} of {len(decision['ranking'])} "
                "settings that went on",
            )
    rung, last_rung = len(decisions), plan.last_rung
    in_rung = last_rung is not None and rung < last_rung
    record = _read(workdir / RUNG_RECORD.format(run_id=run_id, rung=rung)) if in_rung else None
    if record is None:
        return None
    shown = ", ".join(f"{name} {value:.4f}" for name, value in sorted(record["validation"].items()))
    return RunStatus(
        run_id,
        "waits",
        f"rung {rung} ({record['epochs']} epochs) trained, validation {shown}; waits for the rung's decision",
    )


def rung_line(plan: Plan, decisions: list[dict[str, Any]]) -> str | None:
    """Where a halving search stands: its rung now, its epochs, and how many runs it holds."""
    if not plan.halving:
        return None
    rung = len(decisions)
    alive = len(decisions[-1]["promoted"]) if decisions else len(plan.runs)
    return (
        f"successive halving: rung {rung} of rungs 0 to {plan.last_rung} ({plan.rungs[rung]} epochs), "
        f"{alive} of {len(plan.runs)} runs in it"
    )


def _training_status(
    store: CheckpointStore,
    run_id: str,
    train_log: str,
    job: SlurmJob | None,
    active_jobs: dict[str, SlurmJob] | None,
    now: float,
) -> RunStatus:
    pieces = _read_pieces(RunLedger(store.run_folder))
    if not pieces:
        queued = f" ({job.describe()})" if job else ""
        return RunStatus(run_id, "trains" if job and job.state == "RUNNING" else "waits", f"not started yet{queued}")
    status = _last_piece_status(store, run_id, pieces, train_log, job, active_jobs, now)
    superseded = [str(piece.piece) for piece in pieces if piece.outcome == SUPERSEDED]
    if superseded:
        note = f"; piece {', '.join(superseded)} superseded (trained on after a newer piece took the run over)"
        return RunStatus(run_id, status.state, status.detail + note, status.log)
    return status


def _last_piece_status(
    store: CheckpointStore,
    run_id: str,
    pieces: list[PieceRecord],
    train_log: str,
    job: SlurmJob | None,
    active_jobs: dict[str, SlurmJob] | None,
    now: float,
) -> RunStatus:
    folder = store.folder
    queued = f" ({job.describe()})" if job else ""
    last = pieces[-1]
    holder = _read(folder / HOLDER_FILE)
    if last.outcome == RUNNING and holder is not None and _holder_trains(holder, active_jobs):
        if job is None and active_jobs:  # a packed run: its pack's job
            packed = active_jobs.get(holder.get("slurm_job_id"))
            queued = f" ({packed.describe()})" if packed else ""
        return RunStatus(run_id, "trains", _training_detail(store, last, now) + queued)
    resumes = _resume_point(store)
    piece_log = last.log or train_log
    requeued = _requeued(last, job)
    if last.outcome == PAUSED and last.signal and last.phase:
        stopped = Paused(last.signal, last.phase, last.reached_step).stopped()
        return RunStatus(
            run_id, "paused", f"piece {last.piece} {stopped}{requeued}; the next piece {resumes}{queued}", piece_log
        )
    # A piece that Ctrl-C ended (on this machine its SIGINT reaches the jobs too), or one killed.
    if last.outcome in (RUNNING, INTERRUPTED) or last.outcome.startswith(KILLED):
        how = {RUNNING: KILLED, INTERRUPTED: "interrupted by Ctrl-C"}.get(last.outcome, last.outcome)
        return RunStatus(
            run_id,
            "interrupted",
            f"piece {last.piece} was {how}{requeued}; the next piece {resumes}{queued}",
            piece_log,
        )
    if job is not None:  # a retry of a failed piece is queued or starting
        return RunStatus(run_id, "waits", f"piece {last.piece} failed; a retry {resumes}{queued}", piece_log)
    return RunStatus(run_id, "failed", f"piece {last.piece}: {last.outcome.splitlines()[0][:300]}", piece_log)


def _read_pieces(ledger: RunLedger) -> list[PieceRecord]:
    """The run's pieces, or none while pieces.json is being replaced or is not there."""
    try:
        return ledger.pieces()
    except (FileNotFoundError, ValueError):
        return []


def _holder_trains(holder: dict[str, Any], active_jobs: dict[str, SlurmJob] | None) -> bool:
    """Whether the job (or process) holding the run trains now: alive, and not a job Slurm requeued
    and holds pending (its piece was killed: a preemption with no time to save, a lost node)."""
    job_id = holder.get("slurm_job_id")  # None: no Slurm
    held_by = None if job_id is None else (active_jobs or {}).get(job_id)
    return holder_is_alive(holder, active_jobs) and not (held_by and held_by.state == "PENDING")


def _requeued(piece: PieceRecord, job: SlurmJob | None) -> str:
    """ ", preempted: Slurm requeued its job" for a piece whose job Slurm requeued (its next piece
    names the cause; until it starts, the job is the piece's own, pending again: sacct is asked)."""
    cause = piece.requeued
    if cause is None and job is not None and job.state == "PENDING" and job.job_id == piece.slurm_job_id:
        cause = requeue_cause(job.job_id)
    return f" ({cause}: Slurm requeued its job)" if cause else ""


def _resume_point(store: CheckpointStore) -> str:
    """Where the next piece resumes, past any damaged checkpoint, each named with what is wrong (by
    the files' sizes: the status reads no checkpoint's bytes)."""
    damaged = [f"{name} is damaged: {what}" for name, what in store.damaged().items()]
    resumes = "starts again from step 0"
    for _step, checkpoint in reversed(store.complete()):
        damage = checkpoint_damage(checkpoint, read_bytes=False)
        if damage is None:
            resumes = f"resumes from {checkpoint.name}"
            break
        damaged.append(f"{checkpoint.name} is damaged: {damage}")
    return resumes + (f" ({'; '.join(damaged)})" if damaged else "")


def _training_detail(store: CheckpointStore, piece: PieceRecord, now: float) -> str:
    """Where a training piece is: its progress line (the Hugging Face tasks write one every 10 steps),
    or else what the run's folder shows (a command task's program reports no progress): how long the
    piece has run and its newest checkpoint."""
    where = f"piece {piece.piece}"
    progress = RunLedger(store.run_folder).progress()
    started = piece_time(piece.started_at)
    if progress is not None and progress["at"] >= started:
        step, total = progress["step"], progress.get("max_steps")
        parts = [f"{where}, step {step}" + (f" of {total} ({100 * step / total:.0f}%)" if total else "")]
        if "samples_per_second" in progress:
            parts.append(f"{progress['samples_per_second']:.1f} samples/s")
        if "seconds_left" in progress:
            parts.append(f"{duration(progress['seconds_left'])} left at that speed")
        return ", ".join(parts) + f" (as of {duration(now - progress['at'])} ago)"
    running = f"{where}, running for {duration(now - started)}"
    newest = _newest_checkpoint(store)
    if newest is None:
        return f"{running}; no checkpoint yet"
    step, saved_at = newest
    if saved_at >= started:
        return f"{running}; newest checkpoint-{step}, saved {duration(now - saved_at)} ago"
    return f"{running}; resumed from checkpoint-{step}, none saved since"


def current_status(
    workdir: Path, jobs: dict[tuple[str, str], SlurmJob] | None = None
) -> tuple[list[RunStatus], str | None]:
    """Every run's status as scripts/status.py tells it, with a halving search's rung line. `jobs`:
    Slurm's (slurm_jobs()); when not given, Slurm is asked once, and only when the grid's jobs go
    there (a Slurm client with no controller to answer waits 9 s)."""
    plan = Plan.read(workdir)
    decisions = plan.decisions(workdir)
    if jobs is None and plan.executor == "slurm":
        jobs = slurm_jobs(workdir)
    return _statuses(workdir, plan, jobs, decisions), rung_line(plan, decisions)


class _UnknownJobs(dict):
    """No squeue answered: every holder's job may still write (a failing controller is not asked again
    for each run)."""

    def __contains__(self, _job_id: object) -> bool:
        return True


def _statuses(
    workdir: Path, plan: Plan, jobs: dict[tuple[str, str], SlurmJob] | None, decisions: list[dict[str, Any]]
) -> list[RunStatus]:
    active = (
        _UnknownJobs()
        if jobs is None
        else {job.job_id: job for job in jobs.values() if job.state in ACTIVE_SLURM_STATES}
    )
    now = time.time()
    return [run_status(workdir, run_id, plan, jobs, active, now, decisions) for run_id in plan.runs]


def run_records(workdir: Path) -> dict[str, dict[str, Any]]:
    """The record.json of every trained run, by run id in grid order (read once, for the spend and
    for what trained the runs)."""
    plan = Plan.read(workdir)
    return {run_id: record for run_id in plan.runs if (record := _read(workdir / plan.paths(run_id).record))}


def spend_line(workdir: Path, statuses: list[RunStatus], records: dict[str, dict[str, Any]]) -> str | None:
    """What the grid has cost so far (scratchflow.accounting; one sacct where its jobs ran on Slurm),
    and about what the runs not finished will cost, at the finished runs' mean; None before any
    run started. `records`: run_records'."""
    plan = Plan.read(workdir)
    pieces, predictions = {}, {}
    for run_id in plan.runs:
        paths = plan.paths(run_id)
        record = records.get(run_id)
        # An unfinished run's pieces as the ledger reads them (a superseded one as it noted its end).
        listed = (
            record.get("pieces") if record else plain(_read_pieces(RunLedger(RunFolder(workdir / paths.checkpoints))))
        )
        for rung in range(plan.last_rung or 0) if not listed else ():  # a run a halving search stopped
            rung_record = _read(workdir / RUNG_RECORD.format(run_id=run_id, rung=rung))
            listed = rung_record.get("pieces") if rung_record else listed
        if listed:
            pieces[run_id] = listed
        predicted = _read(workdir / paths.predict_record)
        if predicted is not None:
            predictions[run_id] = (predicted, predicted.get("threads") or 1)
    if not pieces:
        return None
    cost = grid_cost(pieces, predictions, plan.last_rung if plan.halving else None)
    line = f"spent so far: {cost.line()}"
    finished = [status.run_id for status in statuses if status.state == "finished" and status.run_id in cost.by_run]
    # A diverged run is done (a result); a failed one trains again after its fix.
    rest = [status.run_id for status in statuses if status.state not in ("finished", "stopped", "diverged")]
    if not finished or not rest:
        return line
    unit = "gpu_hours" if cost.total.gpu_hours is not None and cost.site is not None else "cpu_hours"
    mean = sum(getattr(cost.by_run[run_id], unit) for run_id in finished) / len(finished)
    spent_on_rest = sum(getattr(cost.by_run[run_id], unit) for run_id in rest if run_id in cost.by_run)
    more = max(mean * len(rest) - spent_on_rest, 0.0)
    shown = "GPU-hours" if unit == "gpu_hours" else "CPU-hours"
    return f"{line}; the {len(rest)} run(s) not finished: about {more:.3g} {shown} more, at the finished runs' mean"


def summary_line(statuses: list[RunStatus]) -> str:
    counts = Counter(status.state for status in statuses)
    return f"{len(statuses)} run{'s' * (len(statuses) != 1)}: " + ", ".join(
        f"{counts[state]} {state}" for state in STATES if counts[state]
    )


def trained_by_lines(workdir: Path, records: dict[str, dict[str, Any]]) -> list[str]:
    """Where the trained runs differ in what trained them, with the line that trains the odd ones
    again (scratchflow.provenance.difference_lines)."""
    return difference_lines(records, workdir, Plan.read(workdir).halving)


def render(
    statuses: list[RunStatus], rung: str | None = None, spend: str | None = None, trained_by: Sequence[str] = ()
) -> str:
    lines = []
    for status in statuses:
        line = f"{status.run_id}  {status.state:<11}  {status.detail}"
        lines.append(line + (f"\n{'':12}  {'':<11}  log: {status.log}" if status.log else ""))
    return "\n".join(
        [*lines, *([rung] if rung else []), summary_line(statuses), *([spend] if spend else []), *trained_by]
    )
