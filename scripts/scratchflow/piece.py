"""A training piece: one job's share of a run's training, and every duty around a task's `train`.

`run_piece` owns a train job's sequence, in order: it holds the run (scratchflow.lease: its term,
and the gate, `RunFolder`, through which every write to the run's folders goes) and its entry in the run's ledger
(scratchflow.ledger), a scratch folder and the stop file; verifies the newest
checkpoint (scratchflow.checkpoints); prepares the node (`prepare_node`: stage the data in, then
restore the newest checkpoint; each node's launcher calls it too); trains; and syncs the trained
model back. It returns how the piece ended, a `PieceOutcome`: `Trained`, or `Paused` (the stop
signal, the phase it came in, the step the next piece resumes from), recorded as such in the
ledger; the job ends a paused piece with `finished`, whose TrainingStopped gives the job its exit
status (scratchflow.jobs.job_context). A piece that finds a newer one holding the run raises
`Superseded` from the gate as it was about to write, wherever it is, and ends.

A task only trains (scratchflow.tasks, the `Task` protocol); `Piece` does the rest, in each process
that runs the task (the job's own with one training process, or each one torchrun starts;
scratchflow.distributed launches them from the same spec):

- **the stop signal** (`checkpointing.stop_signal`, and SIGTERM) is heard here while the task trains;
  the task asks `TrainContext.stop_requested()` at the end of each step, and with several processes
  they all learn there whether any was asked, so all stop at the same step;
- **when to checkpoint**: the task asks `TrainContext.checkpoint_due(step)` at the end of each step;
  the piece's `CheckpointSchedule` (scratchflow.schedule) answers by the minutes of training since
  the last, bounded so that checkpoints cost at most 1 % of training, and times each one;
- **mirroring**: after the task saves a checkpoint on scratch it calls
  `TrainContext.checkpoint_saved`, and the piece copies it whole to shared storage (with several
  processes: each node's part into a hidden assembly folder, published by rank 0 once every
  process's part is there);
- **deciding the outcome**: a task that returns None stopped on request: the piece is `Paused` at
  the checkpoint the next piece resumes from;
- **the step figures**: what a task returns gets `global_steps` (the step of the newest checkpoint
  it saved, or of the one restored) and `resumed_from_step` (the restored one's, or None): the task
  reports neither.

`PieceSpec` is the one description of a piece, passed as it is from the job to each node's launcher
and each training process (as JSON, `launch.json`, through scratchflow.record's `plain`/`typed`);
a task sees it through its `TrainContext`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scratchflow import signals, slurm_job, tracking
from scratchflow.checkpoints import CheckpointStore, newest_complete_checkpoint, step_of
from scratchflow.dataset import staged_sources
from scratchflow.files import HOST, OWNER_TAG, read_json, write_json_atomically
from scratchflow.lease import Publication, RunFolder, RunLease
from scratchflow.ledger import PAUSED, Phase, PieceRecord, RunLedger
from scratchflow.plan import TENSORBOARD_FOLDER
from scratchflow.processes import StopForwarder, run_program
from scratchflow.record import keep_piece_log, plain, typed
from scratchflow.schedule import CheckpointCost, CheckpointInterval, CheckpointSchedule
from scratchflow.signals import STOP_FILE_NAME
from scratchflow.staging import StagingError, scratch_directory, stage_in
from scratchflow.tasks import TrainContext, Trained, load_task
from scratchflow.timing import PhaseTimer

log = logging.getLogger(__name__)

# How often a piece writes its task's latest progress report to shared storage (a create and a
# rename each, round trips to a shared filesystem's metadata server), however often the task reports,
# and with each checkpoint: `make status` says how old the report is. A piece that fails writes its
# last one as it ends.
PROGRESS_WRITE_SECONDS = 60.0
CHECKPOINT_FOLDER = "checkpoints"  # in the piece's scratch folder: where the task saves its checkpoints
CHECKPOINT_COSTS_FILE = "checkpoint-costs.json"  # there too: what each checkpoint cost, for the piece's entry
# In a checkpoint of several processes, one per process, written once its part is: rank 0 publishes
# the checkpoint only when every process's is there.
PART_FILE = "part-{rank}"


def node_name(environ: Mapping[str, str] = os.environ) -> str:
    """This node's name as Slurm knows it (its host name may differ), or the host's outside Slurm."""
    return environ.get("SLURMD_NODENAME", HOST)


@dataclass(frozen=True)
class Shape:
    """How many processes train one run: `processes_per_node` on each of `nodes`."""

    nodes: int = 1
    processes_per_node: int = 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.processes_per_node


def ranks_by_node(shape: Shape, environ: Mapping[str, str] = os.environ) -> dict[str, list[int]]:
    """Which node runs which ranks: node i of the allocation (srun's node id, the order Slurm lists
    them) runs ranks i*P to i*P + P - 1. Asks Slurm for the nodes of a multi-node job."""
    if shape.nodes == 1:
        nodes = [node_name(environ)]
    else:

        def ask(*command: str) -> str:
            return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()

        listed = ask("squeue", "-h", "-j", environ["SLURM_JOB_ID"], "-o", "%N")
        nodes = ask("scontrol", "show", "hostnames", listed).split()
    per_node = shape.processes_per_node
    return {node: list(range(index * per_node, (index + 1) * per_node)) for index, node in enumerate(nodes)}


@dataclass(frozen=True)
class Staging:
    """Where a node stages the data into its own scratch from."""

    archive: Path
    manifest: Path
    scratch_root: str | None


@dataclass(frozen=True)
class Rank:
    """This process's place among the training processes (torchrun's environment)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Rank:
        return cls(
            rank=int(environ.get("RANK", 0)),
            local_rank=int(environ.get("LOCAL_RANK", 0)),
            world_size=int(environ.get("WORLD_SIZE", 1)),
        )


