"""The adapter to Snakemake's internals: a rule's resources before any job exists, and noticing a
finished Slurm job at once (the markers jobs leave, and when they call for a check)."""

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from scratchflow.snakemake_adapter import (
    JOB_ENDS,
    PATIENCE_SECONDS,
    SETTLE_SECONDS,
    ended_jobs_to_check,
    evaluated_resource,
    mark_job_end,
)
from snakemake.resources import Resource


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


def workflow_with(**resources):
    """The part of a Snakemake workflow the adapter reads: one rule, `train`, with `resources`."""
    rule = SimpleNamespace(resources={name: Resource(name, value) for name, value in resources.items()})
    return SimpleNamespace(get_rule=lambda name: rule, async_run=None)


def test_a_resource_is_evaluated_for_each_attempt_before_any_job_exists():
    workflow = workflow_with(runtime=lambda wildcards, attempt: 60 * attempt, slurm_partition="gpu")
    assert [evaluated_resource(workflow, "train", "runtime", attempt) for attempt in (1, 2)] == [60, 120]
    assert evaluated_resource(workflow, "train", "slurm_partition") == "gpu"
    assert evaluated_resource(workflow, "train", "gres") is None  # not asked for


def test_a_resource_that_depends_on_the_job_is_not_known_yet():
    workflow = workflow_with(
        runtime=lambda wildcards: 10 if wildcards.run_id.startswith("0") else 20,
        mem_mb=lambda wildcards, input: max(2 * input.size_mb, 1000),
    )
    assert evaluated_resource(workflow, "train", "runtime") is None
    assert evaluated_resource(workflow, "train", "mem_mb") is None


def test_a_mistake_in_a_profiles_expression_is_raised_not_hidden():
    workflow = workflow_with(runtime=lambda wildcards, attempt: 60 * attempts)  # noqa: F821
    with pytest.raises(NameError, match="attempts"):
        evaluated_resource(workflow, "train", "runtime")


def test_a_job_steps_snakemake_marks_the_job_end_as_it_exits_whatever_its_rule_did(tmp_path):
    """A SIGKILLed trainer cannot mark its job's end; the job step's Snakemake, which read the
    workflow (prepare_job_step), marks it as it exits, so the retry goes out within seconds."""
    step = "from scratchflow.snakemake_adapter import prepare_job_step; prepare_job_step('USR1'); raise SystemExit(1)"
    env = {**os.environ, "SLURM_JOB_ID": "77", "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "scripts")}
    ended = subprocess.run([sys.executable, "-c", step], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert ended.returncode == 1, ended.stderr
    assert (tmp_path / JOB_ENDS / "77").is_file()


def test_the_slurm_plugin_asks_the_clusters_min_job_age_once_a_run_not_once_a_status_check(tmp_path, monkeypatch):
    """Plugin 2.x runs `scontrol show config` before each squeue of the grid's jobs: two calls to the
    controller a check, where one covers the grid."""
    import snakemake_executor_plugin_slurm as plugin
    from scratchflow.snakemake_adapter import ask_min_job_age_once

    monkeypatch.setattr(plugin, "get_min_job_age", plugin.get_min_job_age)  # put back after the test
    calls = tmp_path / "calls"
    (tmp_path / "scontrol").write_text(f"#!/bin/sh\necho x >> {calls}\necho 'MinJobAge = 300 sec'\n")
    (tmp_path / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    ask_min_job_age_once()
    ask_min_job_age_once()  # a module's hooks and the host's: still once
    assert [plugin.get_min_job_age() for _ in range(5)] == [300] * 5
    assert calls.read_text().split() == ["x"]


def test_a_dict_param_keeps_the_order_snakemake_recorded_and_is_sorted_where_none_is():
    """The archive's dataset settings, reordered in the config (or written back by a tool that sorts
    YAML), compare equal to what Snakemake recorded: the archive is not rebuilt, nor every run
    retrained. Settings that differ, or none recorded, are sorted, nested dicts too."""
    from types import SimpleNamespace

    from scratchflow.snakemake_adapter import as_recorded

    recorded = {"name": "news", "path": "data/news.csv", "splits": {"train": "a", "test": "b"}, "format": "csv"}

    def workflow(params):
        return SimpleNamespace(persistence=SimpleNamespace(params=lambda output: params.get(output)))

    reordered = {"format": "csv", "splits": {"test": "b", "train": "a"}, "path": "data/news.csv", "name": "news"}
    kept = as_recorded(
        workflow({"archives/news.tar": [repr(recorded), "'fingerprint'"]}), reordered, "archives/news.tar"
    )
    assert repr(kept) == repr(recorded)
    changed = {**reordered, "format": "tsv"}
    assert list(as_recorded(workflow({"archives/news.tar": [repr(recorded)]}), changed, "archives/news.tar")) == [
        "format",
        "name",
        "path",
        "splits",
    ]
    fresh = as_recorded(workflow({}), reordered, "archives/news.tar")
    assert list(fresh) == ["format", "name", "path", "splits"] and list(fresh["splits"]) == ["test", "train"]
    assert as_recorded(SimpleNamespace(persistence=None), reordered, "archives/news.tar") == reordered
