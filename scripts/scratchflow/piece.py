"""A training piece: one job's share of a run's training, and every duty around a task's `train`.

A task only trains (scratchflow.tasks, the `Task` protocol); the piece does the rest, in each
process that runs the task (the job's own with one training process, or each one torchrun starts;
scratchflow.distributed launches them from the same spec):

- **restore**: the run's newest complete checkpoint on shared storage is copied to scratch before the
  task starts, and named in `TrainContext.resume_from`;
- **the stop signal** (`checkpointing.stop_signal`, and SIGTERM) is heard here while the task trains;
  the task asks `TrainContext.stop_requested()` at the end of each step, and with several processes
  they all learn there whether any was asked, so all stop at the same step;
- **mirroring**: after the task saves a checkpoint on scratch it calls
  `TrainContext.checkpoint_saved`, and the piece copies it whole to shared storage (with several
  processes: each node's part into a hidden assembly folder, published by rank 0 once every
  process's part is there);
- **deciding the outcome**: a task that returns None stopped on request; the piece raises
  `TrainingStopped` naming the checkpoint the next piece resumes from;
- **the step figures**: what a task returns gets `global_steps` (the step of the newest checkpoint
  it saved, or of the one restored) and `resumed_from_step` (the restored one's, or None): the task
  reports neither.

`PieceSpec` is the one description of a piece, passed as it is from the job to each node's launcher
and each training process (as JSON, `launch.json`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scratchflow import signals
from scratchflow.checkpoints import CheckpointMirroring, RunCheckpoints, step_of
from scratchflow.files import HOST, OWNER_TAG, read_json, write_json_atomically
from scratchflow.processes import StopForwarder, run_program
from scratchflow.signals import STOP_FILE_NAME
from scratchflow.tasks import TrainContext, Trained, TrainingStopped, load_task

log = logging.getLogger(__name__)

CHECKPOINT_FOLDER = "checkpoints"  # in the piece's scratch folder: where the task saves its checkpoints
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


@dataclass(frozen=True)
class Staging:
    """Where a node's launcher finds the data to stage into its own scratch."""

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
    piece: int  # 1 for the first job that trains the run, 2 for the one that resumes it, ...
    data: dict[str, Path]  # the staged data on this node's scratch: {"all": path} or {"train": ..., ...}
    dataset: dict[str, Any]
    params: dict[str, Any]  # the run's training parameters
    model: Path | None  # the base model's cache on shared storage
    work_dir: Path  # the piece's private scratch folder on this node
    checkpoints: RunCheckpoints  # the run's checkpoints on shared storage
    tracking_dir: Path  # the run's TensorBoard folder on shared storage (scratchflow.tracking)
    tracking: str  # config key tracking: "tensorboard", or "wandb" (W&B offline as well)
    save_every_steps: int
    stop_grace_seconds: float
    threads: int  # CPU threads of the job on each node
    shape: Shape = Shape()
    # A halving search's rung: train until this many of the run's epochs are done, then stop with
    # a checkpoint and the validation metrics there.
    budget_epochs: int | None = None
    staging: Staging | None = None  # several nodes: where the other nodes stage the data in from
    assembly_tag: str = OWNER_TAG  # the job's, the same on every node (RunCheckpoints.assembly)
    batch_node: str = dataclasses.field(default_factory=node_name)  # the job's node (Slurm's name), rank 0's

    @property
    def checkpoint_dir(self) -> Path:
        return self.work_dir / CHECKPOINT_FOLDER

    def write(self, path: Path) -> None:
        def plain(value: Any) -> Any:
            if isinstance(value, Path):
                return str(value)
            if isinstance(value, dict):
                return {key: plain(item) for key, item in value.items()}
            return value

        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        for name in ("checkpoints", "shape", "staging"):
            fields[name] = dataclasses.asdict(fields[name]) if fields[name] else None
        write_json_atomically(plain(fields), path)

    @classmethod
    def read(cls, path: Path) -> PieceSpec:
        fields = read_json(path)
        checkpoints, staging = fields["checkpoints"], fields["staging"]
        return cls(
            **{
                **fields,
                "data": {name: Path(location) for name, location in fields["data"].items()},
                "model": Path(fields["model"]) if fields["model"] else None,
                "work_dir": Path(fields["work_dir"]),
                "checkpoints": RunCheckpoints(**{**checkpoints, "folder": Path(checkpoints["folder"])}),
                "tracking_dir": Path(fields["tracking_dir"]),
                "shape": Shape(**fields["shape"]),
                "staging": Staging(Path(staging["archive"]), Path(staging["manifest"]), staging["scratch_root"])
                if staging
                else None,
            }
        )


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
        self.mirroring: CheckpointMirroring | None = None
        self.saved_step: int | None = None  # the newest checkpoint's step: restored, then each saved

    def train(self) -> Trained:
        """Restore, train the task while listening for the stop signal, and return what it trained,
        with the piece's step figures among its metrics; raises TrainingStopped when it stopped on
        request (its checkpoint on shared storage)."""
        self.resume_from = self.spec.checkpoints.restore_newest_to(self.spec.checkpoint_dir, self.me.world_size)
        restored_step = self.saved_step = step_of(self.resume_from) if self.resume_from else None
        self.mirroring = self.spec.checkpoints.mirroring(self.spec.checkpoint_dir, restored_step)
        self.spec.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        with signals.listening(self._receive):
            trained = self.task.train(self.context())
        if trained is not None:
            # The task saves a checkpoint after its last step: the newest one is where it ended.
            steps = {"global_steps": self.saved_step, "resumed_from_step": restored_step}
            return dataclasses.replace(trained, metrics={**trained.metrics, **steps})
        if self.received is None:
            raise RuntimeError(f"task {self.spec.task}'s train returned None, which means stopped, unasked")
        raise TrainingStopped(self.stopped())

    def context(self) -> TrainContext:
        spec = self.spec
        return TrainContext(
            run_id=spec.run_id,
            piece=spec.piece,
            data=spec.data,
            dataset=spec.dataset,
            params=spec.params,
            model=spec.model,
            work_dir=spec.work_dir,
            checkpoint_dir=spec.checkpoint_dir,
            resume_from=self.resume_from,
            keep_checkpoints=spec.checkpoints.keep,
            save_every_steps=spec.save_every_steps,
            tracking_dir=spec.tracking_dir,
            tracking=spec.tracking,
            threads=spec.threads,
            nodes=spec.shape.nodes,
            processes_per_node=spec.shape.processes_per_node,
            budget_epochs=spec.budget_epochs,
            lifecycle=self,
        )

    def stopped(self) -> str:
        """Why and where the piece stopped, and what the next one does."""
        newest = self.spec.checkpoints.newest()
        if newest is None:
            return (
                f"stopped on {self.received} and paused; no complete checkpoint was saved, so the next "
                "attempt starts from the beginning"
            )
        return (
            f"stopped on {self.received} at step {step_of(newest)} and paused; {newest.name} is saved in "
            f"{self.spec.checkpoints.folder} and the next attempt resumes from it"
        )

    def _receive(self, number: int, _frame: Any) -> None:
        self.received = signal.Signals(number).name
        log.warning("%s received: saving a checkpoint after the current step, then stopping", self.received)

    # What the task's TrainContext asks for.

    def stop_requested(self) -> bool:
        if self.received is None and self.stop_file.exists():  # left before this process listened
            self.received = self.stop_file.read_text() or "a stop request"
        if self.me.world_size == 1:
            return self.received is not None
        # A signal may reach one process, or one node, or all at different moments: every process
        # learns whether any got one, so all stop at the same step.
        import torch.distributed  # only a piece of several processes has them

        device = f"cuda:{torch.cuda.current_device()}" if torch.distributed.get_backend() == "nccl" else "cpu"
        anyone = torch.tensor([int(self.received is not None)], device=device)
        torch.distributed.all_reduce(anyone, op=torch.distributed.ReduceOp.MAX)
        if not anyone.item():
            # The agreed answer, even if this process's own signal came after it had answered: a
            # process that stopped alone would wait forever in its checkpoint's barrier while the
            # others trained on. Its signal is counted at the next step's end.
            return False
        self.received = self.received or "a stop signal to another process"
        return True

    def checkpoint_saved(self, checkpoint: Path) -> None:
        if self.me.world_size == 1:
            self.mirroring.mirror_newest()
            self.saved_step = self.mirroring.mirrored_step
            return
        import torch.distributed  # only a piece of several processes has them

        assembly = self.spec.checkpoints.assembly(checkpoint.name, self.spec.assembly_tag)
        (checkpoint / PART_FILE.format(rank=self.me.rank)).touch()  # after the task's own part
        torch.distributed.barrier()  # every process has written its part
        if self.me.local_rank == 0:
            shutil.copytree(checkpoint, assembly, dirs_exist_ok=True)
        torch.distributed.barrier()  # every node's part is on shared storage
        if self.me.rank == 0:
            parts = (PART_FILE.format(rank=rank) for rank in range(self.me.world_size))
            missing = [name for name in parts if not (assembly / name).is_file()]
            marker = self.task.CHECKPOINT_MARKER
            if missing or not (assembly / marker).is_file():
                raise RuntimeError(f"{assembly} lacks {', '.join(missing) or marker}: not published")
            self.spec.checkpoints.publish(assembly, self.me.world_size)
            log.info("checkpoint %s of %d processes saved to %s", checkpoint.name, self.me.world_size, assembly.parent)
        self.saved_step = step_of(checkpoint)

    def report_progress(self, progress: dict[str, Any]) -> None:
        self.spec.checkpoints.report_progress(progress)

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
