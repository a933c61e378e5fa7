"""What a job reads from Slurm about itself (scratchflow.slurm_job), from Slurm 22.05's own output;
the whole path runs on the test cluster (tests/test_slurm_faults.py, a real preemption)."""

from __future__ import annotations

import time

import pytest
from scratchflow import slurm_job

SHOWN = (
    "JobId=7 JobName=x UserId=root(0) JobState={state} Reason=None Requeue={requeue} Restarts=0 "
    "SubmitTime=2026-11-26T17:14:55 PreemptEligibleTime=2026-11-26T17:14:55 PreemptTime={preempt_time} "
    "TimeLimit=00:30:00 StartTime=2026-11-26T17:14:55 EndTime=2026-11-26T17:44:55 Partition=preemptible "
    "Command=(null)"
)
ENDS_AT = time.mktime(time.strptime("2026-11-26T17:44:55", "%Y-%m-%dT%H:%M:%S"))  # the job's EndTime


def shown(monkeypatch, requeue: str = "1", preempt_time: str = "None", state: str = "RUNNING") -> None:
    monkeypatch.setattr(
        slurm_job,
        "ask_slurm",
        lambda *command: SHOWN.format(requeue=requeue, preempt_time=preempt_time, state=state),
    )


@pytest.mark.parametrize(
    ("requeue", "preempt_time", "cause"),
    [("1", "2026-11-26T17:15:04", "preempted"), ("1", "None", None), ("0", "2026-11-26T17:15:04", None)],
)
def test_a_job_requeues_itself_when_preempted_only_where_it_is_requeueable(requeue, preempt_time, cause, monkeypatch):
    shown(monkeypatch, requeue, preempt_time)
    assert slurm_job.self_requeue_cause(600, {"SLURM_JOB_ID": "7"}, now=ENDS_AT - 1200) == cause


@pytest.mark.parametrize(
    ("left", "lead", "cause"),
    [
        (600, 600, "time limit"),  # the warning when asked
        (650, 600, "time limit"),  # up to 60 s earlier, as Slurm may send it
        (500, 600, "time limit"),  # later: the piece took its time to save
        (700, 600, None),  # a stop sent by hand with more time left: a pause, for the retry
        (1200, 90, None),
        (120, 90, "time limit"),
        (30, None, None),  # no warning asked: the TERM at the limit comes as the job times out
    ],
)
def test_a_stop_is_the_wall_time_warning_where_less_than_its_lead_and_a_minute_is_left(left, lead, cause, monkeypatch):
    shown(monkeypatch)
    assert slurm_job.self_requeue_cause(lead, {"SLURM_JOB_ID": "7"}, now=ENDS_AT - left) == cause


@pytest.mark.parametrize("state", ["COMPLETING", "CANCELLED", "REQUEUED", "PENDING"])
def test_a_job_that_a_scancel_or_someone_elses_requeue_ended_does_not_requeue_itself(state, monkeypatch):
    """Its EndTime is then the moment it ended: no time left, yet no time limit."""
    shown(monkeypatch, state=state)
    assert slurm_job.self_requeue_cause(600, {"SLURM_JOB_ID": "7"}, now=ENDS_AT) is None


def test_a_job_submitted_with_no_requeue_never_requeues_itself(monkeypatch):
    shown(monkeypatch, requeue="0")
    assert slurm_job.self_requeue_cause(600, {"SLURM_JOB_ID": "7"}, now=ENDS_AT - 600) is None


def test_the_time_before_the_wall_times_warning_counts_the_minute_slurm_may_send_it_early(monkeypatch):
    shown(monkeypatch)
    assert slurm_job.seconds_before_the_warning(600, {"SLURM_JOB_ID": "7"}, now=ENDS_AT - 1800) == 1800 - 600 - 60
    assert slurm_job.seconds_before_the_warning(None, {"SLURM_JOB_ID": "7"}, now=ENDS_AT) is None, "none asked"
    assert slurm_job.seconds_before_the_warning(600, {}) is None, "outside Slurm"
    monkeypatch.setattr(
        slurm_job, "ask_slurm", lambda *command: SHOWN.replace("EndTime=2026-11-26T17:44:55", "EndTime=Unknown")
    )
    assert slurm_job.seconds_before_the_warning(600, {"SLURM_JOB_ID": "7"}) is None, "no limit known"


def test_outside_slurm_or_without_its_clients_a_job_does_not_requeue_itself(monkeypatch):
    assert slurm_job.self_requeue_cause(600, {}) is None
    monkeypatch.setenv("PATH", "/nonexistent")
    assert slurm_job.self_requeue_cause(600, {"SLURM_JOB_ID": "7"}) is None


