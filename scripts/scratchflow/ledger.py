"""A run's ledger on shared storage: the pieces that trained it (`pieces.json`), each with how it
ended, and where its training is now (`progress.json`, for `make status`).

A piece's entry is a `PieceRecord`, written when the piece starts (a piece that is killed then says
where it started and where its log is) and again when it ends: finished, paused (the stop signal,
the phase it paused in, the step the next piece resumes from), or the error that ended it. An entry
still "running" whose job is gone was killed outright (SIGKILL, a node failure): the next piece
closes it. A piece that a newer one took the run from while it still trained (its job requeued
while its node had stopped answering) is `superseded`: it cannot write these files, the newer piece's
now, and notes its end beside its term (scratchflow.lease), which `pieces` reads into its entry; an
end an older term wrote after a newer term began is not trusted (read as superseded). The ledger
writes through the run's gate (scratchflow.lease.RunFolder), as every writer to the run's folders.
Entries written by scratchflow 0.1 and 0.2, which said a pause in a sentence, read as today's
(`piece_records`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from scratchflow.files import read_json
from scratchflow.lease import Publication, RunFolder, Superseded, superseded_ends, this_process
from scratchflow.record import plain, typed
from scratchflow.schedule import CheckpointCost
from scratchflow.slurm_job import requeue_cause

if TYPE_CHECKING:
    from scratchflow.checkpoints import CheckpointStore

log = logging.getLogger(__name__)

PIECES_FILE = "pieces.json"
PROGRESS_FILE = "progress.json"
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S%z"  # a piece's times, as its entry holds them
# A piece's outcome, besides the error that ended it and "killed by <signal>" (outcome_of).
RUNNING, FINISHED, PAUSED, KILLED, SUPERSEDED = "running", "finished", "paused", "killed", "superseded"
INTERRUPTED = "interrupted"  # by Ctrl-C on the machine it ran on
# What a paused piece was doing when the stop came.
Phase = Literal["staging", "training", "syncing"]


def piece_time(stamp: str) -> float:
    """A time of a piece's entry (TIME_FORMAT) as Unix time (time.time())."""
    return datetime.datetime.strptime(stamp, TIME_FORMAT).timestamp()


@dataclass
class PieceRecord:
    """One piece's entry in pieces.json (and in record.json's and a rung record's `pieces`)."""

    piece: int  # 1 for the first job that trains the run, 2 for the one that resumes it, ...
    started_at: str
    host: str | None = None  # where its job ran: the host, the process, the Slurm job
    pid: int | None = None
    slurm_job_id: str | None = None
    # RUNNING, FINISHED, PAUSED, KILLED, SUPERSEDED, INTERRUPTED, "killed by SIG...", the error; or
    # FAILED, DIVERGED (scratchflow.failures: the run ends so)
    outcome: str = RUNNING
    ended_at: str | None = None
    signal: str | None = None  # paused: the stop signal it heard
    phase: Phase | None = None  # paused: what it was doing when the stop came
    requeued: str | None = None  # its job was requeued by Slurm, and why ("preempted", sacct's cause)
    resumed_from_step: int | None = None  # the step of the checkpoint it restored
    reached_step: int | None = None  # the run's newest checkpoint when it ended: where the next resumes
    trained_to_step: int | None = None  # ended unfinished past reached_step: the steps in between are lost
    last_checkpoint_at: str | None = None  # when it last published a checkpoint
    log: str | None = None  # its own log, kept (the rule's log is the next piece's)
    nodes: int | None = None
    processes_per_node: int | None = None
    world_size: int | None = None
    ranks: dict[str, list[int]] | None = None  # which node ran which ranks
    threads: int | None = None
    rung: int | None = None  # a halving search's rung it trained
    timings_seconds: dict[str, float] = field(default_factory=dict)  # its phases, as they ended
    checkpoints: list[CheckpointCost] = field(default_factory=list)  # what each it published cost
    term: int | None = None  # its term of the run (scratchflow.lease; None: written before 0.4)
    # Checkpoints it did not resume from, by name, with why (damaged; published by an older term
    # after a newer one began): set aside as checkpoint-<step>.damaged or .stale.
    set_aside: dict[str, str] = field(default_factory=dict)
    cause: str | None = None  # failed, diverged: the error (what diverged), in one line
    where: str | None = None  # failed: the file and line of the lab's code it came from


