"""Training with several processes on one node (torchrun, gloo on CPU): the shape from the train
rule's resources, checkpoints that hold every rank's part, all ranks stopping at one step, a dead
rank failing the job at once, and resumes that end exactly like an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import (
    job_process,
    live_pieces,
    processes_in,
    run_workflow,
    same_metrics,
    start_workflow,
    workflow_config,
    write_config,
)
from scratchflow.checkpoints import CheckpointStore, WorldSizeChanged, complete_checkpoints
from scratchflow.classification import TRAINER_CHECKPOINT_MARKER
from scratchflow.config import ConfigError, check_precision, check_resources
from scratchflow.dataset import load_examples
from scratchflow.distributed import seeing_in_image, shape_of
from scratchflow.lease import RunFolder
from scratchflow.piece_spec import PieceSpec, Rank, Shape, Staging
from scratchflow.plan import TENSORBOARD_FOLDER
from scratchflow.preflight import requested_gpus_per_node
from scratchflow.processes import StopForwarder, run_program
from scratchflow.schedule import CheckpointInterval
from scratchflow.tracking import read_curves
from scratchflow.training_process import TrainingProcess

TWO_PROCESSES = ("--set-resources", "train:processes_per_node=2")
MARKER = TRAINER_CHECKPOINT_MARKER


def test_the_shape_comes_from_the_resources_or_the_gpus_slurm_gives():
    assert shape_of({}, {}) == Shape(nodes=1, processes_per_node=1)
    assert shape_of({}, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}) == Shape(1, 4)
    assert shape_of({"processes_per_node": 2}, {"CUDA_VISIBLE_DEVICES": "0"}).processes_per_node == 2
    assert shape_of({"nodes": 2}, {"CUDA_VISIBLE_DEVICES": "0,1"}).world_size == 4
    assert shape_of({}, {"CUDA_VISIBLE_DEVICES": ""}) == Shape(1, 1)


def test_on_a_container_profile_every_nodes_launcher_runs_in_the_image_and_sees_the_jobs_scratch():
    """A several-node job's srun inherits the batch step's PYXIS_CONTAINER_* (one image per job
    step); the batch host's launcher trains from the job's scratch, staged outside the image."""
    scratch = Path("/tmp/scratchflow-train-abc@n1@1@x")
    on_the_host = {"PATH": "/usr/bin"}
    assert seeing_in_image(on_the_host, scratch) == on_the_host
    in_image = {"PYXIS_CONTAINER_IMAGE": "/i.sqsh", "PYXIS_CONTAINER_MOUNTS": "/w:/w,/d:/d:ro"}
    assert seeing_in_image(in_image, scratch)["PYXIS_CONTAINER_MOUNTS"] == f"/w:/w,/d:/d:ro,{scratch}:{scratch}"


@pytest.mark.parametrize(
    ("resources", "gpus"),
    [
        ({"gres": "gpu:2"}, 2),  # OSCER, LRZ, Edinburgh
        ({"gres": "gpu:a100:4"}, 4),
        ({"gres": "tmpdisk:100,gpu"}, 1),
        ({"gpu": 4, "gpu_model": "a100"}, 4),  # Narval, DFKI: --gpus, the job's total
        ({"gpu": 4, "nodes": 2}, 2),
        ({"slurm_extra": "--signal=USR1@600 --gpus-per-node=a100:4"}, 4),
        ({"cpus_per_task": 8}, None),
    ],
)
def test_the_gpus_asked_for_per_node_are_read_from_every_syntax_the_profiles_use(resources, gpus):
    assert requested_gpus_per_node(resources) == gpus


@pytest.mark.parametrize(
    ("rule", "shape", "message"),
    [
        ("train", {"processes_per_node": 0}, "resource processes_per_node of rule train: 0 is not a whole number"),
        ("train", {"nodes": "two"}, "resource nodes of rule train: 'two' is not a whole number"),
        ("predict", {"processes_per_node": 2}, "only rule train starts several training processes"),
        ("train", {"processes_per_node": 4, "gres": "gpu:2"}, "4 processes on a node given 2 GPU"),
        ("train", {"nodes": 2}, "2 nodes need one launcher per node"),
        ("train", {"nodes": 2, "mpi": "srun", "tasks": 2, "gres": "gpu:2"}, "ask for nodes: 2, mpi: srun"),
        ("train", {"nodes": 2, "mpi": "srun", "tasks": 2}, "resource slurm_extra of rule train: 2 nodes need"),
    ],
)
def test_a_bad_training_shape_is_refused_naming_the_resource(rule, shape, message):
    with pytest.raises(ConfigError, match=message):
        check_resources({rule: shape}, {}, {rule: shape}, {"name": "oscer"})


def precision_config(**training) -> dict:
    return {"training": {"learning_rate": 1e-3, **training}, "grid": {"seed": [0]}}


def test_fsdp_and_bf16_on_a_cpu_only_run_are_refused_unless_the_cpu_can_do_bf16():
    cpu_only = ({}, False)  # a train rule asking for no GPU, on a machine without one
    with pytest.raises(ConfigError, match=r"training\.fsdp: FSDP shards the model across GPUs"):
        check_precision(precision_config(fsdp="full_shard"), *cpu_only, flags={"avx512_bf16"})
    with pytest.raises(ConfigError, match=r"training\.bf16: .* no bfloat16 instructions"):
        check_precision(precision_config(bf16=True), *cpu_only, flags={"avx2"})
    with pytest.raises(ConfigError, match=r"training\.bf16"):
        check_precision({"training": {}, "grid": {"bf16": [False, True]}}, *cpu_only, flags=set())
    check_precision(precision_config(bf16=True), *cpu_only, flags={"avx512_bf16"})
    check_precision(precision_config(fsdp="full_shard", bf16=True), {"gres": "gpu:4"}, False, flags=set())
    check_precision(precision_config(fsdp="full_shard"), {}, True, flags=set())  # a local run on a GPU machine


def test_several_nodes_on_this_machine_are_refused():
    shape = {"nodes": 2, "mpi": "srun", "tasks": 2, "slurm_extra": "--ntasks-per-node=1"}
    with pytest.raises(ConfigError, match="2 nodes with cluster 'local'"):
        check_resources({"train": shape}, {}, {"train": shape}, {"name": "local"})
    check_resources({"train": shape}, {}, {"train": shape}, {"name": "oscer"})


def test_the_multi_node_shapes_the_readme_gives_pass_the_start_up_checks():
    """OSCER's (gres per node) and Narval's (--gpus-per-node, which the plugin does not count as a
    GPU job, so no tasks_per_gpu is needed)."""
    oscer = {"nodes": 2, "mpi": "srun", "tasks": 2, "tasks_per_gpu": 0, "gres": "gpu:2"}
    oscer["slurm_extra"] = "--signal=USR1@600 --ntasks-per-node=1"
    narval = {"nodes": 2, "mpi": "srun", "tasks": 2}
    narval["slurm_extra"] = "--signal=USR1@600 --ntasks-per-node=1 --gpus-per-node=a100:4"
    for shape, cluster in ((oscer, "oscer"), (narval, "narval")):
        check_resources({"train": shape}, {}, {"train": shape}, {"name": cluster})
    assert requested_gpus_per_node(narval) == 4


def write_checkpoint(folder: Path, step: int, world_size: int | None = None) -> Path:
    checkpoint = folder / f"checkpoint-{step}"
    checkpoint.mkdir(parents=True)
    (checkpoint / MARKER).write_text("{}")
    if world_size is not None:
        (checkpoint / "world.json").write_text(json.dumps({"world_size": world_size}))
    return checkpoint


def test_a_checkpoint_of_another_world_size_is_refused_with_what_to_do(tmp_path):
    run = CheckpointStore(RunFolder(tmp_path / "shared"), MARKER)
    write_checkpoint(run.folder, 40, world_size=4)
    with pytest.raises(WorldSizeChanged, match=r"written by 4 training process\(es\), and this job trains with 2"):
        run.restore_newest_to(tmp_path / "local", world_size=2)
    assert run.restore_newest_to(tmp_path / "local", world_size=4) == tmp_path / "local" / "checkpoint-40"
    # A checkpoint without world.json was written by one process, as before this existed.
    write_checkpoint(run.folder, 50)
    assert run.restore_newest_to(tmp_path / "local-2").name == "checkpoint-50"


def test_a_checkpoint_seeded_by_the_launcher_is_used_in_place(tmp_path):
    run = CheckpointStore(RunFolder(tmp_path / "shared"), MARKER)
    write_checkpoint(run.folder, 10, world_size=2)
    seeded = run.restore_newest_to(tmp_path / "local", world_size=2)
    (seeded / "written-on-scratch").touch()
    assert run.restore_newest_to(tmp_path / "local", world_size=2) == seeded
    assert (seeded / "written-on-scratch").exists(), "not copied again over the processes' copy"


def test_an_assembled_checkpoint_appears_under_its_name_with_its_world_size(tmp_path):
    run = CheckpointStore(RunFolder(tmp_path / "shared"), MARKER, keep=2)
    for step in (10, 20):
        write_checkpoint(run.folder, step, world_size=2)
    assembly = run.assembly("checkpoint-30", "@host@123")
    assert assembly.name.startswith(".") and complete_checkpoints(run.folder, MARKER)[-1][0] == 20
    assembly.mkdir()
    (assembly / MARKER).write_text("{}")
    run.publish(assembly, world_size=2)
    assert [step for step, _ in run.complete()] == [20, 30]
    assert json.loads((run.folder / "checkpoint-30" / "world.json").read_text()) == {"world_size": 2}
    assert not assembly.exists()


# A stand-in for torchrun: a worker in a session of its own, which exits with 3 on USR1.
WORKER = """
import signal, sys, time
signal.signal(signal.SIGUSR1, lambda *_: sys.exit(3))
print("worker ready", flush=True)
time.sleep(60)
"""
LAUNCHER = f"""
import subprocess, sys
sys.exit(subprocess.Popen([sys.executable, "-c", {WORKER!r}], start_new_session=True).wait())
"""


def test_a_stop_that_comes_just_after_the_processes_agreed_is_counted_at_the_next_step(tmp_path, monkeypatch):
    """With several processes, each step ends with an all-reduce of "was I asked to stop?". A
    signal that reaches one process just after that all-reduce, before it answered, must not make it
    stop alone: it would wait in its checkpoint's barrier while the others trained on (a two-node
    run hung so, until its launchers were killed). It answers what all agreed, and the signal counts
    at the next step's end."""
    import torch.distributed

    (tmp_path / "scratch").mkdir()
    spec = PieceSpec(
        task="command",
        run_id="r1",
        piece=1,
        data={"all": tmp_path},
        identity={"dataset": {}, "training": {}},
        model=None,
        work_dir=tmp_path / "scratch",
        store=CheckpointStore(RunFolder(tmp_path / "checkpoints"), "COMPLETE"),
        tracking_dir=tmp_path / "tensorboard",
        tracking="tensorboard",
        checkpoint_every=CheckpointInterval(steps=10),
        stop_grace_seconds=1,
        threads=1,
    )
    piece = TrainingProcess(spec, Rank(rank=1, local_rank=1, world_size=2))
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        agree = torch.distributed.all_reduce

        def agree_then_signalled(tensor, op):
            agree(tensor, op=op)
            piece._receive(signal.SIGUSR1, None)  # its handler, as the signal comes now

        monkeypatch.setattr(torch.distributed, "all_reduce", agree_then_signalled)
        assert piece.stop_requested() is False, "the answer all agreed on"
        monkeypatch.setattr(torch.distributed, "all_reduce", agree)
        assert piece.stop_requested() is True and piece.received == "SIGUSR1"
    finally:
        torch.distributed.destroy_process_group()


