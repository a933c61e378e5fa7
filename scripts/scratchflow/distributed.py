"""Training with several processes: the run's shape, the launchers, and the worker torchrun starts.

The shape comes from the train rule's resources, set in the cluster's profile next to the GPUs it
asks for: `processes_per_node` (default: the GPUs Slurm gives the job, from CUDA_VISIBLE_DEVICES; one
process without GPUs) and `nodes`. One process is today's training, in the job's own process, with
no torchrun. More on one node: the job stages the data in once, then runs
`torchrun --standalone --nproc-per-node=P -m scratchflow.distributed worker <spec>`; every process
runs the task's `train` (the Hugging Face Trainer finds its rank in torchrun's environment), and
rank 0 reports back through a file. Several nodes: the job (on the allocation's first node, the
batch host) runs `srun --ntasks-per-node=1 … -m scratchflow.distributed node <spec>`, one launcher
per node; each stages the data into its own node-local scratch (the batch host's launcher uses the
job's), verified as always, then starts torchrun with a static rendezvous that puts rank 0 on the
batch host (`--node-rank=$SLURM_NODEID`, `--master-addr=$SLURM_LAUNCH_NODE_IPADDR`), and removes
its scratch however it ends.

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

import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scratchflow import signals
from scratchflow.checkpoints import RunCheckpoints
from scratchflow.dataset import staged_sources
from scratchflow.files import HOST, OWNER_TAG, read_json, write_json_atomically
from scratchflow.processes import StopForwarder, run_program, set_parent_death_signal
from scratchflow.signals import STOP_FILE_NAME
from scratchflow.staging import scratch_directory, stage_in
from scratchflow.tasks import TrainContext, Trained, TrainingStopped, load_task

log = logging.getLogger(__name__)

# After torchrun's own shutdown wait (the stop grace period), time for it to kill and report.
LAUNCHER_EXTRA_GRACE_SECONDS = 30
SCRIPTS_DIR = Path(__file__).resolve().parents[1]


class TrainingFailed(RuntimeError):
    """A training process failed: torchrun ended without a result."""


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
        nodes = [environ.get("SLURMD_NODENAME", HOST)]
    else:

        def ask(*command: str) -> str:
            return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()

        nodes = ask("scontrol", "show", "hostnames", ask("squeue", "-h", "-j", environ["SLURM_JOB_ID"], "-o", "%N"))
        nodes = nodes.split()
    per_node = shape.processes_per_node
    return {node: list(range(index * per_node, (index + 1) * per_node)) for index, node in enumerate(nodes)}


def visible_gpus(environ: Mapping[str, str]) -> int:
    """The GPUs this job may use on its node, as Slurm lists them (CUDA_VISIBLE_DEVICES)."""
    listed = environ.get("CUDA_VISIBLE_DEVICES", "")
    return len([device for device in listed.split(",") if device.strip()])


def requested_gpus_per_node(resources: Mapping[str, Any]) -> int | None:
    """The GPUs a rule's resources ask for on each node, in any of the syntaxes the profiles use
    (`gres: gpu[:type]:N`, `gpu: N` with `gpu_model`, `--gpus-per-node=[type:]N` in slurm_extra);
    None when it asks for none."""
    for request in str(resources.get("gres") or "").split(","):
        name, *rest = request.strip().split(":")
        if name == "gpu":
            return int(rest[-1]) if rest and rest[-1].isdigit() else 1
    per_node = re.search(r"--gpus-per-node[= ](?:[\w.-]+:)?(\d+)", str(resources.get("slurm_extra") or ""))
    if per_node:
        return int(per_node.group(1))
    if resources.get("gpu"):
        return -(-int(resources["gpu"]) // int(resources.get("nodes") or 1))
    return None


def shape_of(resources: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> Shape:
    """The train job's shape from its resources; processes default to the GPUs it was given."""
    nodes = int(resources.get("nodes") or 1)
    processes = int(resources.get("processes_per_node") or max(1, visible_gpus(environ)))
    if nodes < 1 or processes < 1:
        raise ValueError(f"resources of rule train: nodes ({nodes}) and processes_per_node ({processes}) must be >= 1")
    return Shape(nodes=nodes, processes_per_node=processes)


