"""A researcher's worst day, on the real test cluster: jobs cancelled, timed out, requeued, a killed
Snakemake, a restarted controller, a failing step. Each ends in a clean resume or a clear error,
with every result either whole or absent.

All run the edinburgh profile (layered with tests/slurm_overlay), whose jobs use the submitting
environment's software, so that each test pays for its fault rather than for building a venv.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import (
    ACTIVATED,
    REPO,
    SLOWING,
    TRAINER_SCRIPT_LAB,
    USER,
    command_config,
    different_curves,
    different_results,
    git,
    halving_search,
    lab_pipeline,
    live_pieces,
    long_run,
    mlp_run,
    netscratch_directory,
    processes_in,
    profile_with,
    published_checkpoint,
    queued_jobs,
    recipe,
    same_metrics,
    same_results,
    same_weights,
    sbatch_lines,
    scratch_named_in_logs,
    script_config,
    slowed_copy_running,
    slowed_tools,
    slurm_workflow_command,
    slurm_workflow_env,
    switched_profile,
    two_node_config,
    write_config,
)
from local_slurm import FRAGILE_NODES, is_zombie
from scratchflow import __version__
from scratchflow.classification import TRAINER_CHECKPOINT_MARKER

pytestmark = pytest.mark.slow

PROFILE = "edinburgh"
STATUS_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "status.py"
SCRATCH = Path(f"/disk/scratch/{USER}")  # the profile's node-local scratch root


@pytest.fixture(autouse=True)
def node_local_scratch_removed(request):
    """After each test, every node-local scratch its jobs used is gone: each one its jobs' logs name
    (tests side by side share the nodes' disks, so what else is there is not this test's)."""
    SCRATCH.mkdir(parents=True, exist_ok=True)
    workdir = request.getfixturevalue(
        "netscratch_workdir" if "netscratch_workdir" in request.fixturenames else "tmp_path"
    )
    yield
    stop_what_is_left()
    used = scratch_named_in_logs(workdir)
    assert used, "the jobs' logs name the scratch they used"
    assert [path for path in used if path.exists()] == [], "every job removed its node-local scratch"


def configure_long_run(workdir: Path, data: Path, model: Path) -> dict:
    """The long run of conftest, with the profile's cluster facts (its scratch root)."""
    long_run(workdir, data, model)
    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    del config["cluster"]
    write_config(workdir, config)
    return config


