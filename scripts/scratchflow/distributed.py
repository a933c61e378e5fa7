"""Training with several processes: the run's shape, the launchers, and the worker torchrun starts.

The shape comes from the train rule's resources, set in the cluster's profile next to the GPUs it
asks for: `processes_per_node` (default: the GPUs Slurm gives the job, from CUDA_VISIBLE_DEVICES; one
process without GPUs) and `nodes`. One process is today's training, in the job's own process, with
no torchrun. More on one node: the job stages the data in once, then runs
`torchrun --standalone --nproc-per-node=P -m scratchflow.distributed worker <spec>`; every process
runs the task's `train` (the Hugging Face Trainer finds its rank in torchrun's environment), and
rank 0 reports back through a file. Several nodes: the job (on the allocation's first node, the
batch host) runs `srun --ntasks-per-node=1 … -m scratchflow.distributed node <spec>`, one launcher
per node; each prepares its own node-local scratch (training_process.prepare_node: the data staged in, verified
as always, and the newest checkpoint restored; the batch host's launcher uses the job's), then
starts torchrun with a static rendezvous that puts rank 0 on the batch host
(`--node-rank=$SLURM_NODEID`, `--master-addr=$SLURM_LAUNCH_NODE_IPADDR`), and removes its scratch
however it ends.

Stop signals: torchrun starts with the stop signal (`checkpointing.stop_signal`) ignored, and USR1
and USR2 are not in its `--signals-to-handle`, so it stays out of the stop (a signal it handled would
send its agent out through the failure path, which skips the exit barrier: the other nodes' torchrun
would then wait 300 s in theirs; HUP is one of torchrun's own). The job, or each node's launcher,
passes the stop signal and TERM straight to torchrun's workers, and leaves the stop file for a
worker that had no handler yet; the workers agree at each step whether any got one, stop at the
same step and exit cleanly, so every torchrun ends at once. TERM from Slurm itself (scancel, the
time limit) still reaches torchrun, which passes it on. A launcher whose processes fail exits
non-zero, and srun (`--kill-on-bad-exit`) then ends the others at once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scratchflow import SCRATCHFLOW_DIR, signals
from scratchflow.files import read_json, write_json_atomically
from scratchflow.piece_spec import Paused, PieceSpec, Rank, Shape, node_name
from scratchflow.processes import StopForwarder, run_program, set_parent_death_signal
from scratchflow.record import plain, typed
from scratchflow.signals import STOP_FILE_NAME
from scratchflow.staging import scratch_directory
from scratchflow.tasks import Trained, load_task
from scratchflow.training_process import PieceOutcome, TrainingProcess, prepare_node

log = logging.getLogger(__name__)

# After torchrun's own shutdown wait (the stop grace period), time for it to kill and report.
LAUNCHER_EXTRA_GRACE_SECONDS = 30
RESULT_FILE = "trained.json"  # in the job's scratch: rank 0's outcome


class TrainingFailed(RuntimeError):
    """A training process failed: torchrun ended without a result."""


def visible_gpus(environ: Mapping[str, str]) -> int:
    """The GPUs this job may use on its node, as Slurm lists them (CUDA_VISIBLE_DEVICES)."""
    listed = environ.get("CUDA_VISIBLE_DEVICES", "")
    return len([device for device in listed.split(",") if device.strip()])


def shape_of(resources: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> Shape:
    """The train job's shape from its resources; processes default to the GPUs it was given."""
    nodes = int(resources.get("nodes") or 1)
    processes = int(resources.get("processes_per_node") or max(1, visible_gpus(environ)))
    if nodes < 1 or processes < 1:
        raise ValueError(f"resources of rule train: nodes ({nodes}) and processes_per_node ({processes}) must be >= 1")
    return Shape(nodes=nodes, processes_per_node=processes)