@dataclass(frozen=True)
class Staging:
    """Where a node's launcher finds the data to stage into its own scratch."""

    archive: Path
    manifest: Path
    scratch_root: str | None


def train(task_name: str, context: TrainContext, staging: Staging | None = None) -> Trained:
    """Train one piece of a run with the context's shape; one process trains in this one. Several
    nodes need `staging`: every other node stages the data in itself."""
    task = load_task(task_name)
    shape = Shape(context.nodes, context.processes_per_node)
    if shape.world_size == 1 or task.LAUNCHES_OWN_PROCESSES:
        return task.train(context)
    # Seeded here, once for this node: the processes then find the copy in place.
    context.checkpoints.restore_newest_to(context.work_dir / "checkpoints", shape.world_size)
    spec, result = context.work_dir / "launch.json", context.work_dir / "trained.json"
    write_json_atomically(
        {
            "task": task_name,
            "context": _plain(context),
            "result": str(result),
            "assembly_tag": OWNER_TAG,
            "batch_node": os.environ.get("SLURMD_NODENAME", HOST),
            "staging": {key: str(value) if value else None for key, value in asdict(staging).items()}
            if staging
            else None,
        },
        spec,
    )
    environment = launch_environment(context.threads, shape)
    if shape.nodes == 1:
        argv = torchrun_argv(shape, context.stop_grace_seconds, ["--standalone"], spec)
    else:
        argv = srun_argv(shape, context.threads, spec)
        environment = seeing_in_image(environment, context.work_dir)
    log.info("training with %d processes: %s", shape.world_size, " ".join(argv))
    # One node: the stop goes to torchrun's workers. Several: srun passes it on to every launcher.
    stop = StopForwarder(context.work_dir / STOP_FILE_NAME, to_children=shape.nodes == 1)
    grace = context.stop_grace_seconds + LAUNCHER_EXTRA_GRACE_SECONDS
    code, tail = run_program(argv, environment, stop, grace)
    if result.is_file():
        outcome = read_json(result)
        if "stopped" in outcome:
            raise TrainingStopped(outcome["stopped"])
        return Trained(output=Path(outcome["output"]), metrics=outcome["metrics"])
    if stop.received:
        newest = context.checkpoints.newest()
        raise TrainingStopped(
            f"stopped on {stop.received} before the processes could save; the next attempt resumes from "
            + (newest.name if newest else "the beginning")
        )
    launcher = "torchrun" if shape.nodes == 1 else "the nodes' launchers (srun)"
    raise TrainingFailed(f"{launcher} exited with {code} and no result; the last lines:\n{tail}")


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
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SCRIPTS_DIR), os.environ.get("PYTHONPATH")])),
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


def rendezvous_port(job_id: str) -> int:
    """The same on every node of a job, and different for jobs that may share a node."""
    return 20_000 + int(job_id) % 20_000


def run_node(spec_path: Path) -> int:
    """One node's launcher in a multi-node job: its own stage-in (except on the batch host, whose
    scratch the job has staged), then torchrun for this node's processes. Returns the exit code:
    0 after a stop (the job reads the outcome from rank 0), non-zero when the processes failed."""
    spec = read_json(spec_path)
    node, node_rank = os.environ.get("SLURMD_NODENAME", HOST), int(os.environ["SLURM_NODEID"])
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s %(levelname)s node {node} %(name)s: %(message)s", force=True
    )
    fields = spec["context"]
    shape = Shape(fields["nodes"], fields["processes_per_node"])
    rendezvous = [
        f"--nnodes={shape.nodes}",
        f"--node-rank={node_rank}",
        f"--master-addr={os.environ['SLURM_LAUNCH_NODE_IPADDR']}",
        f"--master-port={rendezvous_port(os.environ['SLURM_JOB_ID'])}",
    ]
    if node_rank == 0:
        if node != spec["batch_node"]:
            log.error("node rank 0 is %s, not the batch host %s, where the job syncs from", node, spec["batch_node"])
            return 2
        return _node_torchrun(shape, fields, rendezvous, spec_path)
    staging = Staging(**spec["staging"])
    with scratch_directory(staging.scratch_root, f"train-{fields['run_id']}-{node}") as scratch:
        log.info("node rank %d: staging into %s", node_rank, scratch)
        data = staged_sources(stage_in(Path(staging.archive), Path(staging.manifest), scratch), fields["dataset"])
        context = _context({**fields, "work_dir": str(scratch), "data": {k: str(v) for k, v in data.items()}}, 1)
        context.checkpoints.restore_newest_to(scratch / "checkpoints", shape.world_size)
        node_spec = scratch / "launch.json"
        write_json_atomically({**spec, "context": _plain(context)}, node_spec)
        return _node_torchrun(shape, _plain(context), rendezvous, node_spec)