def piece_records(listed: list[dict[str, Any]]) -> list[PieceRecord]:
    """The entries of a pieces.json, or of a record's `pieces`, whichever release wrote them."""
    return [typed(PieceRecord, _upgraded(entry)) for entry in listed]


# How scratchflow 0.1 and 0.2 said a pause: "TrainingStopped: stopped on <signal> at step ...".
_OLD_PAUSE = re.compile(r"TrainingStopped: stopped on (.+?)(?: at step| while | before | and paused|;|$)")


# How scratchflow 0.3 and before said a piece that Ctrl-C ended.
_OLD_CTRL_C = "KeyboardInterrupt: "


def _upgraded(entry: dict[str, Any]) -> dict[str, Any]:
    if "epoch" in entry:  # the term, as main called it between 0.3.0 and 0.4.0
        entry = {**{key: value for key, value in entry.items() if key != "epoch"}, "term": entry["epoch"]}
    if entry.get("outcome") == _OLD_CTRL_C:
        return {**entry, "outcome": INTERRUPTED}
    said = _OLD_PAUSE.match(entry.get("outcome", ""))
    if said is None:
        return entry
    outcome = entry["outcome"]
    phase = "staging" if "while staging" in outcome else "syncing" if "while copying" in outcome else "training"
    step = re.search(r" at step (\d+)", outcome)
    reached_step = entry.get("reached_step", int(step.group(1)) if step else None)
    return {**entry, "outcome": PAUSED, "signal": said.group(1), "phase": phase, "reached_step": reached_step}


def outcome_of(error: BaseException) -> str:
    """How a piece that `error` ended ended, in one line (the traceback and any output the error
    quotes are in the piece's log): "killed by SIGTERM" where a signal ended it before it could
    pause (signals.exit_on_sigterm: a node failure's cancellation, a scancel while it restored)."""
    if isinstance(error, KeyboardInterrupt):
        return INTERRUPTED
    if isinstance(error, Superseded):
        return SUPERSEDED
    code = error.code if isinstance(error, SystemExit) else None
    if isinstance(code, int) and code - 128 in {number.value for number in signal.Signals}:
        return f"{KILLED} by {signal.Signals(code - 128).name}"
    return f"{type(error).__name__}: {error}".splitlines()[0]


