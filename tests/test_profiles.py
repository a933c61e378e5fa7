"""What every cluster profile must keep, whatever a lab edits: choices made on measurements
(benchmarks/README.md, "Submission at scale")."""

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CLUSTER_PROFILES = sorted(path for path in (REPO / "profiles").glob("*/config.v8+.yaml") if path.parent.name != "local")


@pytest.mark.parametrize("profile", CLUSTER_PROFILES, ids=lambda path: path.parent.name)
def test_a_cluster_profile_submits_to_slurm_with_its_clusters_facts_and_a_wall_time_warning(profile):
    """The shape every cluster profile has: the Slurm executor, the facts file of its cluster (merged
    over config/config.yaml), retries for the pieces of a long training, and the stop signal asked
    for before a train job's wall time, the one the trainer listens for by default."""
    settings = yaml.safe_load(profile.read_text())
    assert settings["executor"] == "slurm"
    facts = (profile.parent / settings["configfile"]).resolve()
    assert facts == REPO / "config" / "clusters" / f"{profile.parent.name}.yaml"
    assert yaml.safe_load(facts.read_text())["cluster"]["name"] == profile.parent.name
    assert settings["retries"] >= 1 and settings["rerun-incomplete"] is True and settings["keep-going"] is True
    train = settings["set-resources"]["train"]
    assert re.search(r"--signal=USR1@\d+", train["slurm_extra"]), "checkpointing.stop_signal's default"


@pytest.mark.parametrize("profile", CLUSTER_PROFILES, ids=lambda path: path.parent.name)
def test_short_jobs_are_seen_done_soon_and_no_job_array_can_lose_a_job(profile):
    settings = yaml.safe_load(profile.read_text())
    assert settings["slurm-init-seconds-before-status-checks"] <= 10  # the plugin's default is 40
    # Plugin 2.8's arrays can leave jobs unsubmitted forever, or run one task's job in every task.
    assert "slurm-array-jobs" not in settings