def start(
    slurm,
    workdir: Path,
    *arguments: str,
    profile: str = PROFILE,
    env: dict[str, str] | None = None,
    pipeline: bool = False,
) -> subprocess.Popen:
    """The profile's command in the background (with `pipeline`, `workdir` is a lab's pipeline, run
    with its own Snakefile and profile layer); its output goes to <workdir>.out."""
    output = open(workdir.with_suffix(".out"), "w")  # noqa: SIM115 (closed by finish)
    workflow = subprocess.Popen(
        slurm_workflow_command(slurm, profile, *arguments, pipeline=workdir if pipeline else None),
        cwd=workdir,
        env=slurm_workflow_env(slurm, env),
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    _started.append(workflow)
    return workflow


_started: list[subprocess.Popen] = []


def stop_what_is_left() -> None:
    """A workflow a failed test left running is stopped as a user stops one (Ctrl-C: Snakemake
    cancels its Slurm jobs), so that its jobs hold no GPU the tests beside it wait for."""
    for workflow in _started:
        if workflow.poll() is None:
            workflow.send_signal(signal.SIGINT)
            try:
                workflow.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(workflow.pid, signal.SIGKILL)
                workflow.wait()
    _started.clear()


def finish(workflow: subprocess.Popen, workdir: Path, timeout: float = 480) -> tuple[int, str]:
    returncode = workflow.wait(timeout=timeout)
    if returncode != 0:
        print(job_logs(workdir))  # pytest shows it where the test fails: what the jobs themselves said
    return returncode, workdir.with_suffix(".out").read_text()


def job_logs(workdir: Path, newest: int = 4, tail: int = 3000) -> str:
    """The ends of the newest Slurm job logs and rule logs in `workdir`."""
    logs = [*(workdir / ".snakemake" / "slurm_logs").rglob("*.log"), *(workdir / "logs").rglob("*.log")]
    logs.sort(key=lambda path: path.stat().st_mtime)
    return "\n".join(f"--- {path}:\n{path.read_text(errors='replace')[-tail:]}" for path in logs[-newest:])


def wait_until(condition, workflow: subprocess.Popen, workdir: Path, what: str, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        if workflow.poll() is not None:
            break
        time.sleep(0.2)
    output = workdir.with_suffix(".out").read_text()
    # What Slurm says of the jobs and the nodes (a job pending for a reason, a node not responding).
    queue = slurm_now(workflow)
    raise AssertionError(f"{what} did not happen; Slurm says:\n{queue}\nthe workflow said:\n{output[-4000:]}")


def slurm_now(workflow: subprocess.Popen) -> str:
    """squeue and sinfo, asked the way the workflow asks (its namespace, its SLURM_CONF), and the
    last errors the daemons logged (why a node was drained, say)."""
    namespace = next((part for part in workflow.args if str(part).startswith("--net=")), None)
    inside = ["nsenter", namespace] if namespace else []
    try:
        listed = Path(f"/proc/{workflow.pid}/environ").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "(the workflow has ended: no Slurm configuration to ask with)"
    env = {**os.environ, **dict(line.split("=", 1) for line in listed if line.startswith("SLURM_CONF="))}
    shown = []
    for command in (["squeue", "-o", "%i %T %r %N %k"], ["sinfo", "-N", "-o", "%N %T %E"]):
        done = subprocess.run([*inside, *command], capture_output=True, text=True, env=env)
        lines = (done.stdout + done.stderr).splitlines()
        shown.append("\n".join(dict.fromkeys(lines)))  # sinfo -N lists a node once per partition
    logs = Path(env.get("SLURM_CONF", "/nonexistent")).parent.parent / "log"  # LocalSlurm's root/etc, root/log
    for log in sorted(logs.glob("slurm*.log")):
        logged = log.read_text(errors="replace").splitlines()
        # Not the MPI plugins every slurmd fails to load at its start (no PMIx on this machine).
        errors = [line for line in logged if "error" in line.lower() and "pmix" not in line and "MPI:" not in line]
        if errors:
            shown.append(f"{log.name}, its last errors:\n" + "\n".join(errors[-8:]))
    return "\n".join(shown)


def first_checkpoint(workdir: Path, marker: str = TRAINER_CHECKPOINT_MARKER):
    """The checkpoint folder of the (only) run, once it holds a published checkpoint."""
    folders = [path for path in (workdir / "checkpoints").glob("*") if path.is_dir()]
    return folders[0] if folders and published_checkpoint(folders[0], marker) else None


def active_jobs(slurm, workdir: Path, rule: str) -> list[str]:
    """Ids of the running jobs of `rule` of the workflow in `workdir`."""
    return queued_jobs(slurm, workdir, rule, states="RUNNING")


def grid_status(slurm, workdir: Path) -> str:
    """What `scripts/status.py` prints for the grid in `workdir`, asking the test cluster's squeue."""
    return slurm.run(sys.executable, str(STATUS_SCRIPT), str(workdir)).stdout


def pieces_of(workdir: Path) -> list[dict]:
    (run,) = (workdir / "results" / "runs").iterdir()
    return json.loads((run / "record.json").read_text())["pieces"]


def states(slurm, job_ids: list[str]) -> list[str]:
    listing = slurm.run("sacct", "-X", "-n", "--parsable2", "--format=JobID,State", "-j", ",".join(job_ids)).stdout
    by_id = dict(line.split("|") for line in listing.splitlines() if line)
    return [by_id[job_id].split()[0] for job_id in job_ids]


def gpu_hours_in_sacct(slurm, workdir: Path) -> float:
    """The GPU-hours of every job run in `workdir` in the last day, as sacct tells them (its Elapsed
    and AllocTRES, read here on their own: the figures scratchflow.accounting is checked against)."""
    listing = slurm.run(
        "sacct", "-X", "--duplicates", "-a", "-n", "-P", "-S", "now-1days", "-o", "WorkDir,Elapsed,AllocTRES"
    ).stdout
    hours = 0.0
    for line in listing.splitlines():
        directory, elapsed, allocated = line.split("|")
        if Path(directory).resolve() != workdir.resolve():
            continue
        days, _, clock = elapsed.rpartition("-")
        h, m, s = map(int, clock.split(":"))
        gpus = re.search(r"gres/gpu=(\d+)", allocated)
        hours += (int(days or 0) * 86400 + h * 3600 + m * 60 + s) / 3600 * (int(gpus.group(1)) if gpus else 0)
    return hours


def assert_the_cost_is_sacct_s(slurm, workdir: Path, table: str) -> None:
    """`table` (runs.tsv, or a search's rungs.tsv: every run it trained) holds every GPU-hour the
    grid's jobs held, as sacct has them, shared out to its runs; the status says the spend too, and
    that the test cluster records no energy."""
    runs = pd.read_csv(workdir / "results" / table, sep="\t")
    held = gpu_hours_in_sacct(slurm, workdir)
    assert held > 0 and runs["gpu_hours"].sum() == pytest.approx(held, abs=1e-5 * len(runs))
    assert (runs["gpu_hours"] > 0).all() and (runs["lost_gpu_hours"] <= runs["gpu_hours"]).all()
    assert runs["energy_kwh"].isna().all(), "the test cluster has no energy plugin: not recorded, not 0"
    spend = grid_status(slurm, workdir).splitlines()[-1]
    assert re.match(
        r"spent so far: [\d.e-]+ GPU-hours \(\d+% lost to faults\), [\d.e-]+ CPU-hours, energy not recorded", spend
    )


def stopped_at(piece: dict, signal_name: str, workdir: Path) -> int:
    """The step a piece of the run in `workdir` stopped at on `signal_name`; else the piece's log."""
    paused = (piece["outcome"], piece.get("signal"), piece.get("phase")) == ("paused", signal_name, "training")
    if not (paused and piece.get("reached_step") is not None):
        log = workdir / piece.get("log", "no log recorded")
        tail = log.read_text()[-8000:] if log.is_file() else f"(no {log})"
        pytest.fail(f"{piece['outcome']!r} in {piece}; its log ends:\n{tail}")
    return piece["reached_step"]


def test_packed_runs_share_a_slurm_job_of_one_gpu_and_a_cancelled_pack_resumes_each_run(
    slurm, tmp_path, bbc_subset, tiny_model, uninterrupted_long_run
):
    """cluster.pack_runs: 2 packs the grid's two runs into one Slurm job that asks for one run's GPU
    and both runs' wall time, and trains them one after the other. Cancelled (SIGTERM, as any train
    job) while the second run trains, the pack is retried: the first run resumes from its final
    checkpoint (no step trained twice), the second from the checkpoint it saved on SIGTERM, and each
    ends as if never interrupted."""
    config = configure_long_run(tmp_path, bbc_subset, tiny_model)
    config["grid"]["seed"] = [7, 8]
    config["cluster"] = recipe("packed-runs.yaml")["cluster"]  # the README's recipe: pack_runs: 2
    write_config(tmp_path, config)
    workflow = start(slurm, tmp_path)

    def second_run_checkpointed() -> bool:
        trained = list((tmp_path / "results" / "runs").glob("*/record.json"))
        training = [path for path in (tmp_path / "checkpoints").glob("*") if path.is_dir()]
        return len(trained) == 1 and any(
            folder.name != trained[0].parent.name and published_checkpoint(folder, TRAINER_CHECKPOINT_MARKER)
            for folder in training
        )

    wait_until(second_run_checkpointed, workflow, tmp_path, "the second run's first checkpoint", timeout=400)
    (pack,) = active_jobs(slurm, tmp_path, "packed_train")
    # The grid's status, while it trains: where, how far, how fast.
    node = slurm.run("squeue", "-h", "-j", pack, "-o", "%N").stdout.strip()  # with tests beside, n1 or n2
    training = (
        rf"trains +piece 1, step \d+ of 280 \(\d+%\), [\d.]+ samples/s, .* \(Slurm job {pack} running on {node}\)"
    )
    assert re.search(training, grid_status(slurm, tmp_path))
    slurm.run("scancel", pack)  # SIGTERM to every process of the job, SIGKILL after KillWait

    returncode, output = finish(workflow, tmp_path)
    assert returncode == 0, output[-6000:]
    packs = sbatch_lines(output, "packed_train")
    assert len(packs) == 2 and not sbatch_lines(output, "train"), "the pack, and the pack again"
    # One run's GPU, CPUs and memory (the profile's); the runtimes of the two, and the pack job's minute.
    for line, minutes in zip(packs, (2 * 720 + 1, 2 * 1440 + 1), strict=True):
        for flag in ("--gres=gpu:1", "--cpus-per-task=4", "--mem 32000", f"-t {minutes} "):
            assert flag in line, f"{flag!r} missing from {line[:1500]}"
    assert len(sbatch_lines(output, "packed_predict")) == 1
    pieces = {
        run.name: json.loads((run / "record.json").read_text())["pieces"]
        for run in (tmp_path / "results" / "runs").iterdir()
    }
    (finished_first,) = [run for run, (first, _) in pieces.items() if first["outcome"] == "finished"]
    (stopped,) = [run for run in pieces if run != finished_first]
    first, again = pieces[finished_first]
    assert first["slurm_job_id"] == pieces[stopped][0]["slurm_job_id"] == pack
    assert again["resumed_from_step"] == first["reached_step"] == 280 and again["outcome"] == "finished"
    cancelled, resumed = pieces[stopped]
    assert (
        resumed["resumed_from_step"] == stopped_at(cancelled, "SIGTERM", tmp_path) and resumed["outcome"] == "finished"
    )
    assert resumed["slurm_job_id"] == again["slurm_job_id"] != pack
    assert states(slurm, [pack, resumed["slurm_job_id"]]) == ["CANCELLED", "COMPLETED"]
    assert grid_status(slurm, tmp_path).splitlines()[-2] == "2 runs: 2 finished"
    assert json.loads((tmp_path / "results" / "packs" / "train-0.json").read_text())["runs"] == sorted(pieces)
    assert_the_cost_is_sacct_s(slurm, tmp_path, "runs.tsv")
    assert same_results(tmp_path, uninterrupted_long_run) == []


def process_status(pid: int) -> dict[str, str] | None:
    """The fields of /proc/<pid>/status; None once the process has ended."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except FileNotFoundError:
        return None
    return {name: value.strip() for name, _, value in (line.partition(":") for line in lines)}


def stopped(pid: int) -> bool:
    """Whether a process is stopped (SIGSTOP takes effect a moment after it is sent), or gone."""
    status = process_status(pid)
    return status is None or status["State"].startswith("T")


def held_until_signalled(pid: int, signal_number: int) -> bool:
    """Whether a process held with SIGSTOP got `signal_number`: waiting for it, or already let go
    (slurmstepd sends SIGCONT with the signals it delivers) or ended."""
    status = process_status(pid)
    if status is None:
        return True
    pending = any(int(status[mask], 16) >> (signal_number - 1) & 1 for mask in ("SigPnd", "ShdPnd"))
    return pending or not status["State"].startswith("T")


# A lab's program of four moods, by its parameter `mood`: two train, one has a bug at step 20, one's
# loss becomes NaN at step 10 (scratchflow.program's helpers).
MOODY_PROGRAM = """from scratchflow import program as scratchflow
mood = scratchflow.params()["mood"]
for step in range(1, 41):
    if mood == "buggy" and step == 20:
        raise ValueError("shapes (8, 10) and (12, 2) not aligned")
    scratchflow.end_if_diverged(float("nan") if mood == "diverging" and step == 10 else 1.0 / step, step)
scratchflow.write_metrics({"accuracy": 0.9 if mood == "good" else 0.6, "test_loss": 0.5})
"""


def test_a_grid_where_one_run_has_a_bug_and_one_diverges_submits_each_once_and_compares_the_rest(
    slurm, tmp_path, bbc_subset
):
    """A grid of 4 on the test Slurm (edinburgh's profile, `retries: 2`): the buggy run's train job is
    submitted once and ends the run `failed` with the program's file and line; the diverging one ends
    `diverged`, ranked last; the other two are compared; the workflow exits 1 naming both. The same
    command after the fix submits the fixed run's jobs alone. No run submits a predict job: the two
    with no model have nothing to predict, the two with one were predicted by their train jobs as
    they ended, and the workflow's own Snakemake says so and moves those predictions into place."""
    program = tmp_path / "moody.py"
    program.write_text(MOODY_PROGRAM)
    config = command_config(bbc_subset, scratch=None, command=["python", str(program)], mood="good")
    config["grid"] = {"mood": ["good", "fair", "buggy", "diverging"]}
    config["aggregate"] = {"metric": "accuracy", "goal": "max"}
    del config["cluster"]
    write_config(tmp_path, config)
    returncode, output = finish(start(slurm, tmp_path, "--verbose"), tmp_path)
    assert returncode == 1, output[-6000:]
    runs = {
        json.loads(path.read_text())["mood"]: path.parent.name for path in tmp_path.glob("results/runs/*/params.json")
    }
    assert len(sbatch_lines(output, "train")) == 4, "one train job each: nothing retried"
    assert not sbatch_lines(output, "predict"), "a run with no model, or predicted as it ended, needs no job"
    assert [line for line in sbatch_lines(output, "train") if runs["buggy"] in line], "the buggy run's, once"
    said = (
        f"run {runs['buggy']} failed: CommandFailed: the command ['python', '{program}'] exited with 1, its last "
        "line: ValueError: shapes (8, 10) and (12, 2) not aligned"
    )
    assert "scratchflow: 1 of 4 runs failed, each in a way a retry cannot fix" in output and said in output
    assert f"at {program}:5 (in <module>)" in output, "the line of the program's bug"
    assert f"run {runs['diverging']} diverged at step 10: the loss became nan" in output
    table = pd.read_csv(tmp_path / "results" / "runs.tsv", sep="\t")
    assert list(table["outcome"]) == ["finished", "finished", "diverged", "failed"]
    assert list(table["mood"]) == ["good", "fair", "diverging", "buggy"]
    page = (tmp_path / "results" / "summary.html").read_text()
    assert html.escape(said) in page and f"run {runs['diverging']} diverged" in page

    program.write_text(MOODY_PROGRAM.replace('mood == "buggy" and step == 20', "False"))  # the fix
    returncode, output = finish(start(slurm, tmp_path, "--verbose"), tmp_path)
    assert returncode == 0, output[-6000:]
    (again,) = sbatch_lines(output, "train")
    assert runs["buggy"] in again, "the fixed run alone trains again"
    assert list(pd.read_csv(tmp_path / "results" / "runs.tsv", sep="\t")["outcome"]) == [
        "finished", "finished", "finished", "diverged"
    ]  # fmt: skip


def test_a_job_at_its_wall_time_saves_on_the_warning_and_requeues_itself_spending_no_retry(
    slurm, tmp_path, bbc_subset, tiny_model, uninterrupted_long_run
):
    """With USR2 as the stop signal (checkpointing.stop_signal), as where NCCL takes USR1 for itself:
    Slurm's own warning (`--signal=USR2@90`) before a three-minute limit reaches the trainer, which
    saves, and its job requeues itself under its id (`scontrol requeue`, as a preempted one does):
    with no retry to spend (--retries 0), no error in the workflow's output, the job's next run
    resumes and ends with the weights of an uninterrupted run (both runs of a requeued job are
    counted as sacct has them: the preemption test). slurmctld checks time limits every 30 s and
    sends the warning at the first check that finds fewer than 90 + 30 s left: 60 to 90 s into the
    job. The long run trains for about 10 s, so once its first checkpoint is on shared storage (its
    trainer listens by then) the trainer is held with SIGSTOP until the warning waits for it, then
    let go: it takes the signal at once, as a trainer still training would. The requeued job waits
    Slurm's requeue delay (120 s) before it may start: it is started once nothing of its first run
    is left."""
    config = configure_long_run(tmp_path, bbc_subset, tiny_model)
    config["checkpointing"]["stop_signal"] = "USR2"
    write_config(tmp_path, config)
    three_minutes = {"train": {"runtime": "3*attempt", "slurm_extra": "--signal=USR2@90"}}
    profile = profile_with(PROFILE, tmp_path / "profile", three_minutes)
    workflow = start(slurm, tmp_path, "--retries", "0", profile=str(profile))
    wait_until(lambda: first_checkpoint(tmp_path), workflow, tmp_path, "a first checkpoint")
    (job,) = active_jobs(slurm, tmp_path, "train")
    trainer, _environ = wait_until(lambda: trainer_of(job), workflow, tmp_path, "the trainer")
    os.kill(trainer, signal.SIGSTOP)
    try:
        wait_until(lambda: stopped(trainer), workflow, tmp_path, "the trainer to stop")
        wait_until(
            lambda: held_until_signalled(trainer, signal.SIGUSR2), workflow, tmp_path, "the warning", timeout=150
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(trainer, signal.SIGCONT)
    wait_until(lambda: pending_again(slurm, job), workflow, tmp_path, "the job requeued")
    start_now_if_held(slurm, job)
    returncode, output = finish(workflow, tmp_path)
    assert returncode == 0, output[-6000:]
    assert "Error in rule" not in output and "CalledProcessError" not in output, output[-6000:]

    first, second = pieces_of(tmp_path)
    step = stopped_at(first, "SIGUSR2", tmp_path)
    assert step > 20, "it trained on until the warning"
    assert first["slurm_job_id"] == second["slurm_job_id"] == job, "requeued, not retried"
    assert first["requeued"] == "time limit" and second["requeued"] is None
    assert second["resumed_from_step"] == step and second["outcome"] == "finished"
    runs = slurm.run("sacct", "-X", "-D", "-n", "-P", "-o", "State", "-j", job).stdout.split()
    assert runs == ["REQUEUED", "COMPLETED"], runs
    assert same_results(tmp_path, uninterrupted_long_run) == []


def test_a_halving_search_with_a_rung_cancelled_decides_and_ends_as_the_uninterrupted_search(
    slurm, tmp_path, bbc_subset, tiny_model, uninterrupted_halving_search
):
    """config/tests/halving-search.yaml (conftest.halving_search) with Edinburgh's profile: a rung's
    job is cancelled after its first checkpoint, and its retry resumes from it. The rung's decision
    is the uninterrupted search's, value for value, and the run that goes on ends with its weights."""
    halving_search(tmp_path, bbc_subset, tiny_model, scratch=None)
    workflow = start(slurm, tmp_path)
    cancelled = wait_until(lambda: first_checkpoint(tmp_path), workflow, tmp_path, "a rung's first checkpoint").name
    (job,) = active_jobs(slurm, tmp_path, f"train_rung_wildcards_{cancelled}_0")
    slurm.run("scancel", job)
    returncode, output = finish(workflow, tmp_path)
    assert returncode == 0, output[-6000:]

    rung = json.loads((tmp_path / "results" / "runs" / cancelled / "rung-0.json").read_text())
    stopped, resumed = rung["pieces"]
    assert stopped["slurm_job_id"] == job and resumed["resumed_from_step"] == stopped_at(stopped, "SIGTERM", tmp_path)
    assert resumed["outcome"] == "finished" and rung["global_steps"] == 140, "the retry finished the rung"
    reference = uninterrupted_halving_search / "results"
    decision = json.loads((tmp_path / "results" / "search" / "rung-0.json").read_text())
    expected = json.loads((reference / "search" / "rung-0.json").read_text())
    assert (decision["values"], decision["promoted"]) == (expected["values"], expected["promoted"])
    (promoted,) = decision["promoted"]
    for name in ("metrics.json", "predictions.csv", "model/model.safetensors"):
        written = tmp_path / "results" / "runs" / promoted / name
        assert written.read_bytes() == (reference / "runs" / promoted / name).read_bytes(), name
    assert_the_cost_is_sacct_s(slurm, tmp_path, "search/rungs.tsv")  # the runs it stopped early too


@pytest.mark.alone_on_the_cluster  # the controller's outage would reach every other test's jobs
def test_a_restarted_controller_a_requeued_job_a_killed_snakemake_and_a_failing_predict_lose_nothing(
    slurm, tmp_path, bbc_subset, tiny_model, uninterrupted_long_run
):
    """Four faults in turn on one run, as they come on a real cluster:
    - slurmctld stops and starts again while the job trains: the job lives through the outage and
      trains on after it (its trainer is held with SIGSTOP meanwhile: the run trains for about 10 s
      in all, and a slow machine's restart would otherwise outlast it);
    - the job is requeued (what preemption or a node failure does with --requeue): Slurm kills it
      and queues it again under the same id, and its second start resumes from its checkpoint;
    - Snakemake is SIGKILLed: its job trains on, orphaned; after `--unlock` the same command picks
      up, waits for the orphan if it still runs (checkpoints/<run>/running.json) and resumes from its
      final checkpoint: nothing is trained twice, and the weights are those of an uninterrupted run;
    - the trained weights are then lost and predict runs again (`--forcerun predict`): it fails
      saying where to look, and the train results stay as they were."""
    configure_long_run(tmp_path, bbc_subset, tiny_model)
    workflow = start(slurm, tmp_path)
    wait_until(lambda: first_checkpoint(tmp_path), workflow, tmp_path, "a first checkpoint")
    (job,) = active_jobs(slurm, tmp_path, "train")
    trainer, _environ = wait_until(lambda: trainer_of(job), workflow, tmp_path, "the trainer")
    os.kill(trainer, signal.SIGSTOP)
    restarted_at = max(int(path.name.split("-")[1]) for path in tmp_path.glob("checkpoints/*/checkpoint-*"))
    slurm.restart_controller(down_seconds=5)
    os.kill(trainer, signal.SIGCONT)
    assert active_jobs(slurm, tmp_path, "train") == [job], "the job lived through the outage"
    wait_until(
        lambda: shared_checkpoint_after(tmp_path, restarted_at), workflow, tmp_path, "a checkpoint after the outage"
    )

    slurm.run("scontrol", "requeue", job)
    # Slurm 22.05 keeps the GPU of a job it recovered across the restart allocated after that job
    # ended (GresUsed on an idle node) until it reads its configuration again. Not scratchflow's to fix.
    slurm.run("scontrol", "reconfigure")
    wait_until(lambda: pending_again(slurm, job), workflow, tmp_path, "the requeued job to be pending", timeout=120)
    start_now_if_held(slurm, job)
    wait_until(lambda: len(live_pieces(tmp_path)) == 2, workflow, tmp_path, "the requeued job's start")
    requeued = stopped_at(live_pieces(tmp_path)[0], "SIGTERM", tmp_path)
    assert requeued > restarted_at, "the job trained on through the outage"
    wait_until(
        lambda: shared_checkpoint_after(tmp_path, requeued), workflow, tmp_path, "a checkpoint of the requeued job"
    )
    os.kill(workflow.pid, signal.SIGKILL)  # Snakemake only: its Slurm job trains on, orphaned
    workflow.wait()
    assert active_jobs(slurm, tmp_path, "train") == [job]

    # Snakemake's lock outlives a SIGKILL: lift it (README), then the same command again.
    assert finish(start(slurm, tmp_path, "--unlock"), tmp_path)[0] == 0
    returncode, output = finish(start(slurm, tmp_path), tmp_path)
    assert returncode == 0, output[-6000:]
    first, second, *reruns = pieces_of(tmp_path)
    assert first["slurm_job_id"] == second["slurm_job_id"] == job and first["requeued"] == "requeued"
    assert first["resumed_from_step"] is None and second["resumed_from_step"] == requeued
    assert second["outcome"] == "finished", "the orphan trained to the end"
    assert all(piece["resumed_from_step"] == second["reached_step"] for piece in reruns), "nothing trained twice"
    assert same_results(tmp_path, uninterrupted_long_run) == []

    (run,) = (tmp_path / "results" / "runs").iterdir()
    (run / "model" / "model.safetensors").unlink()  # the trained weights lost, as on a damaged disk
    predicted = {"metrics.json", "predictions.csv", "predict_record.json", "curves.png"}
    trained = sorted(path.relative_to(run) for path in run.rglob("*") if path.name not in predicted)
    returncode, output = finish(start(slurm, tmp_path, "--forcerun", "predict", "--retries", "0"), tmp_path)
    assert returncode != 0
    assert "Error in rule predict" in output and f"logs/predict/{run.name}.log" in output
    assert "job failed" in (tmp_path / "logs" / "predict" / f"{run.name}.log").read_text()
    status = grid_status(slurm, tmp_path)
    assert f"{run.name}  failed       prediction failed: " in status
    assert f"log: logs/predict/{run.name}.log" in status
    assert sorted(path.relative_to(run) for path in run.rglob("*")) == trained, "train results stay, no half result"


def test_a_labs_trainer_script_cancelled_in_its_pipeline_is_paused_and_its_retry_resumes_to_the_same_result(
    slurm, tmp_path, news_csv, tiny_model, uninterrupted_script_runs
):
    """A lab's pipeline (scripts/new_pipeline.py: scratchflow as its module, the lab's layer over the
    edinburgh profile) whose command task runs the lab's own Hugging Face Trainer script, unchanged,
    from the lab's repository through scratchflow.trainer_script, under scancel: the job passes
    SIGTERM on, the launcher's callback saves and ends the program as a pause, the retry resumes to
    the uninterrupted run's weights and metrics, byte for byte. The record names scratchflow's
    release, the pipeline's commit and the program's (the same repository); the lab's `make status`
    says the run finished and what it cost by Slurm's accounting."""
    config = script_config(news_csv, tiny_model, None, TRAINER_SCRIPT_LAB / "train.py")
    del config["cluster"]
    lab = lab_pipeline(tmp_path, PROFILE, config)
    workflow = start(slurm, lab, pipeline=True)
    # It trains for seconds: cancelled at its first checkpoint on scratch, well before its last step
    wait_until(lambda: checkpoint_on_scratch(lab), workflow, lab, "a first checkpoint on scratch")
    (job,) = active_jobs(slurm, lab, "train")
    slurm.run("scancel", job)

    returncode, output = finish(workflow, lab)
    assert returncode == 0, output[-6000:]
    first, second = pieces_of(lab)
    assert (first["outcome"], first["signal"]) == ("paused", "SIGTERM")
    assert second["resumed_from_step"] == stopped_at(first, "SIGTERM", lab) and second["outcome"] == "finished"
    assert different_results(lab, uninterrupted_script_runs) == []

    (record,) = (json.loads(path.read_text()) for path in lab.glob("results/runs/*/record.json"))
    pipeline_commit = {"commit": git(lab, "rev-parse", "HEAD"), "dirty": False}
    assert record["environment"]["pipeline_git"] == record["training"]["program_git"] == pipeline_commit
    assert record["environment"]["scratchflow_version"] == __version__
    # The lab's own `make status` (its Makefile's line; scratchflow's venv is this one)
    status = slurm.run("make", "-C", str(lab), "status", env=ACTIVATED).stdout
    assert "1 run: 1 finished" in status, status
    assert re.search(r"spent so far: [0-9.e-]+ GPU-hours \(\d+% lost to faults\)", status), status


def checkpoint_on_scratch(workdir: Path) -> bool:
    """Whether the program training in `workdir` has written a complete checkpoint to its scratch."""
    try:
        return any(any(scratch.rglob("checkpoint-*/COMPLETE")) for scratch in scratch_named_in_logs(workdir))
    except OSError:  # a checkpoint pruned while it was looked at
        return False


def test_a_training_preempted_by_a_higher_tier_job_is_requeued_and_resumes_to_the_same_results(
    slurm, tmp_path, bbc_subset, tiny_model, uninterrupted_long_run
):
    """The README's preemptible switch (config/tests/profiles/edinburgh-preemptible.yaml) on the test
    cluster's preemptible partition (PreemptMode=REQUEUE, GraceTime=120, within which the job, done
    saving, requeues itself): a job of the higher tier `urgent` that needs the training's node
    preempts it for real. The training saves on SIGTERM and stops; the job is requeued under the same
    id; the status says the piece was preempted; the job resumes, spending no retry, and the run ends
    with the uninterrupted run's results, byte for byte."""
    configure_long_run(tmp_path, bbc_subset, tiny_model)
    profile = preemptible_profile(tmp_path / "profile", "preemptible")
    workflow = start(slurm, tmp_path, "--retries", "0", profile=str(profile))
    wait_until(lambda: first_checkpoint(tmp_path), workflow, tmp_path, "a first checkpoint")
    job = preempt_the_training(slurm, workflow, tmp_path)
    status = grid_status(slurm, tmp_path)
    assert "stopped on SIGTERM at step" in status and "(preempted: Slurm requeued its job)" in status, status
    start_now_if_held(slurm, job)
    returncode, output = finish(workflow, tmp_path)
    assert returncode == 0, output[-6000:]
    preempted, resumed = pieces_of(tmp_path)
    assert preempted["slurm_job_id"] == resumed["slurm_job_id"] == job, "requeued by Slurm, not retried"
    assert preempted["requeued"] == "preempted" and resumed["requeued"] is None
    assert resumed["resumed_from_step"] == stopped_at(preempted, "SIGTERM", tmp_path) > 0
    assert same_results(tmp_path, uninterrupted_long_run) == []
    assert_the_cost_is_sacct_s(slurm, tmp_path, "runs.tsv")  # both runs of the requeued job


def test_a_preemption_with_no_grace_time_to_save_in_resumes_from_the_checkpoint_before(
    slurm, tmp_path, bbc_subset, tiny_model, uninterrupted_long_run
):
    """A grace time too short to save: the preemptible partition without one (GraceTime=0: SIGTERM,
    then SIGKILL after the cluster's KillWait, 30 s), and a checkpoint whose copy to shared storage
    takes longer than that (rsync slowed by its own --bwlimit once the first checkpoint is there).
    The copy is cut by SIGKILL, its partial left hidden, never taken for a checkpoint; Slurm requeues
    the job under its id; `make status` says the piece was killed, preempted; the next piece resumes
    from the newest whole checkpoint, the one before, spending no retry; the run ends with the
    uninterrupted run's results, byte for byte."""
    configure_long_run(tmp_path, bbc_subset, tiny_model)
    profile = preemptible_profile(tmp_path / "profile", "preemptible-nograce")
    env, flag = slowed_tools(tmp_path, "(no copy yet)")
    workflow = start(slurm, tmp_path, "--retries", "0", profile=str(profile), env=env)
    checkpoints = wait_until(lambda: first_checkpoint(tmp_path), workflow, tmp_path, "a first checkpoint")
    flag.write_text("*checkpoints/*/.checkpoint-*")  # each copy of a checkpoint now takes over a minute
    wait_until(lambda: slowed_copy_running(flag, SLOWING[0]), workflow, tmp_path, "a slowed checkpoint copy")
    job = preempt_the_training(slurm, workflow, tmp_path)
    flag.unlink()
    whole = published_checkpoint(checkpoints, TRAINER_CHECKPOINT_MARKER)
    assert [path.name for path in checkpoints.glob(".checkpoint-*.partial*")], "the SIGKILL cut a copy"
    status = grid_status(slurm, tmp_path)
    assert "was killed (preempted: Slurm requeued its job)" in status, status
    start_now_if_held(slurm, job)
    returncode, output = finish(workflow, tmp_path)
    assert returncode == 0, output[-6000:]

    killed, resumed = pieces_of(tmp_path)
    assert killed["slurm_job_id"] == resumed["slurm_job_id"] == job, "requeued by Slurm, not retried"
    assert (killed["outcome"], killed["requeued"]) == ("killed", "preempted")
    assert resumed["resumed_from_step"] == int(whole.name.split("-")[1]) > 0
    assert same_results(tmp_path, uninterrupted_long_run) == []


def test_a_job_preempted_while_staging_in_and_again_while_syncing_back_loses_nothing(
    slurm, tmp_path, bbc_subset, uninterrupted_command_run
):
    """Preemption at the two moments a job copies rather than trains (the preemptible switch, its
    GraceTime=120, the command task): a higher-tier job takes the node while tar extracts the data
    into node-local scratch, and, once the requeued job has trained, again while rsync copies the
    trained model back to results/ (each copy slowed by the tool's own option, so that the moment can
    be caught; Slurm's SIGTERM reaches tar and rsync as every process of the job). The first piece
    pauses before training; the second makes the copy cut short again, whole, and pauses (the job
    step's Snakemake, which had the SIGTERM too, fails the job and removes its outputs whatever the
    script does: before, that spent a retry and the job was not requeued); each is recorded
    preempted and requeues its job under its id, spending no retry; the third resumes from the final
    checkpoint, trains nothing, and the run ends with the uninterrupted run's metrics and weights."""
    config = command_config(bbc_subset, scratch=None)
    del config["cluster"]
    write_config(tmp_path, config)
    profile = preemptible_profile(tmp_path / "profile", "preemptible")
    env, flag = slowed_tools(tmp_path, "staging")
    workflow = start(slurm, tmp_path, "--retries", "0", profile=str(profile), env=env)
    wait_until(lambda: slowed_copy_running(flag, SLOWING[1]), workflow, tmp_path, "tar's slowed extraction")
    flag.write_text("*results/runs/*/.model.partial*")  # from now on, the sync back is slowed
    job = preempt_the_training(slurm, workflow, tmp_path)
    start_now_if_held(slurm, job)
    wait_until(lambda: slowed_copy_running(flag, SLOWING[0]), workflow, tmp_path, "rsync's slowed sync back")
    flag.unlink()  # the copy made again runs at full speed
    preempt_the_training(slurm, workflow, tmp_path)
    start_now_if_held(slurm, job)
    returncode, output = finish(workflow, tmp_path)
    assert returncode == 0, output[-6000:]

    staging, syncing, last = pieces_of(tmp_path)
    assert (staging["outcome"], staging["signal"], staging["phase"]) == ("paused", "SIGTERM", "staging"), staging
    assert (syncing["outcome"], syncing["signal"], syncing["phase"]) == ("paused", "SIGTERM", "syncing"), syncing
    assert "is not whole" in (tmp_path / syncing["log"]).read_text(), "rsync was cut short"
    assert staging["requeued"] == syncing["requeued"] == "preempted"
    assert staging["slurm_job_id"] == syncing["slurm_job_id"] == last["slurm_job_id"] == job, "no retry spent"
    assert last["resumed_from_step"] == syncing["reached_step"] > 0 and last["outcome"] == "finished"
    (run,) = (tmp_path / "results" / "runs").iterdir()
    assert not [path for path in run.iterdir() if path.name.startswith(".")], "no partial copy left"
    assert same_metrics(tmp_path, uninterrupted_command_run)
    assert same_weights(tmp_path, uninterrupted_command_run, "model.pt")


def preemptible_profile(folder: Path, partition: str) -> Path:
    """The edinburgh profile with the README's preemptible switch, on `partition`, its train jobs
    asking for PREEMPTIBLE_MEMORY_MB."""
    profile = switched_profile(
        "edinburgh-preemptible.yaml", folder, {"partition: preemptible": f"partition: {partition}"}
    )
    settings = yaml.safe_load((profile / "config.v8+.yaml").read_text())
    settings["set-resources"]["train"]["mem_mb"] = PREEMPTIBLE_MEMORY_MB
    (profile / "config.v8+.yaml").write_text(yaml.safe_dump(settings))
    return profile


# Most of a node's memory, so that the urgent job, asking as much, fits there only without the training.
PREEMPTIBLE_MEMORY_MB = 400_000


def preempt_the_training(slurm, workflow: subprocess.Popen, workdir: Path) -> str:
    """A job of the higher tier `urgent` that needs the node of the (only) train job of `workdir`,
    which Slurm then preempts; waits for that job to be requeued. Its id."""
    (job,) = active_jobs(slurm, workdir, "train")
    (node,) = slurm.run("squeue", "-h", "-j", job, "-o", "%N").stdout.split()
    urgent = ["-p", "urgent", "-w", node, f"--mem={PREEMPTIBLE_MEMORY_MB}M", "-D", str(workdir), "-o", "/dev/null"]
    slurm.run("sbatch", *urgent, "--wrap", "sleep 1")
    wait_until(lambda: pending_again(slurm, job), workflow, workdir, "the preempted job to be requeued")
    return job


@pytest.mark.xdist_group("fragile")  # one worker runs them: each loses n3 or n4, which no other test uses
@pytest.mark.usefixtures("fragile_nodes")
def test_a_labs_training_whose_nodes_slurmd_dies_and_whose_old_piece_trains_on_at_another_rate_ends_whole(
    slurm, tmp_path, tmp_path_factory
):
    """A lab's pipeline with its own plain-PyTorch task (ourlab.mlp) trains on n3 (the `fragile`
    partition takes it first; no other test's job is there) when n3's slurmd dies and the job's
    processes live on, frozen until the requeued job holds the run, as by a hung filesystem. Slurm
    declares n3 DOWN after SlurmdTimeout, ends the job NODE_FAIL and requeues it under its id; it
    starts on another node, takes the run's next term and resumes from the newest checkpoint. The
    old piece, thawed with another learning rate given by hand (so that anything it wrote would
    differ), trains on until its next write, finds the newer term and ends superseded: nothing it
    wrote is dated after the newer piece held the run, its job's own Snakemake removes none of the
    newer piece's outputs, the lab's `make status` says so, and the run ends with the weights and
    metrics of the same pipeline run uninterrupted beside it, spending no retry."""
    config = mlp_run(epochs=1000, every_steps=500)
    reference = lab_pipeline(tmp_path_factory.mktemp("uninterrupted") / "ourlab", PROFILE, config)
    lab = lab_pipeline(tmp_path, PROFILE, config)
    layer = lab / "profiles" / PROFILE / "config.v8+.yaml"
    fragile_settings = fragile_profile(PROFILE, tmp_path_factory.mktemp("fragile") / PROFILE) / "config.v8+.yaml"
    fragile = yaml.safe_load(fragile_settings.read_text())
    layer.write_text(layer.read_text() + yaml.safe_dump({"set-resources": fragile["set-resources"]}))
    uninterrupted = start(slurm, reference, pipeline=True)
    workflow = start(slurm, lab, "--retries", "0", pipeline=True)
    wait_until(lambda: first_checkpoint(lab, "COMPLETE"), workflow, lab, "a first checkpoint")
    (job,) = active_jobs(slurm, lab, "train")
    assert slurm.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip() == "n3"
    run = first_checkpoint(lab, "COMPLETE")
    (old_scratch,) = scratch_named_in_logs(lab)

    def another_learning_rate() -> None:
        (old_scratch / "learning-rate").write_text("0.7")  # the run's is 0.1

    old_piece, took_over = requeued_beside_its_old_piece(slurm, workflow, lab, job, ("n3",), another_learning_rate)
    superseded_end = run / "lease" / "000001.superseded"
    wait_until(superseded_end.exists, workflow, lab, "the old piece to find the newer term", timeout=240)
    assert nothing_written_by_the_old_piece_after(run, took_over)
    status = slurm.run("make", "-C", str(lab), "status", env=ACTIVATED).stdout
    assert "piece 1 superseded (trained on after a newer piece took the run over)" in status, status
    returncode, output = finish(workflow, lab)
    assert returncode == 0, output[-6000:]
    assert finish(uninterrupted, reference)[0] == 0
    old, resumed = pieces_of(lab)
    assert old["slurm_job_id"] == resumed["slurm_job_id"] == job, "requeued by Slurm, not retried"
    assert (old["outcome"], old["term"], old["requeued"]) == ("superseded", 1, "node failure"), old
    assert "n3" not in resumed["ranks"] and resumed["resumed_from_step"] == old["reached_step"] > 0
    assert same_weights(lab, reference, "model.pt") and same_metrics(lab, reference)
    assert not still_training(old_piece), "the old piece's processes ended"


def requeued_beside_its_old_piece(
    slurm, workflow: subprocess.Popen, workdir: Path, job: str, nodes: tuple[str, ...], meanwhile=None
) -> tuple[list[int], float]:
    """The slurmd of each of `nodes` (all of `job`'s) dies and the job's processes there live on,
    its Python ones (the training, the job's Snakemake) frozen (SIGSTOP) as by a hung filesystem;
    Slurm requeues the job under its id, and it starts on other nodes. Once its piece holds the run
    (the run's term 2), `meanwhile` is done and the old processes thaw. Their pids, and when the
    newer piece took the run over. Slurm's own processes there (slurmstepd, the batch script's srun)
    touch no shared file and go on: a frozen srun learnt of the node's failure only when thawed,
    after the requeued job had begun its step under the same id, and cancelled that step (CI, once
    in four: "STEP 4.0 ON n4 CANCELLED"), which no hung filesystem does."""
    before = slurm.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()
    lost_at = time.time()
    old_piece = [pid for node in nodes for pid in slurm.stop_answering(node) if runs_python(pid)]
    for pid in old_piece:
        os.kill(pid, signal.SIGSTOP)
    wait_until(
        lambda: requeued_off(slurm, job, before), workflow, workdir, "the job requeued", timeout=LOST_NODE_SECONDS
    )
    if pending_again(slurm, job):  # not in the two minutes Slurm may hold it: the old piece waits frozen
        slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now", check=False)
    (run,) = (workdir / "checkpoints").iterdir()
    newer_term = run / "lease" / "000002"
    wait_until(newer_term.exists, workflow, workdir, "the requeued job's piece holding the run", timeout=240)
    if meanwhile is not None:
        meanwhile()
    for pid in old_piece:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    for node in nodes:
        assert declared_down_since(slurm, node, lost_at), slurm.node_state(node)
    return old_piece, newer_term.stat().st_mtime


def runs_python(pid: int) -> bool:
    """Whether process `pid` runs Python (a training process, a job's Snakemake); not if it ended. By
    its executable: the srun that starts a job step names the step's python in its arguments."""
    try:
        return Path(os.readlink(f"/proc/{pid}/exe")).name.startswith("python")
    except OSError:
        return False


def still_training(pids: list[int], timeout: float = 60) -> list[str]:
    """The command lines of those of `pids` that still run Python (its training, its job's scripts)
    after up to `timeout` seconds; Slurm's own (slurmstepd, retrying to tell a slurmd that is gone)
    are the restarted slurmd's to reap."""
    deadline = time.monotonic() + timeout
    while True:
        running = []
        for pid in pids:
            with contextlib.suppress(OSError):
                if runs_python(pid) and not is_zombie(pid):
                    running.append(process_described(pid))
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(1)


def process_described(pid: int) -> str:
    """Process `pid` as a failure shows it: its command line, state, where it waits, its node and
    parent, for a process that should have ended."""
    proc = Path(f"/proc/{pid}")
    command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    status = dict(line.split(":\t", 1) for line in (proc / "status").read_text().splitlines() if ":\t" in line)
    node = [v for v in (proc / "environ").read_bytes().split(b"\0") if v.startswith(b"SLURMD_NODENAME=")]
    parent = status.get("PPid", "").strip()
    with contextlib.suppress(OSError):
        parent += f" {Path('/proc', parent, 'cmdline').read_bytes()[:80]!r}"
    return f"{pid} ({status.get('State')}, waits in {(proc / 'wchan').read_text()}, {node}, parent {parent}): {command}"


def nothing_written_by_the_old_piece_after(run: Path, took_over: float) -> bool:
    """Whether the run's folder holds nothing the first term published after `took_over`: no line of
    published.jsonl, no checkpoint (each says its term in contents.json)."""
    published = [json.loads(line) for line in (run / "published.jsonl").read_text().splitlines()]
    late = [line for line in published if line["term"] == 1 and line["at"] > took_over]
    contents = [json.loads(path.read_text()) | {"path": path} for path in run.glob("checkpoint-*/contents.json")]
    late += [content for content in contents if content["term"] == 1 and content["path"].stat().st_mtime > took_over]
    assert late == [], late
    return True


@pytest.mark.xdist_group("fragile")  # one worker runs them: each loses n3 or n4, which no other test uses
@pytest.mark.usefixtures("fragile_nodes")
def test_a_two_node_training_whose_second_node_is_lost_is_requeued_and_resumes_on_two_others(
    slurm, tmp_path, bbc_subset, tiny_model, two_node_run
):
    """2 nodes x 2 processes (the OSCER profile) on the `fragile` partition, which takes n3, the
    batch host, and n4; the second node, n4, powers off mid-training (its slurmd, its launcher and
    ranks 2 and 3 SIGKILLed), while ranks 0 and 1 on the batch host wait in a collective that never
    completes. Slurm declares n4 DOWN after SlurmdTimeout, ends the job NODE_FAIL (SIGTERM to what is
    left on the batch host) and requeues it under its id; it starts on two live nodes, resumes from
    the newest checkpoint on shared storage, spending no retry, and ends with the uninterrupted
    two-node run's results, byte for byte; no node keeps any scratch."""
    workdir = tmp_path.resolve()
    two_node_config(workdir, bbc_subset, tiny_model)
    profile = fragile_profile("oscer", workdir / "profile")
    workflow = start(slurm, workdir, "--retries", "0", profile=str(profile))
    wait_until(lambda: shared_checkpoint_after(workdir, 0), workflow, workdir, "a first checkpoint")
    (job,) = active_jobs(slurm, workdir, "train")
    nodes = slurm.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()
    assert nodes == "n[3-4]", "the fragile nodes, taken first"

    lost_at = time.time()
    slurm.lose_node("n4")
    wait_until(
        lambda: requeued_off(slurm, job, nodes), workflow, workdir, "the job requeued", timeout=LOST_NODE_SECONDS
    )
    start_now_if_held(slurm, job)
    returncode, output = finish(workflow, workdir)
    assert returncode == 0, output[-6000:]
    assert declared_down_since(slurm, "n4", lost_at), slurm.node_state("n4")
    lost, resumed = pieces_of(workdir)
    assert lost["slurm_job_id"] == resumed["slurm_job_id"] == job, "requeued by Slurm, not retried"
    # What is left on the batch host ends the piece in one of three ways, whichever comes first: srun sees n4's
    # launcher gone ("TrainingFailed: the nodes' launchers (srun) exited …"), or Slurm's SIGTERM
    # reaches it in training (paused, unable to save) or outside it ("killed by SIGTERM"). The
    # next piece resumes from the last checkpoint all the same.
    assert lost["requeued"] == "node failure" and lost["outcome"] != "finished", lost
    assert "n4" not in resumed["ranks"] and sorted(resumed["ranks"].values()) == [[0, 1], [2, 3]]
    assert resumed["resumed_from_step"] == lost["reached_step"] > 0
    reference, _output = two_node_run
    assert same_results(workdir, reference) == []


@pytest.mark.xdist_group("fragile")  # one worker runs them: each loses n3 or n4, which no other test uses
@pytest.mark.usefixtures("fragile_nodes")
def test_a_two_node_training_whose_slurmds_die_and_whose_old_piece_trains_on_ends_as_the_uninterrupted_run(
    slurm, tmp_path, bbc_subset, tiny_model, two_node_run
):
    """2 nodes x 2 processes (the OSCER profile, on CPUs) on the `fragile` nodes n3 and n4, whose slurmds both
    die while the nodes and every process of the job live on, frozen until the requeued job holds the
    run. Slurm declares them DOWN, ends the job NODE_FAIL and requeues it under its id; it starts on
    n1 and n2, takes the run's next term and resumes. The old piece's four ranks, thawed, train on
    together until their next write, which the fence refuses: the piece ends superseded, writing
    nothing dated after the newer piece held the run, and the run ends with the uninterrupted
    two-node run's results, byte for byte, spending no retry."""
    workdir = tmp_path.resolve()
    two_node_config(workdir, bbc_subset, tiny_model)
    profile = fragile_profile("oscer", workdir / "profile")
    # CPU nodes: requeued after both its nodes failed, a job asking for GPUs starts with none on the
    # test cluster's Slurm 22.05 (slurmctld: "gres/gpu: job … dealloc of node n1 bad node_offset 0
    # count is 0"; srun: "Invalid generic resource (gres) specification"). The ranks train on CPU.
    settings = yaml.safe_load((profile / "config.v8+.yaml").read_text())
    del settings["set-resources"]["train"]["gres"]
    settings["set-resources"]["train"] |= {"gpu": 0, "processes_per_node": 2}  # none, said so: not a lost GPU
    (profile / "config.v8+.yaml").write_text(yaml.safe_dump(settings))
    workflow = start(slurm, workdir, "--retries", "0", profile=str(profile))
    wait_until(lambda: shared_checkpoint_after(workdir, 0), workflow, workdir, "a first checkpoint")
    (job,) = active_jobs(slurm, workdir, "train")
    assert slurm.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip() == "n[3-4]"
    (run,) = (workdir / "checkpoints").iterdir()

    old_piece, took_over = requeued_beside_its_old_piece(slurm, workflow, workdir, job, ("n3", "n4"))
    wait_until((run / "lease" / "000001.superseded").exists, workflow, workdir, "the old piece superseded", 240)
    assert nothing_written_by_the_old_piece_after(run, took_over)
    returncode, output = finish(workflow, workdir)
    assert returncode == 0, output[-6000:]
    old, resumed = pieces_of(workdir)
    assert old["slurm_job_id"] == resumed["slurm_job_id"] == job, "requeued by Slurm, not retried"
    assert (old["outcome"], old["term"], old["requeued"]) == ("superseded", 1, "node failure"), old
    assert resumed["ranks"] == {"n1": [0, 1], "n2": [2, 3]}
    assert resumed["resumed_from_step"] == old["reached_step"] > 0
    reference, _output = two_node_run
    assert same_results(workdir, reference) == []
    assert not still_training(old_piece), "the old piece's processes ended"


@pytest.fixture
def fragile_nodes(slurm):
    """The nodes the lost-node tests lose (n3, n4), back after the test, also where it failed
    half-way (what is left of their jobs' processes killed first, frozen ones too), so that the
    next of them finds them."""
    yield
    for node in FRAGILE_NODES:
        if slurm.is_lost(node):
            slurm.lose_node(node)
            slurm.restart_node(node)


# How long a lost node's job may take to be requeued: SlurmdTimeout is 20 s (about 45 s from the
# loss to the requeue alone, sinfo showing the node `mixed*` until then); in the suite, beside two
# other tests' jobs, the controller once took longer than 2 minutes.
LOST_NODE_SECONDS = 360


def fragile_profile(cluster: str, folder: Path) -> Path:
    """`cluster`'s profile, copied to `folder`, its train jobs on the test cluster's `fragile`
    partition (the one that holds n3, which the lost-node tests lose)."""
    return profile_with(cluster, folder, {"train": {"slurm_partition": "fragile"}})


def declared_down_since(slurm, node: str, since: float) -> bool:
    """Whether Slurm declared `node` DOWN, not responding, after `since`: its event in the
    accounting database. (sinfo is no witness: a DOWN node some CPUs of which a job's allocation
    still holds shows as `mixed*`, as one did in CI after the requeue.)"""
    start = datetime.fromtimestamp(since).strftime("%Y-%m-%dT%H:%M:%S")
    events = slurm.run(
        "sacctmgr", "-n", "-P", "show", "event", f"nodes={node}", f"start={start}", "format=State,Reason", check=False
    ).stdout.splitlines()
    return any(event.startswith("DOWN") and event.endswith("|Not responding") for event in events)


def pending_again(slurm, job: str) -> bool:
    """Whether `job` is back in the queue, requeued (its state then, from squeue)."""
    return slurm.run("squeue", "-h", "-j", job, "-o", "%T", check=False).stdout.strip() == "PENDING"


def requeued_off(slurm, job: str, nodes_before: str) -> bool:
    """Whether `job`, requeued off the nodes it ran on (squeue's %N), waits in the queue or runs
    again on others (with other nodes free, Slurm may start it again at once)."""
    state, _, nodes = slurm.run("squeue", "-h", "-j", job, "-o", "%T %N", check=False).stdout.strip().partition(" ")
    return state == "PENDING" or (state == "RUNNING" and nodes != nodes_before)


def start_now_if_held(slurm, job: str) -> None:
    """A requeued job that waits is started now, not in the two minutes Slurm holds it, once what
    that hold is for is done (slurmctld's job_mgr.c): nothing of its earlier run is left on the
    nodes that live, its slurmstepd included, and the new launch credential is dated after the
    old one's revoke, to the second. Started at once instead, CI once saw such a job's launch fail
    (the job held, its node drained: "Prolog error"), which stalled the tests beside it."""
    if not pending_again(slurm, job):  # Slurm started it again at once
        return
    deadline = time.monotonic() + 120
    while (job_processes(".", job) or job_steps_on_nodes(job)) and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(1.05 - time.time() % 1)  # into the next second: every revoke of the old run is before it
    slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now", check=False)


def job_steps_on_nodes(job: str) -> bool:
    """Whether a slurmstepd of `job` runs on any node (its title: `slurmstepd: [<job>.<step>]`)."""
    return subprocess.run(["pgrep", "-f", rf"^slurmstepd: \[{job}\."], capture_output=True).returncode == 0


def ended_at(piece: dict) -> float:
    return datetime.strptime(piece["ended_at"], "%Y-%m-%dT%H:%M:%S%z").timestamp()


def shared_checkpoint_after(workdir: Path, step: int) -> bool:
    return any(int(path.name.split("-")[1]) > step for path in workdir.glob("checkpoints/*/checkpoint-*"))


def cancelled_after_a_checkpoint(slurm, workflow: subprocess.Popen, workdir: Path, step: int) -> int:
    """`scancel` the (only) train job once it has saved a checkpoint after `step`, wait for its
    retry to start, and return the step its piece stopped at on SIGTERM."""
    pieces = len(live_pieces(workdir))
    wait_until(lambda: shared_checkpoint_after(workdir, step), workflow, workdir, f"a checkpoint of piece {pieces}")
    (job,) = active_jobs(slurm, workdir, "train")
    slurm.run("scancel", job)
    wait_until(lambda: len(live_pieces(workdir)) == pieces + 1, workflow, workdir, f"piece {pieces + 1}")
    return stopped_at(live_pieces(workdir)[pieces - 1], "SIGTERM", workdir)


def node_launcher(workdir: Path, node: str) -> int | None:
    """The pid of the launcher (srun's task) of `node` training in `workdir`."""
    launchers = processes_in(workdir, "scratchflow.distributed node")
    return next((pid for pid, environ in launchers.items() if environ.get("SLURMD_NODENAME") == node), None)


def test_two_nodes_stopped_cancelled_and_killed_end_like_an_uninterrupted_run(
    slurm, tmp_path, bbc_subset, tiny_model, two_node_run
):
    """2 nodes x 2 processes with the OSCER profile, one grid point, three faults in turn: USR1 to
    the second node's launcher only makes all 4 ranks stop at one step (paused); scancel of the job
    pauses it again; SIGKILL of the second node's launcher fails the job within seconds. Each retry
    resumes, and the last ends with exactly the metrics of the uninterrupted run; no node keeps any
    scratch."""
    workdir = tmp_path.resolve()
    two_node_config(workdir, bbc_subset, tiny_model)
    workflow = start(slurm, workdir, "--retries", "3", profile="oscer")

    wait_until(lambda: shared_checkpoint_after(workdir, 0), workflow, workdir, "a first checkpoint")
    os.kill(wait_until(lambda: node_launcher(workdir, "n2"), workflow, workdir, "n2's launcher"), signal.SIGUSR1)
    wait_until(lambda: len(live_pieces(workdir)) == 2, workflow, workdir, "a second piece")
    first = live_pieces(workdir)[0]
    after_usr1 = stopped_at(first, "a stop signal to another process", workdir)

    after_scancel = cancelled_after_a_checkpoint(slurm, workflow, workdir, after_usr1)

    wait_until(lambda: shared_checkpoint_after(workdir, after_scancel), workflow, workdir, "a checkpoint of piece 3")
    os.kill(wait_until(lambda: node_launcher(workdir, "n2"), workflow, workdir, "n2's launcher"), signal.SIGKILL)
    killed_at = time.time()

    returncode, output = finish(workflow, workdir)
    assert returncode == 0, output[-6000:]
    paused, cancelled, failed, finished = pieces_of(workdir)
    assert paused["outcome"] == "paused" and paused["world_size"] == 4
    assert cancelled["resumed_from_step"] == after_usr1 and cancelled["outcome"] == "paused"
    assert failed["resumed_from_step"] == after_scancel
    assert failed["outcome"].startswith("TrainingFailed: the nodes' launchers (srun) exited with"), failed
    assert ended_at(failed) - killed_at < 30, "a dead node fails the job at once, not at the wall time"
    assert finished["outcome"] == "finished" and finished["resumed_from_step"] > after_scancel
    assert finished["ranks"] == {"n1": [0, 1], "n2": [2, 3]}
    reference, _output = two_node_run
    # Weights byte for byte (a resumed piece's first step once summed the 4 ranks' gradients in
    # another order), and the curves point for point (no trace of the stops, each between two logging
    # steps: its evaluation, its summary, the loss it cut).
    assert same_results(workdir, reference) == []
    assert different_curves(workdir, reference) == []


def test_two_nodes_stop_on_usr2_then_on_hup_at_one_step_within_seconds_and_end_like_an_uninterrupted_run(
    slurm, tmp_path, bbc_subset, tiny_model, two_node_run
):
    """2 nodes x 2 processes with the OSCER profile and `checkpointing.stop_signal` USR2, then (the
    config and the profile switched, the workflow started again) HUP, each sent by Slurm to every
    process of the job's steps (`scancel --signal`, as its wall-time warning does): each node's
    launcher, torchrun (which handles HUP itself) and the four ranks. Each time every rank stops at
    one step and the piece is paused within seconds (no torchrun exit barrier of 300 s); the third
    piece resumes to the uninterrupted run's weights, byte for byte. (One run for both signals: the
    second stop is a resumed piece's.)"""
    workdir = tmp_path.resolve()
    two_node_config(workdir, bbc_subset, tiny_model)
    signalled_at = {}
    for stop, arguments in (("USR2", ["--retries", "0"]), ("HUP", [])):
        switch_stop_signal(workdir, stop)
        workflow = start(slurm, workdir, *arguments, profile=str(workdir / "profile"))
        reached = max((piece["reached_step"] or 0 for piece in live_pieces(workdir)), default=0)
        wait_until(lambda reached=reached: shared_checkpoint_after(workdir, reached), workflow, workdir, "a checkpoint")
        (job,) = active_jobs(slurm, workdir, "train")
        slurm.run("scancel", f"--signal={stop}", job)
        signalled_at[stop] = time.time()
        if stop == "USR2":  # paused, and no retry: the workflow ends
            returncode, output = finish(workflow, workdir)
            assert returncode != 0 and len(live_pieces(workdir)) == 1, output[-6000:]
    wait_until(lambda: len(live_pieces(workdir)) == 3, workflow, workdir, "a third piece")

    returncode, output = finish(workflow, workdir)
    assert returncode == 0, output[-6000:]
    paused_on_usr2, paused_on_hup, finished = pieces_of(workdir)
    for paused, stop, resumed in ((paused_on_usr2, "USR2", paused_on_hup), (paused_on_hup, "HUP", finished)):
        step = stopped_at(paused, f"SIG{stop}", workdir)
        assert paused["world_size"] == 4 and resumed["resumed_from_step"] == step
        assert ended_at(paused) - signalled_at[stop] < 60, f"the piece ends within seconds of {stop}"
    assert finished["outcome"] == "finished"
    assert same_results(workdir, two_node_run[0]) == []


def switch_stop_signal(workdir: Path, stop: str) -> None:
    """`checkpointing.stop_signal: <stop>` in the config, and the OSCER profile asking Slurm for the
    same signal before the wall time (start-up refuses a mismatch), in <workdir>/profile."""
    config_file = workdir / "config" / "config.yaml"
    config = yaml.safe_load(config_file.read_text())
    config["checkpointing"]["stop_signal"] = stop
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    profile = REPO / "profiles" / "oscer" / "config.v8+.yaml"
    switched = yaml.safe_load(profile.read_text().replace("--signal=USR1@600", f"--signal={stop}@600"))
    switched["configfile"] = str(REPO / "config" / "clusters" / "oscer.yaml")
    (workdir / "profile").mkdir(exist_ok=True)
    (workdir / "profile" / "config.v8+.yaml").write_text(yaml.safe_dump(switched, sort_keys=False))


def job_processes(pattern: str, job: str) -> dict[int, dict[str, str]]:
    """pid -> environment of Slurm job `job`'s processes whose command line matches `pattern`, in a
    container or not (a container's processes show their working directory under its root)."""
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    processes = {}
    for pid in map(int, found.stdout.split()):
        try:
            listed = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # ended meanwhile
            continue
        environ = dict(line.split("=", 1) for line in listed if "=" in line)
        if environ.get("SLURM_JOB_ID") == job:
            processes[pid] = environ
    return processes


def launcher_of(job: str, node: str) -> int | None:
    """The pid of job `job`'s launcher on `node`."""
    launchers = job_processes("scratchflow.distributed node", job)
    return next((pid for pid, environ in launchers.items() if environ.get("SLURMD_NODENAME") == node), None)


def test_two_nodes_in_dfkis_containers_stopped_by_one_node_end_like_an_uninterrupted_run_on_the_host(
    slurm, netscratch_workdir, bbc_subset, tiny_model, two_node_run, scratchflow_image
):
    """The two-node shape on DFKI's profile with its several-node switch
    (config/tests/profiles/dfki-several-nodes.yaml): the job on the first node, each node's launcher
    in the image. USR1 to the second node's launcher only (the first fault of the host's two-node
    test) makes all 4 ranks stop at one step; the retry resumes, and the run ends with the weights
    and curves of the uninterrupted run on the host (OSCER's profile, no container)."""
    workdir = netscratch_workdir
    two_node_config(workdir, bbc_subset, tiny_model)
    profile = switched_profile(
        "dfki-several-nodes.yaml", workdir / "profile", {"--gpus-per-node=8": "--gpus-per-node=2"}
    )
    image = {"SCRATCHFLOW_IMAGE": str(scratchflow_image)}
    workflow = start(slurm, workdir, profile=str(profile), env=image)

    wait_until(lambda: shared_checkpoint_after(workdir, 0), workflow, workdir, "a first checkpoint")
    (job,) = active_jobs(slurm, workdir, "train")
    launcher = wait_until(lambda: launcher_of(job, "n2"), workflow, workdir, "n2's launcher")
    environ = Path(f"/proc/{launcher}/environ").read_bytes().decode()
    assert f"PYXIS_CONTAINER_IMAGE={scratchflow_image}" in environ, "the launcher runs in the image"
    os.kill(launcher, signal.SIGUSR1)

    returncode, output = finish(workflow, workdir)
    assert returncode == 0, output[-6000:]
    paused, finished = pieces_of(workdir)
    assert paused["outcome"] == "paused" and paused["world_size"] == 4
    step = stopped_at(paused, "a stop signal to another process", workdir)
    assert finished["outcome"] == "finished" and finished["resumed_from_step"] == step
    assert finished["ranks"] == {"n1": [0, 1], "n2": [2, 3]}
    reference, _output = two_node_run
    assert same_results(workdir, reference) == []
    assert different_curves(workdir, reference) == []
    assert containers_left(slurm, output) == [], "no enroot container is left on either node"


def containers_left(slurm, output: str) -> list[Path]:
    """What the jobs a workflow submitted (its output names them) left of their containers: enroot's
    unpacked containers (pyxis_<job>.<step>) and pyxis's runtime files (<job>.<step>.squashfs)."""
    from local_containers import container_runtime

    jobs = "|".join(re.findall(r"SLURM jobid (\d+)", output))
    assert jobs, "the workflow submitted jobs"
    mine = re.compile(rf"(pyxis_)?({jobs})[._]")
    found = [*container_runtime().data.glob("*/*"), *(slurm.root / "pyxis").glob("*/*")]
    return [path for path in found if mine.match(path.name)]


def trainer_of(job: str) -> tuple[int, dict[str, str]] | None:
    """The pid and environment of Slurm job `job`'s trainer: the train rule's script's Python, not
    the shell that Snakemake starts it with (whose command line names the script too)."""
    return next(iter(job_processes(r"^\S*python\S* \S*\.train\.py", job).items()), None)


@pytest.fixture
def netscratch_workdir():
    """A working directory on DFKI's shared storage (made here), which its profile mounts into the image."""
    workdir = netscratch_directory()
    yield workdir
    shutil.rmtree(workdir)
    workdir.with_suffix(".out").unlink(missing_ok=True)


def test_in_dfkis_container_the_warning_signal_a_scancel_and_a_killed_trainer_end_like_an_uninterrupted_run(
    slurm, netscratch_workdir, bbc_subset, tiny_model, uninterrupted_long_run, scratchflow_image
):
    """DFKI's profile, every job step in the image (pyxis, enroot). In turn: USR1 to the job's steps
    (what `--signal=USR1@600` sends before the wall time; here at once, with `scancel --signal`),
    a `scancel` (TERM), and SIGKILL of the trainer inside the container. USR1 and TERM reach the
    trainer in the image, which saves and pauses; the killed one fails its job; each retry resumes,
    and the run ends with the weights of an uninterrupted run on the host. The same command again
    has nothing to do, and no job left a container or its files behind."""
    workdir = netscratch_workdir
    configure_long_run(workdir, bbc_subset, tiny_model)
    image = {"SCRATCHFLOW_IMAGE": str(scratchflow_image)}
    workflow = start(slurm, workdir, "--retries", "3", profile="dfki", env=image)

    wait_until(lambda: first_checkpoint(workdir), workflow, workdir, "a first checkpoint")
    (job,) = active_jobs(slurm, workdir, "train")
    slurm.run("scancel", "--signal=USR1", job)
    wait_until(lambda: len(live_pieces(workdir)) == 2, workflow, workdir, "a second piece")
    after_usr1 = stopped_at(live_pieces(workdir)[0], "SIGUSR1", workdir)

    after_scancel = cancelled_after_a_checkpoint(slurm, workflow, workdir, after_usr1)

    wait_until(lambda: shared_checkpoint_after(workdir, after_scancel), workflow, workdir, "a checkpoint of piece 3")
    (job,) = active_jobs(slurm, workdir, "train")
    pid, environ = wait_until(lambda: trainer_of(job), workflow, workdir, "the trainer")
    assert environ["PYXIS_CONTAINER_IMAGE"] == str(scratchflow_image), "the trainer runs in the image"
    os.kill(pid, signal.SIGKILL)

    returncode, first_output = finish(workflow, workdir)
    assert returncode == 0, first_output[-6000:]
    paused, cancelled, killed, finished = pieces_of(workdir)
    assert (paused["signal"], cancelled["signal"]) == ("SIGUSR1", "SIGTERM")
    assert paused["outcome"] == cancelled["outcome"] == "paused"
    assert cancelled["resumed_from_step"] == after_usr1 and killed["resumed_from_step"] == after_scancel
    assert killed["outcome"] == "killed" and finished["outcome"] == "finished"
    assert finished["resumed_from_step"] > after_scancel
    assert same_results(workdir, uninterrupted_long_run) == []
    (run,) = (workdir / "results" / "runs").iterdir()
    environment = json.loads((run / "record.json").read_text())["environment"]
    assert environment["python_executable"] == "/opt/scratchflow/bin/python"

    returncode, output = finish(start(slurm, workdir, profile="dfki", env=image), workdir)
    assert returncode == 0 and "Nothing to be done" in output, output[-3000:]
    assert containers_left(slurm, first_output) == [], "no enroot container or pyxis runtime file is left"