def train(spec: PieceSpec) -> PieceOutcome:
    """Train one piece of a run with the spec's shape, on this node prepared (training_process.prepare_node);
    one process trains in this one. Several nodes: every other node's launcher prepares its own."""
    shape = spec.shape
    if shape.world_size == 1 or load_task(spec.task).LAUNCHES_OWN_PROCESSES:
        return TrainingProcess(spec).train()
    spec_file, result = spec.work_dir / "launch.json", spec.work_dir / RESULT_FILE
    spec.write(spec_file)
    environment = launch_environment(spec.threads, shape)
    if shape.nodes == 1:
        argv = torchrun_argv(shape, spec.stop_grace_seconds, ["--standalone"], spec_file)
    else:
        argv = srun_argv(shape, spec.threads, spec_file)
        environment = seeing_in_image(environment, spec.work_dir)
    log.info("training with %d processes: %s", shape.world_size, " ".join(argv))
    # One node: the stop goes to torchrun's workers. Several: srun passes it on to every launcher.
    stop = StopForwarder(spec.work_dir / STOP_FILE_NAME, to_children=shape.nodes == 1)
    grace = spec.stop_grace_seconds + LAUNCHER_EXTRA_GRACE_SECONDS
    code, tail = run_program(argv, environment, stop, grace)
    if result.is_file():
        return typed(Outcome, read_json(result)).value()
    if stop.received:  # before the processes could save
        return Paused(stop.received, "training", spec.store.newest_step())
    launcher = "torchrun" if shape.nodes == 1 else "the nodes' launchers (srun)"
    raise TrainingFailed(f"{launcher} exited with {code} and no result; the last lines:\n{tail}")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """Rank 0's outcome as the job reads it (RESULT_FILE): one of the two."""

    trained: Trained | None = None
    paused: Paused | None = None

    def value(self) -> PieceOutcome:
        outcome = self.trained or self.paused
        assert outcome is not None, f"{RESULT_FILE} holds no outcome"
        return outcome


def torchrun_argv(shape: Shape, grace_seconds: float, rendezvous: list[str], spec: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *rendezvous,
        f"--nproc-per-node={shape.processes_per_node}",
        f"--shutdown-timeout={round(grace_seconds)}",
        "-m",
        "scratchflow.distributed",
        "worker",
        str(spec),
    ]


def srun_argv(shape: Shape, threads: int, spec: Path) -> list[str]:
    """One launcher per node of the job's allocation (srun finds it from SLURM_JOB_ID), with the
    job's CPUs and GPUs on each."""
    gpus = visible_gpus(os.environ)
    return [
        "srun",
        f"--nodes={shape.nodes}",
        f"--ntasks={shape.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={threads}",
        *([f"--gres=gpu:{gpus}"] if gpus else []),
        "--kill-on-bad-exit=1",
        sys.executable,
        "-m",
        "scratchflow.distributed",
        "node",
        str(spec),
    ]


