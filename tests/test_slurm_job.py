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


def test_a_job_uses_the_cpus_slurm_gave_it_whatever_the_rules_threads_say(monkeypatch):
    """On Slurm: its --cpus-per-task (a profile's cpus_per_task), within the CPUs it may run on;
    elsewhere the rule's threads, which Snakemake shares out of its --cores."""
    monkeypatch.setattr(slurm_job.os, "sched_getaffinity", lambda _pid: set(range(8)))
    assert slurm_job.job_cpus(1, {"SLURM_CPUS_PER_TASK": "4"}) == (4, "Slurm gave the job 4 (--cpus-per-task)")
    assert slurm_job.job_cpus(3, {}) == (3, "the rule's threads, 3, as Snakemake gave them")
    assert slurm_job.job_cpus(4, {"SLURM_CPUS_PER_TASK": "16"}) == (
        16,
        "Slurm gave the job 16 (--cpus-per-task); it may run on 8 of this node's CPUs only",
    )
    assert slurm_job.job_cpus(12, {}) == (8, "the rule's threads, 12, as Snakemake gave them")
