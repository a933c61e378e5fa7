"""What a job reads from Slurm about itself (scratchflow.slurm_job), from Slurm 22.05's own output;
the whole path runs on the test cluster (tests/test_slurm_faults.py, a real preemption)."""

from __future__ import annotations

import pytest
from scratchflow import slurm_job

SHOWN = (
    "JobId=7 JobName=x UserId=root(0) JobState=RUNNING Reason=None Requeue={requeue} Restarts=0 "
    "SubmitTime=2026-11-26T17:14:55 PreemptEligibleTime=2026-11-26T17:14:55 PreemptTime={preempt_time} "
    "Partition=preemptible Command=(null)"
)


@pytest.mark.parametrize(
    ("requeue", "preempt_time", "expected"),
    [("1", "2026-11-26T17:15:04", True), ("1", "None", False), ("0", "2026-11-26T17:15:04", False)],
)
def test_a_job_is_preempted_and_requeueable_only_with_both_stamped(requeue, preempt_time, expected, monkeypatch):
    monkeypatch.setattr(
        slurm_job, "ask_slurm", lambda *command: SHOWN.format(requeue=requeue, preempt_time=preempt_time)
    )
    assert slurm_job.preempted_and_requeueable({"SLURM_JOB_ID": "7"}) is expected


def test_outside_slurm_or_without_its_clients_a_job_is_not_preempted(monkeypatch):
    assert slurm_job.preempted_and_requeueable({}) is False
    monkeypatch.setenv("PATH", "/nonexistent")
    assert slurm_job.preempted_and_requeueable({"SLURM_JOB_ID": "7"}) is False


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
