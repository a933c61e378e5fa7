"""What runs on each node and in each training process of a piece.

`prepare_node` makes a node's scratch ready (the data staged in, then the run's newest checkpoint
restored); the job calls it, and each node's launcher (scratchflow.distributed). A task only trains
(scratchflow.tasks, the `Task` protocol); `TrainingProcess` does the rest, in each process that
runs the task (the job's own with one training process, or each one torchrun starts):

- **the stop signal** (`checkpointing.stop_signal`, and SIGTERM) is heard here while the task trains;
  the task asks `TrainContext.stop_requested()` at the end of each step, and with several processes
  they all learn there whether any was asked, so all stop at the same step;
- **when to checkpoint**: the task asks `TrainContext.checkpoint_due(step)` at the end of each step;
  the process's `CheckpointSchedule` (scratchflow.schedule) answers by the minutes of training since
  the last, bounded so that checkpoints cost at most 1 % of training, and times each one;
- **mirroring**: after the task saves a checkpoint on scratch it calls
  `TrainContext.checkpoint_saved`, and the process copies it whole to shared storage, through the
  run's gate (scratchflow.lease.RunFolder) (with several processes: each node's part into a hidden
  assembly folder, published by rank 0 once every process's part is there);
- **deciding the outcome**: a task that returns None stopped on request: the piece is `Paused` at
  the checkpoint the next piece resumes from;
- **the step figures**: what a task returns gets `global_steps` (the step of the newest checkpoint
  it saved, or of the one restored) and `resumed_from_step` (the restored one's, or None): the task
  reports neither.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from scratchflow import signals, tracking
from scratchflow.checkpoints import complete_checkpoints, newest_complete_checkpoint, step_of
from scratchflow.dataset import staged_sources
from scratchflow.files import write_json_atomically
from scratchflow.lease import Publication
from scratchflow.piece_spec import Paused, PieceSpec, Rank
from scratchflow.processes import StopForwarder, run_program
from scratchflow.record import plain
from scratchflow.schedule import CheckpointSchedule
from scratchflow.signals import STOP_FILE_NAME
from scratchflow.staging import StagingError, stage_in
from scratchflow.tasks import TrainContext, Trained, check_trained, load_task

log = logging.getLogger(__name__)

# How often a piece writes its task's latest progress report to shared storage (a create and a
# rename each, round trips to a shared filesystem's metadata server), however often the task reports,
# and with each checkpoint: `make status` says how old the report is. A piece that fails writes its
# last one as it ends.
PROGRESS_WRITE_SECONDS = 60.0
CHECKPOINT_COSTS_FILE = "checkpoint-costs.json"  # there too: what each checkpoint cost, for the piece's entry
# In a checkpoint of several processes, one per process, written once its part is: rank 0 publishes
# the checkpoint only when every process's is there.
PART_FILE = "part-{rank}"


PieceOutcome = Trained | Paused


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


class TrainingProcess:
    """One process's part of a piece: it restores, listens, trains the task and decides the outcome;
    the task's `TrainContext` asks it for the rest (`stop_requested`, `checkpoint_saved`,
    `report_progress`, `run_program`)."""

    def __init__(self, spec: PieceSpec, me: Rank | None = None) -> None:
        self.spec, self.me = spec, me or Rank()
        self.task = load_task(spec.task)
        self.stop_file = spec.work_dir / STOP_FILE_NAME
        self.received: str | None = None  # the stop request's signal, once there is one
        self.resume_from: Path | None = None
        # Set when it trains: what copies each checkpoint the task saves to shared storage, and
        # the task's curves to that step before it (a piece killed just after a checkpoint appeared
        # would otherwise leave a gap in them, which the next piece, resuming there, never fills).
        self.mirroring = spec.store.mirroring(
            spec.checkpoint_dir, with_each=self._with_each_checkpoint, published=self._published
        )
        self.curves_published: dict[str, int] = {}  # the size of each events file as last published
        self.saved_step: int | None = None  # the newest checkpoint's step: restored, then each saved
        self.progress: dict[str, Any] | None = None  # the task's latest progress report, not yet written
        self.progress_written_at = time.monotonic()  # the piece's start: its first report after the interval
        self.progress_interval = PROGRESS_WRITE_SECONDS
        self.first_report: tuple[int, float] | None = None  # this piece's first step reported, and when
        self.schedule = CheckpointSchedule(spec.checkpoint_every)

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
        stop_asked, kept = self.received is not None, self.me.rank == 0  # only rank 0's output is synced back
        trained = check_trained(self.spec.task, self.task.train, trained, stop_asked, kept)
        if trained is not None:
            # The task saves a checkpoint after its last step: the newest one is where it ended.
            steps = {"global_steps": self.saved_step, "resumed_from_step": restored_step}
            return dataclasses.replace(trained, metrics={**trained.metrics, **steps})
        assert self.received is not None
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
            self._prune_scratch()
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
        if self.me.local_rank == 0:  # the node's processes share its scratch; each wrote its part
            self._prune_scratch()

    def _prune_scratch(self) -> None:
        """The task's complete checkpoints on scratch beyond the newest `checkpointing.keep`, removed
        once the newest is on shared storage (a task need not prune its own)."""
        saved = complete_checkpoints(self.spec.checkpoint_dir, self.task.CHECKPOINT_MARKER)
        for _step, old in saved[: -self.spec.store.keep]:
            (old / self.task.CHECKPOINT_MARKER).unlink(missing_ok=True)  # first: never a half-removed complete one
            shutil.rmtree(old, ignore_errors=True)

    def _published(self, step: int, started: float) -> None:
        """A checkpoint is on shared storage: what it cost, kept on scratch for the piece's entry
        (by the first process, which published it); the next one's interval counts from here."""
        cost = self.schedule.published(step, started)
        if self.me.rank != 0:
            return
        write_json_atomically(plain(self.schedule.costs), self.spec.work_dir / CHECKPOINT_COSTS_FILE, durable=False)
        saving = f"saved in {cost.save_seconds:.2f} s, " if cost.save_seconds is not None else ""
        log.info(
            "checkpoint-%d %spublished in %.2f s; %s",
            *(step, saving, cost.publish_seconds, self.schedule.next_checkpoint(step)),
        )

    def report_step(self, step: int, max_steps: int | None, loss: float | None) -> None:
        """The task's progress given as its step (and where it stops, and its loss): the speed over this
        piece's reports and the time left at it worked out here, from the first process's reports."""
        if self.me.rank != 0:
            return
        now = time.monotonic()
        first_step, first_at = self.first_report = self.first_report or (step, now)
        progress: dict[str, Any] = {"step": step, "at": time.time()}
        if max_steps is not None:
            progress["max_steps"] = max_steps
        if loss is not None:  # a 0-d tensor or a NumPy number as its number, which JSON holds
            progress["loss"] = loss.item() if hasattr(loss, "item") else loss
        if step > first_step and now > first_at:
            steps_per_second = (step - first_step) / (now - first_at)
            batch_size = self.spec.params.get("batch_size")
            if isinstance(batch_size, int):
                progress["samples_per_second"] = round(steps_per_second * batch_size * self.me.world_size, 2)
            if max_steps is not None:
                progress["seconds_left"] = round((max_steps - step) / steps_per_second, 1)
        self.report_progress(progress)

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