def launch_environment(threads: int, shape: Shape) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SCRATCHFLOW_DIR / "scripts"), os.environ.get("PYTHONPATH")])),
        # The job's CPUs on a node, shared among the node's processes.
        "OMP_NUM_THREADS": str(max(1, threads // shape.processes_per_node)),
    }


def seeing_in_image(environ: dict[str, str], scratch: Path) -> dict[str, str]:
    """On a container profile (PYXIS_CONTAINER_IMAGE, set by the batch step for its job steps),
    pyxis starts every node's launcher in the image; the batch host's launcher trains from the
    job's scratch, which the job staged on the node, outside the image: mounted at its own path."""
    if "PYXIS_CONTAINER_IMAGE" not in environ:
        return environ
    mounts = [*filter(None, environ.get("PYXIS_CONTAINER_MOUNTS", "").split(",")), f"{scratch}:{scratch}"]
    return {**environ, "PYXIS_CONTAINER_MOUNTS": ",".join(mounts)}


def rendezvous_port(job_id: str, term: int | None) -> int:
    """The same on every node of a piece, and different for jobs that may share a node, and for two
    pieces of one requeued job (its id kept; the run's term not): an old piece that trains on where
    Slurm can no longer reach it holds its port still."""
    return 20_000 + (int(job_id) + TERM_PORT_STRIDE * (term or 0)) % 20_000


TERM_PORT_STRIDE = 7919  # a prime: the ports of one job's pieces far apart, not those of its neighbouring ids


def run_node(spec_file: Path) -> int:
    """One node's launcher in a multi-node job: its own stage-in (except on the batch host, whose
    scratch the job has staged), then torchrun for this node's processes. Returns the exit code:
    0 after a stop (the job reads the outcome from rank 0), non-zero when the processes failed."""
    spec = PieceSpec.read(spec_file)
    node, node_rank = node_name(), int(os.environ["SLURM_NODEID"])
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s %(levelname)s node {node} %(name)s: %(message)s", force=True
    )
    rendezvous = [
        f"--nnodes={spec.shape.nodes}",
        f"--node-rank={node_rank}",
        f"--master-addr={os.environ['SLURM_LAUNCH_NODE_IPADDR']}",
        f"--master-port={rendezvous_port(os.environ['SLURM_JOB_ID'], spec.store.term)}",
    ]
    if node_rank == 0:
        if node != spec.batch_node:
            log.error("node rank 0 is %s, not the batch host %s, where the job syncs from", node, spec.batch_node)
            return 2
        return _node_torchrun(spec, rendezvous, spec_file)
    assert spec.staging is not None, "a piece of several nodes stages on each"
    with scratch_directory(spec.staging.scratch_root, f"train-{spec.run_id}-{node}") as scratch:
        log.info("node rank %d: staging into %s", node_rank, scratch)
        node_spec = prepare_node(spec, scratch)
        if isinstance(node_spec, Paused):
            return 0  # the job reads the outcome from rank 0
        node_spec.write(scratch / "launch.json")
        return _node_torchrun(node_spec, rendezvous, scratch / "launch.json")


def _node_torchrun(spec: PieceSpec, rendezvous: list[str], spec_file: Path) -> int:
    argv = torchrun_argv(spec.shape, spec.stop_grace_seconds, rendezvous, spec_file)
    stop = StopForwarder(spec.work_dir / STOP_FILE_NAME, to_children=True)
    grace = spec.stop_grace_seconds + LAUNCHER_EXTRA_GRACE_SECONDS
    code, _tail = run_program(argv, launch_environment(spec.threads, spec.shape), stop, grace)
    if code and spec.run_folder.superseded():
        # Ended quietly: srun, seeing a task fail, would kill the job's step by its id, which names
        # the newer piece's step now (a requeued job keeps its id, and its steps start from 0 again).
        log.warning("this node's processes ended: a newer piece holds the run")
        return 0
    return 0 if stop.received else code


def main(spec_file: Path) -> None:
    """One training process under torchrun: its part of the piece; rank 0 writes the outcome where the
    job reads it (rank 0 runs on the batch host, in the job's own scratch)."""
    set_parent_death_signal()  # a worker whose torchrun is killed dies too, instead of training on as an orphan
    spec = PieceSpec.read(spec_file)
    # Until the piece listens (it also looks for the stop file at every step).
    signals.listen_by_stop_file(spec.work_dir / STOP_FILE_NAME)
    me = Rank.from_environment()
    logging.basicConfig(
        level=logging.INFO if me.rank == 0 else logging.WARNING,
        format=f"%(asctime)s %(levelname)s rank {me.rank} %(name)s: %(message)s",
        force=True,
    )
    threads = max(1, spec.threads // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    outcome = TrainingProcess(dataclasses.replace(spec, threads=threads), me).train()
    if me.rank == 0:
        recorded = Outcome(trained=outcome) if isinstance(outcome, Trained) else Outcome(paused=outcome)
        write_json_atomically(plain(recorded), spec.work_dir / RESULT_FILE)
    log.info("rank %d of %d done: %s", me.rank, me.world_size, str(outcome)[:200])


if __name__ == "__main__":
    role, spec_file = sys.argv[1:3]
    if role == "node":
        sys.exit(run_node(Path(spec_file)))
    main(Path(spec_file))
