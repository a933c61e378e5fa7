"""A training piece: one job's share of a run's training, in order.

`run_piece` holds the run (scratchflow.lease: its term, and the gate, `RunFolder`, through which
every write to the run's folders goes) and its entry in the run's ledger (scratchflow.ledger), a
scratch folder and the stop file; verifies the newest checkpoint (scratchflow.checkpoints); prepares
the node (scratchflow.training_process.prepare_node: stage the data in, then restore the newest
checkpoint); trains (scratchflow.distributed.train: in this process, or in the processes it
launches); syncs the trained model back; and predicts the test split with it, in this process
(scratchflow.prediction). It returns how the piece ended, a `PieceOutcome`:
`Trained`, `Paused` (the stop signal, the phase it came in, the step the next piece resumes
from), or `FinalFailure` (the task failed in a way a retry cannot fix: scratchflow.failures),
recorded as such in the ledger; the job ends a paused piece with `finished`, whose
TrainingStopped gives the job its exit status (scratchflow.jobs.job_context). A piece that finds a
newer one holding the run raises `Superseded` from the gate as it was about to write, wherever it
is, and ends.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
from pathlib import Path

from scratchflow import distributed, prediction, signals, slurm_job
from scratchflow.checkpoints import step_of
from scratchflow.failures import DIVERGED, FinalFailure, final_failure
from scratchflow.files import read_json
from scratchflow.lease import RunFolder, RunLease
from scratchflow.ledger import PAUSED, PieceRecord
from scratchflow.piece_spec import Paused, PieceSpec, PredictionAtEnd, ranks_by_node
from scratchflow.record import keep_piece_log, typed
from scratchflow.schedule import CheckpointCost
from scratchflow.signals import STOP_FILE_NAME
from scratchflow.staging import scratch_directory
from scratchflow.tasks import PredictContext, Trained, loaded_file
from scratchflow.timing import PhaseTimer
from scratchflow.training_process import CHECKPOINT_COSTS_FILE, PieceOutcome, prepare_node

log = logging.getLogger(__name__)


class TrainingStopped(Exception):
    """A paused piece ending its job (`finished`): scratchflow.jobs.job_context gives the job its
    exit status from it (non-zero: Snakemake's retry resumes; preempted: the job requeues itself)."""

    def __init__(self, paused: Paused) -> None:
        super().__init__(paused.line())
        self.paused = paused


def finished(outcome: PieceOutcome) -> Trained:
    """What a finished piece trained; a paused piece ends its job here."""
    if isinstance(outcome, Paused):
        raise TrainingStopped(outcome)
    return outcome


def run_piece(spec: PieceSpec) -> tuple[PieceOutcome | FinalFailure, RunFolder]:
    """One job's piece of the run, in order: hold the run and its entry in the ledger, a scratch
    folder and the stop file (a stop before the piece listens, or after, is not lost); verify the
    newest checkpoint and that the next fits; prepare the node; train; sync the model back.
    What it returns is recorded in the ledger as how the piece ended; with it, the piece's gate to
    the run's folders, through which the job writes its records."""
    lease, timer = RunLease(spec.store.folder), PhaseTimer()
    lease.claim({"run_id": spec.run_id, **spec.identity, "data_sha256": spec.data_sha256})
    with lease.held(spec.tracking_dir.parent) as run_folder:
        return _held_piece(spec.holding(run_folder), timer), run_folder


def _held_piece(spec: PieceSpec, timer: PhaseTimer) -> PieceOutcome | FinalFailure:
    scratch_root = spec.staging.scratch_root if spec.staging else None
    with (
        spec.ledger.piece(spec.store, spec.pieces_limit) as entry,
        scratch_directory(scratch_root, f"train-{spec.run_id}", timer) as scratch,
        signals.leaving_stop_file(scratch / STOP_FILE_NAME),
    ):
        piece_log = _begin(spec, entry, scratch, timer)
        with timer.phase("stage"):
            node = prepare_node(dataclasses.replace(spec, piece=entry.piece), scratch)
        if isinstance(node, Paused):
            return _ended(spec, entry, node, piece_log)
        spec.store.check_scratch_space(scratch, spec.store.newest(), spec.model)
        outcome: PieceOutcome | FinalFailure
        try:
            with timer.phase("train"):
                outcome = distributed.train(node)
        except Exception as error:
            spec.run_folder.look()  # a process superseded ends the others with it: said as such
            outcome = _final_failure(spec, entry, error)
        finally:
            entry.checkpoints = checkpoint_costs(scratch)
        if isinstance(outcome, Trained) and spec.model_out is not None:
            with timer.phase("sync"):
                spec.run_folder.publish_copy(outcome.output, spec.model_out)
            if spec.prediction_at_end is not None:
                with timer.phase("predict"):
                    _predict_at_end(node, entry, outcome.output, spec.prediction_at_end)
            outcome = _terminated_while_syncing(scratch, outcome)
        return _ended(spec, entry, outcome, piece_log)


def _begin(spec: PieceSpec, entry: PieceRecord, scratch: Path, timer: PhaseTimer) -> Path | None:
    """The run's newest checkpoint verified (a damaged one set aside), the room for the next one
    checked, and the piece's entry completed with what it is: a killed piece then says where it
    started and where its log is. Returns the piece's own log."""
    newest, entry.set_aside = spec.store.newest_intact()
    spec.store.check_space_for_the_next(newest)
    piece_log = keep_piece_log(spec.log, entry.piece) if spec.log else None
    job_id = os.environ.get("SLURM_JOB_ID")
    log.info(
        "=== run %s, piece %d: %s on %s; this piece's log stays in %s ===",
        *(spec.run_id, entry.piece, f"Slurm job {job_id}" if job_id else f"process {os.getpid()} (no Slurm)"),
        *(entry.host, piece_log or "this file only"),
    )
    entry.nodes, entry.processes_per_node = spec.shape.nodes, spec.shape.processes_per_node
    entry.world_size, entry.ranks, entry.threads = spec.shape.world_size, ranks_by_node(spec.shape), spec.threads
    entry.log = str(piece_log) if piece_log else None
    entry.resumed_from_step = step_of(newest) if newest else None
    entry.rung = spec.rung  # what a search's rungs cost: scratchflow.accounting
    entry.timings_seconds = timer.seconds  # the timer's own dict: its phases as they end, saved with the entry
    spec.ledger.record(entry)
    log.info(
        "run %s, piece %d: scratch %s (training processes: %d node(s) x %d)",
        *(spec.run_id, entry.piece, scratch, spec.shape.nodes, spec.shape.processes_per_node),
    )
    return piece_log


def _final_failure(spec: PieceSpec, entry: PieceRecord, error: Exception) -> FinalFailure:
    """`error`, which ended the training, as a failure a retry cannot fix (its traceback in the
    log); raised again where a retry may fix it (scratchflow.failures)."""
    before = [piece.outcome for piece in spec.ledger.pieces() if piece.piece == entry.piece - 1]
    failed = final_failure(error, loaded_file(spec.task), before[0] if before else None)
    if failed is None:
        raise error
    told = getattr(error, "traceback_says_nothing", False)  # a lab program's: its output says it
    if failed.outcome == DIVERGED:
        log.warning("the training %s: the run ends diverged, with no checkpoint after it", failed.cause)
        return failed
    log.error("the task failed, and a retry cannot fix it: %s", failed.cause, exc_info=None if told else error)
    if told:
        log.error("%s", error)
    return failed


def checkpoint_costs(scratch: Path) -> list[CheckpointCost]:
    """What each checkpoint the piece published cost, as its first process kept it on scratch."""
    costs = scratch / CHECKPOINT_COSTS_FILE
    return typed(list[CheckpointCost], read_json(costs)) if costs.is_file() else []


def _predict_at_end(node: PieceSpec, entry: PieceRecord, model: Path, at_end: PredictionAtEnd) -> None:
    """The run's prediction, made here with the data and the model on scratch (scratchflow.prediction)."""
    context = PredictContext(
        run_id=node.run_id,
        data=node.data,
        dataset=node.dataset,
        params=node.params,
        trained=model,
        work_dir=node.work_dir,
        threads=node.threads,
    )
    prediction.predict_at_end(
        context, node.task, entry, node.run_folder, at_end.folder, at_end.workflow_dir, node.warning_lead_seconds
    )


def _terminated_while_syncing(scratch: Path, trained: Trained) -> PieceOutcome:
    """A SIGTERM that came while the trained model was copied back, or while it predicted (a
    scancel, a preemption, the time limit), ends the job as a pause, once the copy is whole. The
    job is ending: on Slurm the job step's Snakemake had the SIGTERM too, and fails the job and
    removes its outputs whatever the rule's script does. Paused (and, when preempted, requeued), the
    next piece resumes from the final checkpoint, trains nothing, and records the run. The stop
    signal, a warning with time left, ends nothing: that run is recorded now."""
    stop_file = scratch / STOP_FILE_NAME
    if stop_file.exists() and stop_file.read_text() == signal.Signals.SIGTERM.name:
        return Paused(signal.Signals.SIGTERM.name, "syncing", trained.metrics.get("global_steps"))
    return trained


def _ended(
    spec: PieceSpec, entry: PieceRecord, outcome: PieceOutcome | FinalFailure, piece_log: Path | None
) -> PieceOutcome | FinalFailure:
    """How the piece ended, in its entry; a pause names the piece's log and, where Slurm is
    preempting the job or the stop was its wall-time warning, requeues it (scratchflow.slurm_job),
    unless the next piece would be one more than cluster.max_pieces allows."""
    if isinstance(outcome, Trained):
        entry.reached_step = outcome.metrics.get("global_steps")
        return outcome
    if isinstance(outcome, FinalFailure):
        entry.outcome, entry.cause, entry.where = outcome.outcome, outcome.cause, outcome.where
        return outcome
    entry.outcome, entry.signal, entry.phase, entry.reached_step = (
        PAUSED,
        outcome.signal,
        outcome.phase,
        outcome.reached_step,
    )
    requeue = slurm_job.self_requeue_cause(spec.warning_lead_seconds)
    limit = spec.pieces_limit
    if requeue and limit and limit.pieces_so_far(spec.ledger.pieces()) >= limit.max_pieces:
        log.warning("not requeued (%s): the run has trained in cluster.max_pieces pieces", requeue)
        requeue = None
    entry.requeued = requeue or entry.requeued
    return dataclasses.replace(outcome, requeue=requeue, log=piece_log.resolve() if piece_log else None)