@dataclass(frozen=True)
class PieceSpec:
    """Everything a training piece needs, in the job, on every node and in every training process."""

    task: str
    run_id: str
    identity: dict[str, Any]  # what determines the run's result: {"dataset": ..., "training": ..., ...}
    model: Path | None  # the base model's cache on shared storage
    store: CheckpointStore  # the run's checkpoints on shared storage, in its gate (`run_folder`)
    tracking_dir: Path  # the run's TensorBoard folder on shared storage (scratchflow.tracking)
    tracking: str  # config key tracking: "tensorboard", or "wandb" (W&B offline as well)
    checkpoint_every: CheckpointInterval
    stop_grace_seconds: float
    threads: int  # CPU threads of the job on each node; of each process in a training process
    shape: Shape = Shape()
    # A halving search's rung: train until this many of the run's epochs are done, then stop with
    # a checkpoint and the validation metrics there.
    budget_epochs: int | None = None
    rung: int | None = None  # that rung's index
    staging: Staging | None = None  # where each node stages the data in from
    data_sha256: str | None = None  # the archive's: the run's folder is claimed for it and the identity
    model_out: Path | None = None  # where the trained model is synced back (None: a rung's piece)
    log: Path | None = None  # the rule's log, which the piece keeps a second name of
    assembly_tag: str = OWNER_TAG  # the job's, the same on every node (CheckpointStore.assembly)
    batch_node: str = field(default_factory=node_name)  # the job's node (Slurm's name), rank 0's
    # This node's, set by run_piece and prepare_node: the piece's number in the ledger, its scratch
    # folder, and the staged data there: {"all": path} or {"train": ..., ...}.
    piece: int = 0
    work_dir: Path = Path()
    data: dict[str, Path] = field(default_factory=dict)

    @property
    def dataset(self) -> dict[str, Any]:
        return self.identity["dataset"]

    @property
    def params(self) -> dict[str, Any]:
        """The run's training parameters."""
        return self.identity["training"]

    @property
    def run_folder(self) -> RunFolder:
        """The gate of every write to the run's folders (its term, where the piece holds the run)."""
        return self.store.run_folder

    @property
    def ledger(self) -> RunLedger:
        """The run's pieces and progress on shared storage."""
        return RunLedger(self.run_folder)

    @property
    def checkpoint_dir(self) -> Path:
        return self.work_dir / CHECKPOINT_FOLDER

    @property
    def local_tracking_dir(self) -> Path:
        """On scratch: where the task writes its curves (the piece publishes them to tracking_dir)."""
        return self.work_dir / TENSORBOARD_FOLDER

    def holding(self, run_folder: RunFolder) -> PieceSpec:
        """The spec of the piece that holds the run through `run_folder` (its term): its writes go
        only where no newer piece holds it."""
        return dataclasses.replace(self, store=dataclasses.replace(self.store, run_folder=run_folder))

    def write(self, path: Path) -> None:
        write_json_atomically(plain(self), path)

    @classmethod
    def read(cls, path: Path) -> PieceSpec:
        return typed(cls, read_json(path))