@pytest.mark.parametrize(
    ("slurm_extra", "lead"),
    [
        ("--signal=USR1@600", 600),
        ("'--signal=SIGHUP@600 --container-image=x'", 600),
        ("--signal=B:USR2@90 --ntasks-per-node=1", 90),
        ("--signal=12", 60),  # sbatch's default: 60 s
        ("--ntasks-per-node=1", None),
        (None, None),
    ],
)
def test_the_warnings_lead_is_read_from_the_rules_slurm_extra(slurm_extra, lead):
    assert slurm_job.signal_lead_seconds(slurm_extra) == lead


@pytest.mark.parametrize(
    ("states", "cause"),
    [
        ("PREEMPTED\nRUNNING\n", "preempted"),
        ("NODE_FAIL\nPENDING\n", "node failure"),
        ("REQUEUED\nRUNNING\n", "requeued"),
        ("PREEMPTED\nREQUEUED\nRUNNING\n", "preempted"),
        ("PREEMPTED\n", "preempted"),  # preempted and requeued by Slurm (no grace time), waiting to start
        ("RUNNING\n", None),  # one run only: the job id ran again without a requeue (inside salloc)
        (None, None),  # no sacct
    ],
)
def test_why_slurm_requeued_a_job_is_read_from_its_earlier_runs(states, cause, monkeypatch):
    monkeypatch.setattr(slurm_job, "ask_slurm", lambda *command: states)
    assert slurm_job.requeue_cause("7") == cause


def test_a_job_computes_on_its_rules_threads_never_more_than_slurm_gave_it(monkeypatch):
    """The rule's threads (set-threads), within Slurm's --cpus-per-task (cpus_per_task) or, without
    Slurm, the machine's CPUs; fewer than Slurm gave is said with the fix."""
    monkeypatch.setattr(slurm_job.os, "sched_getaffinity", lambda _pid: set(range(8)))
    slurm = {"SLURM_CPUS_PER_TASK": "4"}
    assert slurm_job.job_cpus(4, slurm) == (4, "Slurm gave the job 4 (--cpus-per-task)")
    assert slurm_job.job_cpus(64, slurm) == (
        4,
        "Slurm gave the job 4 (--cpus-per-task); the rule's threads, 64, are more",
    )
    cpus, why = slurm_job.job_cpus(1, slurm)
    assert cpus == 1 and why.endswith("to compute on all 4, set the rule's set-threads to 4 in the profile")
    assert slurm_job.job_cpus(3, {}) == (3, "the rule's threads, 3, of this machine's 8")
    assert slurm_job.job_cpus(12, {}) == (8, "the rule's threads, 12, of this machine's 8")


def test_a_superseded_job_ends_its_own_snakemakes_and_their_sruns_on_its_node_and_nothing_else(tmp_path, monkeypatch):
    """Real processes of Slurm job 77 on node n3, as a requeued job's old batch host holds them: its
    batch step's Snakemake, the srun it starts the rule's job step with (srun first: seeing its task
    killed it would have Slurm end the step by its number), the step's Snakemake. Left alone: the
    user's own Snakemake in the same allocation (no --target-jobs), an srun of the user's, the same
    job's processes on another node (the newer piece's, where the requeued job runs)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    srun = tmp_path / "srun"
    srun.symlink_to(sys.executable)
    sleep = "import time; time.sleep(60)"

    def started(arguments: list[str], node: str, with_an_srun: bool = False) -> subprocess.Popen:
        """A process with `arguments` in its command line, with job 77's environment on `node`, and
        with an srun (a Python named srun) as its child."""
        script = f"import subprocess; subprocess.Popen([{str(srun)!r}, '-c', {sleep!r}]); {sleep}"
        environ = {**os.environ, "SLURM_JOB_ID": "77", "SLURMD_NODENAME": node}
        return subprocess.Popen([sys.executable, "-c", script if with_an_srun else sleep, *arguments], env=environ)

    batch = started(["--target-jobs", "train:run_id=r1"], "n3", with_an_srun=True)
    step = started(["--target-jobs", "train:run_id=r1"], "n3")
    users = started(["--cores", "all"], "n3", with_an_srun=True)
    newer = started(["--target-jobs", "train:run_id=r1"], "n1", with_an_srun=True)
    processes = [batch, step, users, newer]
    try:
        time.sleep(1)  # the sruns started
        monkeypatch.setenv("SLURM_JOB_ID", "77")
        monkeypatch.setenv("SLURMD_NODENAME", "n3")
        ended = slurm_job.end_the_jobs_own_snakemakes()
        for process in (batch, step):
            assert process.wait(timeout=10) == -signal.SIGKILL
        assert batch.pid in ended and step.pid in ended and len(ended) == 3, "the two Snakemakes and the batch's srun"
        assert ended.index(batch.pid) > 0, "the srun first"
        for process in (users, newer):
            assert process.poll() is None
    finally:
        for process in processes:
            process.kill()
        subprocess.run(["pkill", "-KILL", "-f", f"^{srun} -c"], check=False)