@dataclass(frozen=True)
class RunLedger:
    """The pieces of one run and its progress, in the run's shared folder (`run_folder`, through
    which it writes)."""

    run_folder: RunFolder

    @property
    def folder(self) -> Path:
        return self.run_folder.path

    def pieces(self) -> list[PieceRecord]:
        """The pieces that have trained this run so far, oldest first; a superseded one as it noted
        its end, or as superseded where an older term's end came after a newer term began."""
        listed = self._listed()
        terms = self.run_folder.terms_listed()
        if not any(entry.outcome in (RUNNING, KILLED) for entry in listed) and len(terms) < 2:
            return listed  # one term, and no piece left running: none was superseded
        ends, began = superseded_ends(self.folder), self.run_folder.terms_began(terms)
        return [self._as_trusted(entry, ends, began) for entry in listed]

    def _as_trusted(
        self, entry: PieceRecord, ends: dict[int, dict[str, Any]], began: dict[int, float | None]
    ) -> PieceRecord:
        if entry.term in ends:
            return _as_it_ended(entry, ends[entry.term])
        ended = piece_time(entry.ended_at) if entry.ended_at else None
        if entry.outcome not in (RUNNING, KILLED) and self.run_folder.published_too_late(entry.term, ended, began):
            return dataclasses.replace(entry, outcome=SUPERSEDED)  # its end came after a newer term began
        return entry

    def _listed(self) -> list[PieceRecord]:
        """pieces.json's entries as written."""
        path = self.folder / PIECES_FILE
        return piece_records(read_json(path)) if path.is_file() else []

    def record(self, entry: PieceRecord) -> None:
        """Add or update (same number) a piece's entry."""
        self._write([listed for listed in self._listed() if listed.piece != entry.piece] + [entry])

    def _write(self, entries: list[PieceRecord]) -> None:
        self.run_folder.write_json(plain(entries), self.folder / PIECES_FILE)

    @contextlib.contextmanager
    def piece(self, store: CheckpointStore, limit: PiecesLimit | None = None) -> Iterator[PieceRecord]:
        """This job's entry, recorded now and when the block ends: the caller sets what it knows
        (its shape, its log, a pause); an error that ends the block is its outcome, and an entry
        left running is finished. Called while holding the run: an earlier piece still listed as
        running was killed (no job holds the run), and is closed as such. A piece superseded
        meanwhile notes its end beside its term instead (RunFolder.note_superseded). Refused, with
        nothing recorded, where the run (its rung) has trained in as many pieces as `limit` allows."""
        listed = self.pieces()  # read once: the run is held, no other job writes it now
        close_killed_pieces(listed, store)
        note_requeue(listed)
        if limit is not None:
            limit.check(self.folder.name, listed, store.newest_step())
        started = time.time()
        entry = PieceRecord(
            piece=len(listed) + 1,
            **this_process(),
            started_at=time.strftime(TIME_FORMAT, time.localtime(started)),
            term=self.run_folder.term,
        )
        self._write([*listed, entry])
        try:
            yield entry
        except BaseException as error:
            entry.outcome = outcome_of(error)
            raise
        finally:
            if entry.outcome == RUNNING:
                entry.outcome = FINISHED
            try:
                if entry.outcome != SUPERSEDED:
                    self._end(entry, store, started)
            finally:
                if entry.outcome == SUPERSEDED:
                    self._end_superseded(entry, store)

    def _end(self, entry: PieceRecord, store: CheckpointStore, started: float) -> None:
        """The entry of a piece that held the run to its end, recorded (or, superseded as it was
        recorded, noted as such and raised)."""
        if entry.outcome != FINISHED:
            if entry.reached_step is None:
                entry.reached_step = store.newest_step()
            trained_to = self._progress_step_since(started)
            if trained_to is not None and trained_to > (entry.reached_step or 0):
                entry.trained_to_step = trained_to  # the steps since its newest checkpoint are lost
        entry.ended_at = time.strftime(TIME_FORMAT)
        entry.last_checkpoint_at = _stamp(store.last_published_since(started))
        try:
            self.record(entry)
        except Superseded:
            entry.outcome = SUPERSEDED
            raise

    def _end_superseded(self, entry: PieceRecord, store: CheckpointStore) -> None:
        """A superseded piece's end, noted beside its term: where its own last checkpoint is (what it
        trained after is lost, like the rest of its time once the newer piece held the run)."""
        assert self.run_folder.term is not None, "only a held folder's piece is superseded"
        last = store.last_published_by(self.run_folder.term)
        entry.reached_step = last[0] if last else entry.resumed_from_step
        entry.last_checkpoint_at = _stamp(last[1]) if last else None
        entry.trained_to_step = None  # progress.json is the newer piece's now
        entry.ended_at = time.strftime(TIME_FORMAT)
        self.run_folder.note_superseded(plain(entry))
        log.warning("piece %s superseded: it wrote nothing to the run after a newer piece held it", entry.piece)

    def report_progress(self, progress: dict[str, Any], publication: Publication | None = None) -> None:
        """Where the training is now (step, max_steps, loss, samples_per_second, seconds_left, at),
        with the term that reports it, in `publication` (with a checkpoint's), or else in one of its
        own: whole, not durable (a crash loses a report the next one replaces)."""
        if publication is None:
            with self.run_folder.publishing() as own:
                self.report_progress(progress, own)
            return
        publication.write_json({**progress, "term": self.run_folder.term}, self.folder / PROGRESS_FILE, durable=False)

    def progress(self) -> dict[str, Any] | None:
        """The last progress reported, if any (not one an older term wrote after a newer term began)."""
        try:
            progress = read_json(self.folder / PROGRESS_FILE)
        except (FileNotFoundError, ValueError):
            return None
        return None if self.run_folder.published_too_late(progress.get("term"), progress.get("at")) else progress

    def _progress_step_since(self, started: float) -> int | None:
        """The step this piece's trainer last reported, if it reported since `started`."""
        progress = self.progress()
        return progress.get("step") if progress and progress.get("at", 0) >= started else None


