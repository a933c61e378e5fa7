"""A lab's own pipeline, made by scripts/new_pipeline.py in a folder outside scratchflow's tree, with
scratchflow as its submodule at a release's tag and used as a Snakemake module: it plans, runs with a
task of the lab's own, records both repositories' commits, refuses what would silently lose
scratchflow's hooks or profiles, and moving the pin to a newer release retrains nothing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import LAB_TASK, REPO, git, lab_pipeline, workflow_config, workflow_env
from scratchflow import __version__

RELEASE, NEXT_RELEASE = f"v{__version__}", "v99.0.0"


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> Path:
    """scratchflow's repository as a lab would clone it: this commit tagged as its release, and a
    newer release after it that changes code (the train rule's script among it) but no run's
    identity, as its CHANGELOG says."""
    source = tmp_path_factory.mktemp("scratchflow-releases") / "scratchflow"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(source)], check=True)
    git(source, "tag", "--force", RELEASE)
    init = source / "scripts" / "scratchflow" / "__init__.py"
    init.write_text(init.read_text().replace(f'"{__version__}"', f'"{NEXT_RELEASE[1:]}"'))
    changelog = source / "CHANGELOG.md"
    entry = f"## {NEXT_RELEASE[1:]} (2026-12-01)\n\n### Changed\n- The train job's entry script.\n\n"
    changelog.write_text(changelog.read_text().replace(f"## {__version__}", entry + f"## {__version__}", 1))
    (source / "scripts" / "train.py").write_text((source / "scripts" / "train.py").read_text() + "\n# newer\n")
    git(source, "commit", "--quiet", "--all", "--message", f"Release {NEXT_RELEASE[1:]}")
    git(source, "tag", NEXT_RELEASE)
    return source


def new_pipeline(folder: Path, source: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, REPO / "scripts" / "new_pipeline.py", folder, "--source", source, *args],
        capture_output=True,
        text=True,
        env=workflow_env(),
    )


@pytest.fixture
def lab(tmp_path, releases, bbc_subset, tiny_model) -> Path:
    """A new pipeline at the release, with the lab's own task and a small grid of it, committed."""
    config = workflow_config(bbc_subset, tiny_model, tmp_path / "scratch")
    config["training"]["epochs"] = 2
    return lab_pipeline(tmp_path / "ourlab-pipeline", "narval", config, source=releases, tag=RELEASE)


def snakemake(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", "scratchflow/profiles/local", *args],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**workflow_env(), "SLURM_CONF": "/dev/null"},
    )


def test_new_pipeline_makes_a_repository_of_the_labs_files_and_scratchflow_at_the_release(tmp_path, releases):
    lab = tmp_path / "ourlab-pipeline"
    made = new_pipeline(lab, releases, "--cluster", "narval", "--tag", RELEASE)
    assert made.returncode == 0, made.stderr
    assert set(git(lab, "ls-files").splitlines()) == {
        ".gitignore", ".gitmodules", "Makefile", "README.md", "Snakefile", "config/config.yaml",
        "profiles/narval/config.v8+.yaml", "scratchflow",
    }  # fmt: skip
    assert git(lab / "scratchflow", "rev-parse", "HEAD") == git(releases, "rev-parse", f"{RELEASE}^{{commit}}")
    shown = (REPO / "docs" / "lab-pipeline.md").read_text()
    for name in ("Snakefile", "profiles/narval/config.v8+.yaml"):
        assert f"\n{(lab / name).read_text()}```" in shown, f"docs/lab-pipeline.md shows the {name} it makes"
    targets = set(re.findall(r"^make ([a-z]+)", shown, re.MULTILINE)) | set(re.findall(r"`make ([a-z]+)", shown))
    assert targets == {"run", "cluster", "status", "test"}
    for target in targets:
        planned = subprocess.run(["make", "-n", target], cwd=lab, capture_output=True, text=True)
        assert planned.returncode == 0 and "Nothing to be done" not in planned.stdout, (target, planned.stderr)
    refused = new_pipeline(lab, releases, "--cluster", "narval")
    assert refused.stderr == f"new_pipeline.py: {lab} is not empty: a new pipeline needs a folder of its own\n"
    untagged = new_pipeline(tmp_path / "elsewhere", releases, "--cluster", "narval", "--tag", "v0.0.9")
    assert untagged.returncode != 0 and not (tmp_path / "elsewhere").exists(), "nothing left behind"
    (tmp_path / "empty").mkdir()
    assert new_pipeline(tmp_path / "empty", releases, "--cluster", "narval", "--tag", "v0.0.9").returncode != 0
    assert list((tmp_path / "empty").iterdir()) == [], "a folder given empty is left empty"
    assert untagged.stderr == (
        f"new_pipeline.py: {releases} has no tag or commit 'v0.0.9' (its releases: {NEXT_RELEASE}, {RELEASE}); "
        "give --tag a release's tag or a commit\n"
    )


def test_a_pipeline_plans_its_own_task_through_the_module(lab):
    planned = snakemake(lab, "--dry-run")
    assert planned.returncode == 0, planned.stdout[-3000:]
    assert "train" in planned.stdout and "aggregate" in planned.stdout


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda snakefile: snakefile.replace("use rule * from scratchflow", "use rule * from scratchflow as sf_*"),
            "scratchflow's rules keep their own names",
        ),
        (
            lambda snakefile: snakefile + '\n\nonstart:\n    print("ours")\n',
            "define them before the line `module scratchflow:`",
        ),
    ],
    ids=["rules renamed", "onstart after the module"],
)
def test_a_host_snakefile_that_would_lose_scratchflows_profiles_or_hooks_is_refused(lab, change, message):
    snakefile = lab / "Snakefile"
    snakefile.write_text(change(snakefile.read_text()))
    refused = snakemake(lab, "--dry-run")
    assert refused.returncode != 0 and message in refused.stdout, refused.stdout[-3000:]