@dataclass(frozen=True)
class Paused:
    """A piece that stopped on request with its progress saved: the next piece resumes."""

    signal: str  # the stop signal it heard (SIGUSR1, SIGTERM, ...)
    phase: Phase  # what it was doing then
    reached_step: int | None  # the run's newest checkpoint then, where the next piece resumes (None: step 0)
    requeue: bool = False  # preempted, requeueable: the job requeues itself once it has ended
    log: Path | None = None  # the piece's own log (the rule's log is the next piece's)

    def stopped(self) -> str:
        """How it stopped, e.g. "stopped on SIGUSR1 at step 40 and paused"."""
        where = {
            "staging": " while staging the data in, before training",
            "syncing": " while copying the trained model back, after training",
            "training": f" at step {self.reached_step}" if self.reached_step is not None else "",
        }[self.phase]
        return f"stopped on {self.signal}{where} and paused"

    def line(self) -> str:
        """How it stopped, and what the next piece does."""
        if self.phase == "syncing":
            then = "the next piece resumes from the final checkpoint and only copies it back"
        elif self.reached_step is None:
            then = "no complete checkpoint was saved, so the next piece starts from the beginning"
        else:
            then = f"the next piece resumes from checkpoint-{self.reached_step}"
        return f"{self.stopped()}; {then}"


PieceOutcome = Trained | Paused


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


def run_piece(spec: PieceSpec) -> tuple[PieceOutcome, RunFolder]:
    """One job's piece of the run, in order: hold the run and its entry in the ledger, a scratch
    folder and the stop file (a stop before the piece listens, or after, is not lost); verify the
    newest checkpoint and that the next fits; prepare the node; train; sync the model back.
    What it returns is recorded in the ledger as how the piece ended; with it, the piece's gate to
    the run's folders, through which the job writes its records."""
    lease, timer = RunLease(spec.store.folder), PhaseTimer()
    lease.claim({"run_id": spec.run_id, **spec.identity, "data_sha256": spec.data_sha256})
    with lease.held(spec.tracking_dir.parent) as run_folder:
        return _held_piece(spec.holding(run_folder), timer), run_folder


def _held_piece(spec: PieceSpec, timer: PhaseTimer) -> PieceOutcome:
    from scratchflow import distributed  # which imports this module to launch the processes

    scratch_root = spec.staging.scratch_root if spec.staging else None
    with (
        spec.ledger.piece(spec.store) as entry,
        scratch_directory(scratch_root, f"train-{spec.run_id}", timer) as scratch,
        signals.leaving_stop_file(scratch / STOP_FILE_NAME),
    ):
        piece_log = _begin(spec, entry, scratch, timer)
        with timer.phase("stage"):
            node = prepare_node(dataclasses.replace(spec, piece=entry.piece), scratch)
        if isinstance(node, Paused):
            return _ended(entry, node, piece_log)
        spec.store.check_scratch_space(scratch, spec.store.newest(), spec.model)
        try:
            with timer.phase("train"):
                outcome = distributed.train(node)
        except Exception:
            spec.run_folder.look()  # a process superseded ends the others with it: said as such
            raise
        finally:
            entry.checkpoints = checkpoint_costs(scratch)
        if isinstance(outcome, Trained) and spec.model_out is not None:
            with timer.phase("sync"):
                spec.run_folder.publish_copy(outcome.output, spec.model_out)
            outcome = _terminated_while_syncing(scratch, outcome)
        return _ended(entry, outcome, piece_log)


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


