"""What a Slurm job asks Slurm about itself: the CPUs it was given, whether it is being preempted,
requeueing itself once it has saved, and why an earlier run of it was requeued. Outside Slurm, or where its clients are
missing (a job step in an image without them), each answers "no" or "cannot say".

Preemption with PreemptMode=REQUEUE and a GraceTime sends the job SIGTERM at once and requeues it
when the grace time ends, but a job that ends on its own within its grace time (as a training does
once it has saved) is recorded FAILED and not requeued (seen on Slurm 22.05): Snakemake would spend
a retry on it and queue it again at the back. So a preempted job that is requeueable (`--requeue`,
every profile's `slurm-requeue: true`) requeues itself: it keeps its id and its place, and its next
start resumes from the checkpoint it saved. With no grace time, Slurm requeues the job at once (it
is COMPLETING by the time the training has saved, its PreemptTime cleared), and the job leaves it
to Slurm; its next piece reads the cause from sacct.

A piece paused by the wall-time warning (`--signal=<stop signal>@<lead>` in the train rule's
slurm_extra) requeues its job the same way: to Snakemake the job is still queued, not failed, so the
pause spends no retry and prints no error, and the job keeps its id and its time limit (a retry would
queue a new job at the back). Slurm sends that warning up to 60 s earlier than asked, and not at all
to say which signal is which: a stop is the warning where less than its lead and those 60 s is left
of the job's time. A requeued job becomes eligible again after Slurm's requeue delay (120 s by
default). Slurm puts no limit on a job requeueing itself: scratchflow's is cluster.max_pieces.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)
# What makes a job's libraries start as many threads as it has CPUs: OpenMP (torch's CPU kernels),
# MKL, OpenBLAS (numpy), and Rayon (Hugging Face's tokenizers).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_RS_NUM_CPUS")

# The state sacct keeps of the run of a job that Slurm then requeued (it keeps its id), in the
# pieces' and the status's words; "requeued" where sacct does not say (`scontrol requeue` too).
REQUEUE_CAUSES = {"PREEMPTED": "preempted", "NODE_FAIL": "node failure"}
# Why a paused job requeues itself (a piece's `requeued`).
PREEMPTED, TIME_LIMIT = "preempted", "time limit"
# How much earlier than asked Slurm may send the --signal warning (sbatch.1: "up to 60 seconds").
SIGNAL_EARLY_SECONDS = 60
# The --signal option of sbatch: [{R|B}:]<sig>[@<seconds before the time limit, 60 if not given>].
SLURM_SIGNAL_OPTION = re.compile(r"--signal[= ](?:[RB]+:)?(?:SIG)?(\w+)(?:@(\d+))?")


def job_cpus(threads: int, environ: Mapping[str, str] = os.environ) -> tuple[int, str]:
    """The CPUs a job's processes compute on, and why that many: the rule's threads (the profile's
    `set-threads`, which Snakemake's job step keeps within them), never more than Slurm gave the
    job (--cpus-per-task: the profile's `cpus_per_task`); without Slurm, never more than the
    machine's. Where the threads leave some of Slurm's CPUs idle, that is said with what to change."""
    given = environ.get("SLURM_CPUS_PER_TASK")
    if not given:
        runs_on = len(os.sched_getaffinity(0))
        return max(1, min(threads, runs_on)), f"the rule's threads, {threads}, of this machine's {runs_on}"
    allocated = int(given)
    if threads > allocated:
        return allocated, f"Slurm gave the job {allocated} (--cpus-per-task); the rule's threads, {threads}, are more"
    if threads < allocated:
        return threads, (
            f"the rule's threads, of the {allocated} Slurm gave the job (--cpus-per-task): to compute on all "
            f"{allocated}, set the rule's set-threads to {allocated} in the profile"
        )
    return threads, f"Slurm gave the job {allocated} (--cpus-per-task)"


def ask_slurm(*command: str, timeout: float = 30) -> str | None:
    """A Slurm client's output, or None where it is missing, failed or timed out."""
    try:
        answered = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return answered.stdout if answered.returncode == 0 else None


def signal_lead_seconds(slurm_extra: object) -> int | None:
    """How many seconds before the time limit the --signal in a rule's slurm_extra asks Slurm to
    warn the job (None: it asks for no warning)."""
    asked = SLURM_SIGNAL_OPTION.search(str(slurm_extra or ""))
    if asked is None:
        return None
    return int(asked.group(2)) if asked.group(2) else 60


def self_requeue_cause(
    warning_lead_seconds: int | None,
    environ: Mapping[str, str] = os.environ,
    now: float | None = None,
) -> str | None:
    """Why this job, whose piece has just paused, requeues itself: PREEMPTED (Slurm stamped its
    PreemptTime) or TIME_LIMIT (the stop was the wall-time warning, asked `warning_lead_seconds`
    before the limit: the job still runs, with less than that and SIGNAL_EARLY_SECONDS left). None:
    neither (a stop sent by hand, a scancel or a requeue by someone else, which end the job: its
    EndTime is then its end), no warning asked (the TERM at the limit comes as the job times out),
    outside Slurm, or not requeueable (--no-requeue), where Snakemake's retry resumes the run
    instead. One `scontrol show job`."""
    job_id = environ.get("SLURM_JOB_ID")
    shown = ask_slurm("scontrol", "--oneliner", "show", "job", job_id) if job_id else None
    if not shown or _field(shown, "Requeue") != "1":
        return None
    if _field(shown, "PreemptTime") not in (None, "None"):
        return PREEMPTED
    if warning_lead_seconds is None or _field(shown, "JobState") != "RUNNING":
        return None
    left = _seconds_left(shown, now)
    return TIME_LIMIT if left is not None and left <= warning_lead_seconds + SIGNAL_EARLY_SECONDS else None


def seconds_before_the_warning(
    warning_lead_seconds: int | None, environ: Mapping[str, str] = os.environ, now: float | None = None
) -> float | None:
    """How long this job has before Slurm's warning of its time limit may come (asked
    `warning_lead_seconds` before it, up to SIGNAL_EARLY_SECONDS earlier still). None: no warning
    asked, outside Slurm, or no limit known. One `scontrol show job` where a warning is asked."""
    job_id = environ.get("SLURM_JOB_ID")
    if warning_lead_seconds is None or not job_id:
        return None
    shown = ask_slurm("scontrol", "--oneliner", "show", "job", job_id)
    left = _seconds_left(shown, now) if shown else None
    return None if left is None else left - warning_lead_seconds - SIGNAL_EARLY_SECONDS


def _seconds_left(shown: str, now: float | None) -> float | None:
    """Until the EndTime `scontrol show job` shows; None where it shows none (Unknown, no limit)."""
    try:
        ends_at = time.mktime(time.strptime(_field(shown, "EndTime") or "", "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
    return ends_at - (time.time() if now is None else now)


def _field(shown: str, name: str) -> str | None:
    found = re.search(rf"\b{name}=(\S+)", shown)
    return found.group(1) if found else None


def requeue_this_job(cause: str, environ: Mapping[str, str] = os.environ) -> None:
    """Put this job back in the queue under its id; Slurm then ends its processes, this one too."""
    job_id = environ["SLURM_JOB_ID"]
    why = "was preempted" if cause == PREEMPTED else "reached its wall-time warning"
    log.info("Slurm job %s %s: it requeues itself and resumes when it starts again", job_id, why)
    answered = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True)
    if answered.returncode != 0:  # requeued by Slurm already (no grace time), say
        log.warning("scontrol requeue %s: %s", job_id, answered.stderr.strip())


def requeue_cause(job_id: str) -> str | None:
    """Why Slurm requeued job `job_id`: "preempted" or "node failure" where sacct keeps that state for
    one of its runs (while the job waits to start again, its one record has it), else "requeued"
    where sacct lists an earlier run (`scontrol requeue`); None where it lists one run only, or cannot
    be asked: the same job id ran twice without a requeue (a workflow inside `salloc`, whose local
    retry runs in the allocation's job)."""
    listed = ask_slurm("sacct", "-j", job_id, "--duplicates", "-X", "-n", "-P", "-o", "State")
    states = [line.split()[0] for line in (listed or "").splitlines() if line.strip()]
    cause = next((REQUEUE_CAUSES[state] for state in reversed(states) if state in REQUEUE_CAUSES), None)
    return cause or ("requeued" if len(states) > 1 else None)


# In the command lines of the Snakemakes a Slurm job runs its rule's job with (the batch step's, and
# the job step's it starts with srun); none in a local run.
JOBS_OWN_SNAKEMAKE_ARGUMENT = b"--target-jobs"


def end_the_jobs_own_snakemakes() -> list[int]:
    """SIGKILL, on this node, the Snakemakes that run this Slurm job's rule and the sruns between them,
    the sruns first, so that none acts on the job's end: a superseded piece's, whose job id runs a
    newer piece now. Seeing its script fail, a Snakemake would remove the rule's outputs (the newer
    piece's); seeing its task killed, srun would have Slurm end the job's step by its number, which
    may name the newer piece's step (a requeued job numbers its steps from 0 again). Their pids;
    none outside a Slurm job, or for a local run's jobs, which run in the user's Snakemake."""
    job, node = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURMD_NODENAME")
    if not job:
        return []
    parents, argvs = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if f"SLURM_JOB_ID={job}".encode() in environ and (
                not node or f"SLURMD_NODENAME={node}".encode() in environ
            ):
                argvs[int(entry.name)] = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
    snakemakes = {pid for pid, argv in argvs.items() if JOBS_OWN_SNAKEMAKE_ARGUMENT in argv}

    def under_a_snakemake(pid: int) -> bool:
        while pid in parents and pid > 1:
            pid = parents[pid]
            if pid in snakemakes:
                return True
        return False

    sruns = [pid for pid, argv in argvs.items() if Path(argv[0].decode()).name == "srun" and under_a_snakemake(pid)]
    ended = []
    for pid in [*sruns, *snakemakes]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            ended.append(pid)
    if ended:
        log.warning("ended this job's own Snakemakes and sruns (%s): the rule's outputs are a newer piece's", ended)
    return ended
