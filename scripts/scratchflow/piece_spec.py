"""What describes a training piece, the same in the job, on every node and in every training process:
`PieceSpec` (passed as it is from the job to each node's launcher and each training process, as
JSON, `launch.json`, through scratchflow.record's `plain`/`typed`; a task sees it through its
`TrainContext`), its `Shape`, where it stages from (`Staging`), a process's `Rank`, and how a piece
that stopped on request ended (`Paused`).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scratchflow.checkpoints import CheckpointStore
from scratchflow.files import HOST, OWNER_TAG, read_json, write_json_atomically
from scratchflow.lease import RunFolder
from scratchflow.ledger import Phase, PiecesLimit, RunLedger
from scratchflow.plan import TENSORBOARD_FOLDER
from scratchflow.record import plain, typed
from scratchflow.schedule import CheckpointInterval

CHECKPOINT_FOLDER = "checkpoints"  # in the piece's scratch folder: where the task saves its checkpoints


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
class PredictionAtEnd:
    """Where a train job that ends its run publishes its prediction of the test split
    (scratchflow.prediction), and the workflow's folder, whose code the prediction's record names."""

    folder: Path
    workflow_dir: Path


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
    # cluster.max_pieces: the most pieces the run (its rung) trains in; and how long before the time
    # limit the job's --signal asks Slurm to warn it (None: no warning asked): scratchflow.slurm_job.
    max_pieces: int | None = None
    warning_lead_seconds: int | None = None
    # A halving search's rung: train until this many of the run's epochs are done, then stop with
    # a checkpoint and the validation metrics there.
    budget_epochs: int | None = None
    rung: int | None = None  # that rung's index
    staging: Staging | None = None  # where each node stages the data in from
    data_sha256: str | None = None  # the archive's: the run's folder is claimed for it and the identity
    model_out: Path | None = None  # where the trained model is synced back (None: a rung's piece)
    prediction_at_end: PredictionAtEnd | None = None  # None: the run's predict job predicts
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
    def pieces_limit(self) -> PiecesLimit | None:
        return PiecesLimit(self.max_pieces, self.rung) if self.max_pieces is not None else None

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
    # Why the job requeues itself once it has ended (preempted, its time limit), if it does.
    requeue: str | None = None
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
