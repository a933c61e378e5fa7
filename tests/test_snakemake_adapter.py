"""Noticing a finished Slurm job at once: the markers jobs leave, and when they call for a check."""

import os
import time

from scratchflow.snakemake_adapter import PATIENCE_SECONDS, SETTLE_SECONDS, ended_jobs_to_check, mark_job_end


def marked(directory, job_id, seconds_ago):
    mark_job_end(directory, {"SLURM_JOB_ID": job_id})
    moment = time.time() - seconds_ago
    os.utime(directory / job_id, (moment, moment))


def test_a_job_outside_slurm_leaves_no_marker(tmp_path):
    mark_job_end(tmp_path / "ends", {})
    assert not (tmp_path / "ends").exists()


def test_a_listed_job_that_ended_a_moment_ago_calls_for_a_check_and_again_until_it_is_gone(tmp_path):
    now = time.time()
    marked(tmp_path, "101", seconds_ago=SETTLE_SECONDS / 2)
    assert not ended_jobs_to_check(tmp_path, {"101"}, now, checked_at=0), "its batch script is still exiting"
    assert ended_jobs_to_check(tmp_path, {"101"}, now + SETTLE_SECONDS, checked_at=0)
    # Still listed after that check (completing): checked again, but not at once.
    assert not ended_jobs_to_check(tmp_path, {"101"}, now + SETTLE_SECONDS + 0.5, checked_at=now + SETTLE_SECONDS)
    assert ended_jobs_to_check(tmp_path, {"101"}, now + 2 * SETTLE_SECONDS, checked_at=now + SETTLE_SECONDS)
    # Seen ended by the plugin: its marker goes, and nothing calls for a check.
    assert not ended_jobs_to_check(tmp_path, set(), now + 3 * SETTLE_SECONDS, checked_at=now)
    assert list(tmp_path.iterdir()) == []


def test_a_job_still_listed_long_after_its_marker_is_left_to_the_plugins_interval(tmp_path):
    """The next run of a pack goes on in the same Slurm job after the first marked its end."""
    marked(tmp_path, "102", seconds_ago=PATIENCE_SECONDS + 1)
    assert not ended_jobs_to_check(tmp_path, {"102"}, time.time(), checked_at=0)
    assert list(tmp_path.iterdir()) == []


def test_no_marker_folder_calls_for_no_check(tmp_path):
    assert not ended_jobs_to_check(tmp_path / "missing", {"1"}, time.time(), checked_at=0)