def _node_torchrun(shape: Shape, fields: dict[str, Any], rendezvous: list[str], spec: Path) -> int:
    argv = torchrun_argv(shape, fields["stop_grace_seconds"], rendezvous, spec)
    stop = StopForwarder(Path(fields["work_dir"]) / STOP_FILE_NAME, to_children=True)
    grace = fields["stop_grace_seconds"] + LAUNCHER_EXTRA_GRACE_SECONDS
    code, _tail = run_program(argv, launch_environment(fields["threads"], shape), stop, grace)
    return 0 if stop.received else code


def _plain(context: TrainContext) -> dict[str, Any]:
    fields = asdict(context)
    fields["data"] = {name: str(path) for name, path in context.data.items()}
    fields["model"] = str(context.model) if context.model else None
    fields["work_dir"] = str(context.work_dir)
    fields["tracking_dir"] = str(context.tracking_dir)
    fields["checkpoints"] = {
        "folder": str(context.checkpoints.folder),
        "marker": context.checkpoints.marker,
        "keep": context.checkpoints.keep,
    }
    return fields


def _context(fields: dict[str, Any], processes: int) -> TrainContext:
    checkpoints = fields["checkpoints"]
    return TrainContext(
        **{
            **fields,
            "data": {name: Path(path) for name, path in fields["data"].items()},
            "model": Path(fields["model"]) if fields["model"] else None,
            "work_dir": Path(fields["work_dir"]),
            "tracking_dir": Path(fields["tracking_dir"]),
            "checkpoints": RunCheckpoints(Path(checkpoints["folder"]), checkpoints["marker"], checkpoints["keep"]),
            "threads": max(1, fields["threads"] // processes),
        }
    )


@dataclass(frozen=True)
class Rank:
    """This process's place among the training processes (torchrun's environment)."""

    rank: int
    local_rank: int
    world_size: int

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Rank:
        return cls(
            rank=int(environ.get("RANK", 0)),
            local_rank=int(environ.get("LOCAL_RANK", 0)),
            world_size=int(environ.get("WORLD_SIZE", 1)),
        )


def main(spec_path: str) -> None:
    """One training process under torchrun: the task's train; rank 0 writes the outcome."""
    set_parent_death_signal()  # a worker whose torchrun is killed dies too, instead of training on as an orphan
    spec = read_json(Path(spec_path))
    # Until the trainer listens (it also looks for the stop file at every step).
    signals.listen_by_stop_file(Path(spec["context"]["work_dir"]) / STOP_FILE_NAME)
    me = Rank.from_environment()
    os.environ["SCRATCHFLOW_ASSEMBLY_TAG"] = spec["assembly_tag"]
    logging.basicConfig(
        level=logging.INFO if me.rank == 0 else logging.WARNING,
        format=f"%(asctime)s %(levelname)s rank {me.rank} %(name)s: %(message)s",
        force=True,
    )
    context = _context(spec["context"], int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    try:
        trained = load_task(spec["task"]).train(context)
        outcome: dict[str, Any] = {"output": str(trained.output), "metrics": trained.metrics}
    except TrainingStopped as stopped:
        outcome = {"stopped": str(stopped)}
    if me.rank == 0:
        write_json_atomically(outcome, Path(spec["result"]))
    log.info("rank %d of %d done: %s", me.rank, me.world_size, json.dumps(outcome)[:200])


if __name__ == "__main__":
    role, spec_file = sys.argv[1:3]
    if role == "node":
        sys.exit(run_node(Path(spec_file)))
    main(spec_file)