class PiecesLimitReached(Exception):
    """A run that has trained in the most pieces cluster.max_pieces allows, unfinished."""


@dataclass(frozen=True)
class PiecesLimit:
    """cluster.max_pieces, for the pieces of one rung (None: a run outside a halving search)."""

    max_pieces: int
    rung: int | None = None

    def pieces_so_far(self, listed: list[PieceRecord]) -> int:
        return sum(entry.rung == self.rung for entry in listed)

    def check(self, run_id: str, listed: list[PieceRecord], newest_step: int | None) -> None:
        """Refuse the next piece where the run (its rung) has trained in `max_pieces` already."""
        if self.pieces_so_far(listed) < self.max_pieces:
            return
        where = f"checkpoint-{newest_step}" if newest_step is not None else "its first step (no checkpoint)"
        of = f"rung {self.rung} of run {run_id}" if self.rung is not None else f"run {run_id}"
        raise PiecesLimitReached(
            f"{of} has trained in {self.pieces_so_far(listed)} pieces (jobs), the most config key "
            f"cluster.max_pieces ({self.max_pieces}) allows, and is not finished: raise cluster.max_pieces and "
            f"run the same command again to train on from {where}"
        )


def note_requeue(listed: list[PieceRecord]) -> None:
    """This job is one that Slurm requeued (a preemption, a lost node): the earlier piece ran in the
    same job, and sacct lists an earlier run of it. That piece gets `requeued`, the cause
    (`requeue_cause`). (SLURM_RESTART_COUNT would say so too, but no job step gets it.)"""
    job_id = os.environ.get("SLURM_JOB_ID")
    if not (listed and job_id):
        return
    earlier = listed[-1]
    if earlier.slurm_job_id != job_id or earlier.requeued is not None:
        return
    cause = requeue_cause(job_id)
    if cause:
        earlier.requeued = cause
        log.info("piece %s ended when Slurm requeued job %s: %s", earlier.piece, job_id, cause)


def close_killed_pieces(listed: list[PieceRecord], store: CheckpointStore) -> None:
    """Pieces listed as running whose job is gone (killed outright: SIGKILL, a node failure)
    become `killed`, with the step of the newest checkpoint, the last one they could write."""
    for entry in listed:
        if entry.outcome != RUNNING:
            continue
        entry.outcome, entry.reached_step, entry.ended_at = KILLED, store.newest_step(), None
        entry.last_checkpoint_at = _stamp(store.last_published_since(piece_time(entry.started_at)))
        job = f"Slurm job {entry.slurm_job_id}" if entry.slurm_job_id else f"pid {entry.pid}"
        log.warning(
            "piece %s (%s on %s) was killed; the run goes on from step %s",
            *(entry.piece, job, entry.host, entry.reached_step),
        )


def _as_it_ended(listed: PieceRecord, noted: dict[str, Any]) -> PieceRecord:
    """A superseded piece's entry as it noted its end, with what the next piece learned of it (why
    its job was requeued)."""
    ended = typed(PieceRecord, noted)
    return dataclasses.replace(ended, requeued=ended.requeued or listed.requeued)


def _stamp(at: float | None) -> str | None:
    return time.strftime(TIME_FORMAT, time.localtime(at)) if at is not None else None