def test_a_stop_reaches_the_launchers_workers_and_the_launcher_itself_ignores_usr1(tmp_path):
    """torchrun must not take USR1 itself (its failure path skips the barrier the other nodes wait
    at): the job passes the signal to its workers, which live in sessions of their own."""
    stop = StopForwarder(tmp_path / "stop-requested", to_children=True)

    def signal_like_slurm() -> None:  # --signal=USR1@... reaches every process of the job step
        os.kill(stop.program, signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)

    threading.Timer(3, signal_like_slurm).start()
    code, tail = run_program([sys.executable, "-c", LAUNCHER], dict(os.environ), stop, 30)
    assert "worker ready" in tail
    assert code == 3, "the worker got USR1 and ended the launcher with its exit code"
    assert (tmp_path / "stop-requested").read_text() == "SIGUSR1", "the stop file names the signal"


def two_process_config(workdir: Path, data: Path, model: Path) -> None:
    config = workflow_config(data, model, workdir / "scratch", grid={"seed": [7]})
    config["training"]["epochs"] = 4  # 56 steps: a kill at 10, a stop at 20, then the rest
    config["checkpointing"] = {"every_steps": 10, "keep": 2}
    write_config(workdir, config)


@pytest.fixture(scope="session")
def uninterrupted_two_process_run(tmp_path_factory, bbc_subset, tiny_model) -> Path:
    workdir = tmp_path_factory.mktemp("two-processes")
    two_process_config(workdir, bbc_subset, tiny_model)
    run_workflow(workdir, *TWO_PROCESSES)
    return workdir