def checkpoint_costs(scratch: Path) -> list[CheckpointCost]:
    """What each checkpoint the piece published cost, as its first process kept it on scratch."""
    costs = scratch / CHECKPOINT_COSTS_FILE
    return typed(list[CheckpointCost], read_json(costs)) if costs.is_file() else []


def prepare_node(spec: PieceSpec, scratch: Path) -> PieceSpec | Paused:
    """This node's scratch made ready for the piece: the data staged in (verified), then the run's
    newest checkpoint restored; the spec for this node. A stop that came meanwhile (it may have cut
    tar short) pauses the piece here, before it trains."""
    assert spec.staging is not None, "a piece that stages needs spec.staging"
    stop_file = scratch / STOP_FILE_NAME
    try:
        staged = stage_in(spec.staging.archive, spec.staging.manifest, scratch)
    except StagingError:
        if not stop_file.exists():
            raise
    if stop_file.exists():
        return Paused(stop_file.read_text() or "a stop request", "staging", spec.store.newest_step())
    node = dataclasses.replace(spec, work_dir=scratch, data=staged_sources(staged, spec.dataset))
    restore(node)
    return node


def restore(spec: PieceSpec) -> Path | None:
    """The run's newest complete checkpoint copied to this node's scratch (`spec.checkpoint_dir`),
    where the task resumes from it; None when the run starts from zero."""
    return spec.store.restore_newest_to(spec.checkpoint_dir, spec.shape.world_size)


def use_threads(threads: int) -> None:
    """torch's threads, where the task uses torch, set to the process's CPUs whatever the task does:
    its kernels' threads, and the pool it runs independent operations in (default: one per core
    of the whole node, which can be set only once, before it starts)."""
    torch = sys.modules.get("torch")
    if torch is None:  # a task that trains in another program, or without torch
        return
    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(threads)


def _terminated_while_syncing(scratch: Path, trained: Trained) -> PieceOutcome:
    """A SIGTERM that came while the trained model was copied back (a scancel, a preemption, the
    time limit) ends the job as a pause, once the copy is whole. The job is ending: on Slurm the job
    step's Snakemake had the SIGTERM too, and fails the job and removes its outputs whatever the
    rule's script does. Paused (and, when preempted, requeued), the next piece resumes from the final
    checkpoint, trains nothing, and records the run. The stop signal, a warning with time left, ends
    nothing: that run is recorded now."""
    stop_file = scratch / STOP_FILE_NAME
    if stop_file.exists() and stop_file.read_text() == signal.Signals.SIGTERM.name:
        return Paused(signal.Signals.SIGTERM.name, "syncing", trained.metrics.get("global_steps"))
    return trained


def _ended(entry: PieceRecord, outcome: PieceOutcome, piece_log: Path | None) -> PieceOutcome:
    """How the piece ended, in its entry; a pause names the piece's log and, where Slurm is
    preempting the job, requeues it."""
    if isinstance(outcome, Trained):
        entry.reached_step = outcome.metrics.get("global_steps")
        return outcome
    requeue = slurm_job.preempted_and_requeueable()
    entry.outcome, entry.signal, entry.phase, entry.reached_step = (
        PAUSED,
        outcome.signal,
        outcome.phase,
        outcome.reached_step,
    )
    if requeue:
        entry.requeued = "preempted"
    return dataclasses.replace(outcome, requeue=requeue, log=piece_log.resolve() if piece_log else None)


