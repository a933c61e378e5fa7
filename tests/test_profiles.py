"""What every cluster profile must keep, whatever a lab edits: choices made on measurements
(benchmarks/README.md, "Submission at scale")."""

from pathlib import Path

import pytest
import yaml

CLUSTER_PROFILES = sorted(
    path
    for path in (Path(__file__).resolve().parents[1] / "profiles").glob("*/config.v8+.yaml")
    if path.parent.name != "local"
)


def test_there_are_five_cluster_profiles():
    assert [path.parent.name for path in CLUSTER_PROFILES] == ["dfki", "edinburgh", "lrz", "narval", "oscer"]


@pytest.mark.parametrize("profile", CLUSTER_PROFILES, ids=lambda path: path.parent.name)
def test_short_jobs_are_seen_done_soon_and_no_job_array_can_lose_a_job(profile):
    settings = yaml.safe_load(profile.read_text())
    assert settings["slurm-init-seconds-before-status-checks"] <= 10  # the plugin's default is 40
    # Plugin 2.8's arrays can leave jobs unsubmitted forever, or run one task's job in every task.
    assert "slurm-array-jobs" not in settings