def wait_for_step(workdir: Path, workflow: subprocess.Popen, step: int) -> Path:
    """The shared checkpoint of `step` (or later), once it is complete."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and workflow.poll() is None:
        for folder in (workdir / "checkpoints").glob("*"):
            found = [path for done, path in complete_checkpoints(folder, MARKER) if done >= step]
            if found:
                return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint of step {step}; the workflow said:\n{workflow.communicate()[0][-4000:]}")


def training_processes(workdir: Path) -> dict[int, int]:
    """rank -> pid of the torchrun workers training in `workdir`."""
    workers = processes_in(workdir, "scratchflow.distributed")
    return {int(environ["RANK"]): pid for pid, environ in workers.items() if "RANK" in environ}


def train_log(workdir: Path) -> str:
    return "".join(path.read_text() for path in (workdir / "logs" / "train").glob("*.log"))


@pytest.mark.slow
def test_two_processes_killed_stopped_and_resumed_end_like_an_uninterrupted_run(
    tmp_path, bbc_subset, tiny_model, uninterrupted_two_process_run
):
    """One grid point trained by 2 processes: a rank SIGKILLed fails the job within seconds; a resume
    with 1 process is refused; USR1 to the job makes both ranks stop at one step with a checkpoint
    holding both ranks' random states; the last resume ends with the uninterrupted run's metrics."""
    two_process_config(tmp_path, bbc_subset, tiny_model)
    one_fault_at_a_time = ("--retries", "0")  # each fault is followed by hand, not by the profile's retry

    workflow = start_workflow(tmp_path, *TWO_PROCESSES, *one_fault_at_a_time)
    wait_for_step(tmp_path, workflow, 10)
    os.kill(training_processes(tmp_path)[1], signal.SIGKILL)
    killed_at = time.monotonic()
    output = workflow.communicate(timeout=120)[0]
    assert workflow.returncode != 0
    assert time.monotonic() - killed_at < 30, "a dead rank fails the job at once, not at the wall time"
    assert "TrainingFailed: torchrun exited with" in live_pieces(tmp_path)[0]["outcome"], output[-3000:]
    assert "SIGKILL" in train_log(tmp_path)
    assert training_processes(tmp_path) == {}, "no rank trains on as an orphan"

    refused = run_workflow(tmp_path, *one_fault_at_a_time, check=False)
    assert refused.returncode != 0
    assert "WorldSizeChanged" in live_pieces(tmp_path)[1]["outcome"]
    assert "was written by 2 training process(es), and this job trains with 1" in train_log(tmp_path)

    workflow = start_workflow(tmp_path, *TWO_PROCESSES, *one_fault_at_a_time)
    wait_for_step(tmp_path, workflow, 20)
    os.kill(job_process(tmp_path), signal.SIGUSR1)
    output = workflow.communicate(timeout=120)[0]
    stopped = live_pieces(tmp_path)[2]
    assert (stopped["outcome"], stopped["signal"]) == ("paused", "SIGUSR1"), output[-3000:]
    step = stopped["reached_step"]
    checkpoint = next((tmp_path / "checkpoints").glob(f"*/checkpoint-{step}"))
    assert {"rng_state_0.pth", "rng_state_1.pth", "world.json", MARKER} <= {path.name for path in checkpoint.iterdir()}

    run_workflow(tmp_path, *TWO_PROCESSES)

    (record,) = (tmp_path / "results" / "runs").glob("*/record.json")
    last = json.loads(record.read_text())["pieces"][-1]
    assert (last["outcome"], last["world_size"], last["resumed_from_step"]) == ("finished", 2, step)
    assert same_metrics(tmp_path, uninterrupted_two_process_run)
    assert list((tmp_path / "scratch").iterdir()) == []


@pytest.fixture(scope="session")
def tiny_model_without_dropout(tmp_path_factory, bbc_subset) -> Path:
    from scratchflow.tiny_model import build_tiny_bert

    texts = [example.text for example in load_examples(bbc_subset, "folder", "text", "label")]
    folder = tmp_path_factory.mktemp("tiny-bert-without-dropout")
    return build_tiny_bert(texts, folder / "tiny-bert", dropout=0.0)


def trained_weights(workdir: Path) -> dict:
    from safetensors.torch import load_file

    (model,) = (workdir / "results" / "runs").glob("*/model/model.safetensors")
    return load_file(model)


@pytest.mark.slow
def test_two_processes_log_the_models_losses_and_train_like_one_process_with_their_global_batch(
    tmp_path, bbc_subset, tiny_model_without_dropout
):
    """2 processes of 7 examples a step against 1 process of 14, the same 14 examples each step: no
    dropout (nothing random after the classifier head is made), and 14 divides the 210 training
    examples (no epoch ends in a short batch that 2 processes would fill up from the split's start).
    The Trainer multiplied the loss by the number of processes (hf_trainer.ExactlyResumableTrainer):
    every logged loss was twice the one-process run's, and so were the gradients. Now the training
    and validation losses (in the 1 x 1 run the validation loss is computed in one process) and the
    gradient norms agree point for point, and the weights agree to float32 noise: the two runs sum
    each step's gradient in another order (two half-batch means averaged against one mean), which
    moves the last bits of each step, and Adam carries that on (measured: 4e-7 apart, weights of
    order 1)."""
    curves, weights = {}, {}
    for processes, batch_size in ((1, 14), (2, 7)):
        workdir = tmp_path / f"{processes}-processes"
        config = workflow_config(bbc_subset, tiny_model_without_dropout, workdir / "scratch", grid={"seed": [0]})
        config["training"].update(batch_size=batch_size, epochs=2)
        config["checkpointing"] = {"every_steps": 1000, "keep": 1}
        write_config(workdir, config)
        run_workflow(workdir, "--set-resources", f"train:processes_per_node={processes}", "--until", "train")
        (run,) = (workdir / "results" / "runs").iterdir()
        curves[processes] = read_curves(run / TENSORBOARD_FOLDER)
        weights[processes] = trained_weights(workdir)
    for tag in ("train/loss", "eval/loss", "train/grad_norm"):
        one, two = curves[1][tag], curves[2][tag]
        assert [step for step, _ in two] == [step for step, _ in one], tag
        assert [value for _, value in two] == pytest.approx([value for _, value in one], rel=1e-4), tag
    assert weights[2].keys() == weights[1].keys()
    largest = max((weights[2][name] - weights[1][name]).abs().max().item() for name in weights[1])
    assert largest < 1e-5, f"the weights differ by up to {largest}"


def test_a_piece_spec_names_the_jobs_node_as_slurm_does_and_reads_back_whole(tmp_path, monkeypatch):
    """Node rank 0 must run where the job runs; Slurm's node name is not the host's (on the test
    cluster: n1 on the host vm), and a spec naming the host stopped every several-node job."""
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    spec = PieceSpec(
        task="text-classification",
        run_id="r1",
        piece=2,
        data={"all": tmp_path / "data"},
        identity={"dataset": {"format": "folder"}, "training": {"seed": 0}},
        model=None,
        work_dir=tmp_path / "scratch",
        store=CheckpointStore(RunFolder(tmp_path / "checkpoints"), "trainer_state.json", keep=3),
        tracking_dir=tmp_path / "tensorboard",
        tracking="tensorboard",
        checkpoint_every=CheckpointInterval(steps=20),
        stop_grace_seconds=60,
        threads=4,
        shape=Shape(2, 2),
        budget_epochs=1,
        staging=Staging(tmp_path / "a.tar", tmp_path / "a.manifest.json", None),
    )
    assert spec.batch_node == "n1"
    spec.write(tmp_path / "launch.json")
    assert PieceSpec.read(tmp_path / "launch.json") == spec