class Piece:
    """This process's part of a piece: it restores, listens, trains the task and decides the outcome;
    the task's `TrainContext` asks it for the rest (`stop_requested`, `checkpoint_saved`,
    `report_progress`, `run_program`)."""

    def __init__(self, spec: PieceSpec, me: Rank = Rank()) -> None:
        self.spec, self.me = spec, me
        self.task = load_task(spec.task)
        self.stop_file = spec.work_dir / STOP_FILE_NAME
        self.received: str | None = None  # the stop request's signal, once there is one
        self.resume_from: Path | None = None
        # Set when it trains: what copies each checkpoint the task saves to shared storage, and
        # the task's curves to that step before it (a piece killed just after a checkpoint appeared
        # would otherwise leave a gap in them, which the next piece, resuming there, never fills).
        self.mirroring = spec.store.mirroring(spec.checkpoint_dir)
        self.mirroring.with_each = self._with_each_checkpoint
        self.curves_published: dict[str, int] = {}  # the size of each events file as last published
        self.saved_step: int | None = None  # the newest checkpoint's step: restored, then each saved
        self.progress: dict[str, Any] | None = None  # the task's latest progress report, not yet written
        self.progress_written_at = time.monotonic()  # the piece's start: its first report after the interval
        self.progress_interval = PROGRESS_WRITE_SECONDS
        self.schedule = CheckpointSchedule(spec.checkpoint_every)
        self.mirroring.published = self._published

    def train(self) -> PieceOutcome:
        """Train the task from the checkpoint restored on this node (`restore`), listening for the
        stop signal: what it trained, with the piece's step figures among its metrics, or Paused
        when it stopped on request (at its newest checkpoint on shared storage)."""
        self.resume_from = newest_complete_checkpoint(self.spec.checkpoint_dir, self.task.CHECKPOINT_MARKER)
        use_threads(self.spec.threads)
        restored_step = self.saved_step = step_of(self.resume_from) if self.resume_from else None
        self.mirroring.mirrored_step = restored_step  # a restored checkpoint is on shared storage already
        self.spec.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        with signals.listening(self._receive):
            try:
                trained = self.task.train(TrainContext(self.spec, self.resume_from, self))
            except BaseException:
                # How far it trained: the ledger records what its failure lost (superseded, the
                # progress file is the newer piece's).
                with self.spec.run_folder.publishing_if_held() as publication:
                    if publication is not None:
                        self._write_progress(publication)
                raise
            finally:
                if self.me.rank == 0:  # superseded, the curves there are the newer piece's
                    with self.spec.run_folder.publishing() as publication:
                        self._publish_curves(publication, ending=True)
        if trained is not None:
            # The task saves a checkpoint after its last step: the newest one is where it ended.
            steps = {"global_steps": self.saved_step, "resumed_from_step": restored_step}
            return dataclasses.replace(trained, metrics={**trained.metrics, **steps})
        if self.received is None:
            raise RuntimeError(f"task {self.spec.task}'s train returned None, which means stopped, unasked")
        return Paused(self.received, "training", self.spec.store.newest_step())

    def _receive(self, number: int, _frame: Any) -> None:
        self.received = signal.Signals(number).name
        log.warning("%s received: saving a checkpoint after the current step, then stopping", self.received)

    # What the task's TrainContext asks for.

    def stop_requested(self) -> bool:
        self.schedule.step_ended()
        if self.received is None and self.stop_file.exists():  # left before this process listened
            self.received = self.stop_file.read_text() or "a stop request"
        if not self._agreed(self.received is not None):
            # The agreed answer, even if this process's own signal came after it had answered: a
            # process that stopped alone would wait forever in its checkpoint's barrier while the
            # others trained on. Its signal is counted at the next step's end.
            return False
        self.received = self.received or "a stop signal to another process"
        return True

    def checkpoint_due(self, step: int) -> bool:
        return self._agreed(self.schedule.due(step))

    def _agreed(self, mine: bool) -> bool:
        """True if any of the piece's processes says True. A signal may reach one process, or one
        node, or all at different moments, and each process has its own clock: every process asks
        at the same steps and all get the same answer, so all stop, or save, at the same step."""
        if self.me.world_size == 1:
            return mine
        import torch.distributed  # only a piece of several processes has them

        device = f"cuda:{torch.cuda.current_device()}" if torch.distributed.get_backend() == "nccl" else "cpu"
        anyone = torch.tensor([int(mine)], device=device)
        torch.distributed.all_reduce(anyone, op=torch.distributed.ReduceOp.MAX)
        return bool(anyone.item())

    def checkpoint_saved(self, checkpoint: Path) -> None:
        if self.me.world_size == 1:
            self.mirroring.mirror_newest()
            self.saved_step = self.mirroring.mirrored_step
            return
        import torch.distributed  # only a piece of several processes has them

        started = self.schedule.clock()
        assembly = self.spec.store.assembly(checkpoint.name, self.spec.assembly_tag)
        (checkpoint / PART_FILE.format(rank=self.me.rank)).touch()  # after the task's own part
        torch.distributed.barrier()  # every process has written its part
        if self.me.local_rank == 0:
            self.spec.store.assemble_part(checkpoint, assembly)  # a hidden folder of this job's
        torch.distributed.barrier()  # every node's part is on shared storage
        if self.me.rank == 0:
            parts = (PART_FILE.format(rank=rank) for rank in range(self.me.world_size))
            missing = [name for name in parts if not (assembly / name).is_file()]
            marker = self.task.CHECKPOINT_MARKER
            if missing or not (assembly / marker).is_file():
                raise RuntimeError(f"{assembly} lacks {', '.join(missing) or marker}: not published")
            self.spec.store.publish(assembly, self.me.world_size, self._with_each_checkpoint)
            log.info("checkpoint %s of %d processes saved to %s", checkpoint.name, self.me.world_size, assembly.parent)
        self.saved_step = step_of(checkpoint)
        self._published(self.saved_step, started)

    def _published(self, step: int, started: float) -> None:
        """A checkpoint is on shared storage: what it cost, kept on scratch for the piece's entry
        (by the first process, which published it); the next one's interval counts from here."""
        cost = self.schedule.published(step, started)
        if self.me.rank != 0:
            return
        write_json_atomically(plain(self.schedule.costs), self.spec.work_dir / CHECKPOINT_COSTS_FILE, durable=False)
        saving = f"saved in {cost.save_seconds:.2f} s, " if cost.save_seconds is not None else ""
        bound = (
            " (100 times this one's cost: checkpoints stay under 1 % of training)" if self.schedule.stretched else ""
        )
        log.info(
            "checkpoint-%d %spublished in %.2f s; the next after %.2f minutes of training%s",
            *(step, saving, cost.publish_seconds, self.schedule.seconds / 60, bound),
        )

    def report_progress(self, progress: dict[str, Any]) -> None:
        self.progress = progress
        if time.monotonic() - self.progress_written_at >= self.progress_interval:
            self._write_progress()

    def _with_each_checkpoint(self, publication: Publication) -> None:
        """What goes to shared storage with a checkpoint, in its publication, just before it: the
        curves to its step (a checkpoint there has its curves there), and the latest progress report."""
        self._publish_curves(publication)
        self._write_progress(publication)

    def _publish_curves(self, publication: Publication, ending: bool = False) -> None:
        """The curves the task wrote on scratch, to the run's folder (from the first process, which
        writes them): with each checkpoint, and as the piece ends, its W&B offline run too. Tracking
        never stops training: a failure to publish is said and left."""
        if self.me.rank != 0:
            return
        try:
            shared = self.spec.tracking_dir.parent
            tracking.publish_curves(self.spec.work_dir, shared, self.curves_published, publication, wandb_too=ending)
        except Exception as error:
            log.warning("the curves were not published to %s: %s", self.spec.tracking_dir, error)

    def _write_progress(self, publication: Publication | None = None) -> None:
        if self.progress is not None:
            self.spec.ledger.report_progress(self.progress, publication)
            self.progress, self.progress_written_at = None, time.monotonic()

    def run_program(self, argv: list[str], env: dict[str, str]) -> tuple[int, str]:
        stop = StopForwarder(self.stop_file)
        try:
            return run_program(
                argv,
                env,
                stop,
                self.spec.stop_grace_seconds,
                alongside=self.mirroring.watching(),
                stop_when=lambda: self.mirroring.failure,
            )
        finally:
            self.received = self.received or stop.received
            self.saved_step = self.mirroring.mirrored_step  # the program's checkpoints, as mirrored