def test_a_lab_task_that_is_not_there_is_named_with_where_it_belongs(lab):
    config = yaml.safe_load((lab / "config" / "config.yaml").read_text())
    (lab / "config" / "config.yaml").write_text(yaml.safe_dump({**config, "task": "ourlab.segmentation"}))
    refused = snakemake(lab, "--dry-run")
    assert refused.returncode != 0
    assert "no module 'ourlab.segmentation'" in refused.stdout and "ourlab/segmentation.py" in refused.stdout


@pytest.mark.slow
def test_a_pipeline_runs_records_both_commits_and_a_newer_release_retrains_nothing(lab, releases):
    run_local = lab / "scratchflow" / "scripts" / "run_local.sh"
    first = subprocess.run([run_local], cwd=lab, capture_output=True, text=True, env=workflow_env())
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert (lab / "results" / "summary.tsv").is_file() and (lab / "results" / "plan.json").is_file()
    records = [json.loads(path.read_text()) for path in (lab / "results" / "runs").glob("*/record.json")]
    assert len(records) == 2 and {record["task"] for record in records} == {LAB_TASK}
    environment = records[0]["environment"]
    assert environment["scratchflow_version"] == __version__
    assert environment["git"] == {"commit": git(releases, "rev-parse", f"{RELEASE}^{{commit}}"), "dirty": False}
    assert environment["pipeline_git"] == {"commit": git(lab, "rev-parse", "HEAD"), "dirty": False}
    status = subprocess.run(
        [sys.executable, "scratchflow/scripts/status.py", "."], cwd=lab, capture_output=True, text=True
    )
    assert "2 runs: 2 finished" in status.stdout, status.stdout + status.stderr
    reported = snakemake(lab, "--report", "results/report.html")
    assert reported.returncode == 0 and "Report created" in reported.stdout, reported.stdout[-3000:]

    git(lab / "scratchflow", "checkout", "--quiet", NEXT_RELEASE)
    git(lab, "commit", "--quiet", "--all", "--message", f"scratchflow {NEXT_RELEASE}")
    planned = snakemake(lab, "--dry-run")
    assert planned.returncode == 0 and "Nothing to be done" in planned.stdout, planned.stdout[-3000:]


@pytest.mark.slow
def test_a_labs_own_task_is_checked_against_the_task_protocol_with_one_command(lab, bbc_subset, tiny_model):
    """scripts/check_task.py, as `make test` runs it on the lab's contract/ configs."""
    config = workflow_config(bbc_subset, tiny_model, None, task=LAB_TASK)
    config["training"]["epochs"] = 2
    config["checkpointing"]["every_steps"] = 2
    del config["cluster"]
    (lab / "contract").mkdir()
    (lab / "contract" / "texts.yaml").write_text(yaml.safe_dump(config))
    checked = subprocess.run(
        [sys.executable, "scratchflow/scripts/check_task.py", "contract/texts.yaml"],
        cwd=lab,
        capture_output=True,
        text=True,
        env=workflow_env(),
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr[-3000:]
    assert checked.stdout.count(f"contract/texts.yaml: {LAB_TASK}: ") == checked.stdout.count(": ok\n") == 5


def test_a_contract_config_scratchflow_would_not_run_is_named_in_one_line_with_its_key(tmp_path):
    """check_task.py validates each config as the workflow does, and says what is wrong with it in
    one line, naming the file and the key, rather than a traceback; the other configs still run."""
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump({"task": "text-classification", "trainng": {}}))
    demo = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    del demo["grid"]
    (tmp_path / "no_grid.yaml").write_text(yaml.safe_dump(demo))
    checked = subprocess.run(
        [sys.executable, REPO / "scripts" / "check_task.py", "typo.yaml", "no_grid.yaml", "missing.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=workflow_env(),
    )
    assert checked.returncode == 1 and "Traceback" not in checked.stderr, checked.stderr[-3000:]
    typo, no_grid, missing = checked.stdout.splitlines()
    assert typo.startswith("typo.yaml: not a config scratchflow runs: config key (top level): ") and "'trainng'" in typo
    assert no_grid.startswith("no_grid.yaml: not a config scratchflow runs: config key grid: ")
    assert missing.startswith("missing.yaml: not a config scratchflow runs: cannot read it: ")
