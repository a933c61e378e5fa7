"""A lab's own pipeline, made by scripts/new_pipeline.py in a folder outside scratchflow's tree, with
scratchflow as its submodule at a release's tag and used as a Snakemake module: it plans, runs with a
task of the lab's own, records both repositories' commits, refuses what would silently lose
scratchflow's hooks or profiles, and moving the pin to a newer release retrains nothing."""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import (
    ACTIVATED,
    LAB_TASK,
    REPO,
    git,
    job_process,
    lab_pipeline,
    mlp_run,
    workflow_config,
    workflow_env,
    write_config,
)
from scratchflow import __version__
from scratchflow.contract import different_files
from scratchflow.releases import changelog_releases
from scratchflow.software import read_requirements

PINNED = git(REPO, "rev-parse", "HEAD")  # what the lab pipelines of these tests run: this commit

NEXT_RELEASE = "v99.0.0"


def clone(source: Path, folder: Path) -> Path:
    subprocess.run(["git", "clone", "--quiet", str(source), str(folder)], check=True)
    return folder


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> Path:
    """scratchflow's repository as a lab would clone it: its releases tagged as the repository tags
    them, this commit after them, and a newer release after it that changes code (the train rule's
    script among it) but no run's identity, as its CHANGELOG says."""
    source = clone(REPO, tmp_path_factory.mktemp("scratchflow-releases") / "scratchflow")
    subprocess.run([sys.executable, source / "scripts" / "tag_releases.py"], check=True, capture_output=True)
    init = source / "scripts" / "scratchflow" / "__init__.py"
    init.write_text(init.read_text().replace(f'"{__version__}"', f'"{NEXT_RELEASE[1:]}"'))
    changelog = source / "CHANGELOG.md"
    entry = f"## {NEXT_RELEASE[1:]} (2026-12-01)\n\n### Changed\n- The train job's entry script.\n\n"
    newest = f"## {changelog_releases(source)[0]} ("
    changelog.write_text(changelog.read_text().replace(newest, entry + newest, 1))
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
def lab(made_pipeline) -> Path:
    """A new pipeline at the release, with the lab's own task and a small grid of it, committed:
    made once for the module, each test's changes to it undone (files, what the workflow wrote)."""
    first_commit = git(made_pipeline, "rev-list", "--max-parents=0", "HEAD")
    git(made_pipeline, "reset", "--hard", "--quiet", first_commit)
    git(made_pipeline, "clean", "-d", "-x", "--force", "--quiet")
    git(made_pipeline / "scratchflow", "checkout", "--quiet", PINNED)
    return made_pipeline


@pytest.fixture(scope="module")
def made_pipeline(tmp_path_factory, releases, bbc_subset, tiny_model) -> Path:
    folder = tmp_path_factory.mktemp("lab")
    config = workflow_config(bbc_subset, tiny_model, folder / "scratch")
    config["training"]["epochs"] = 2
    return lab_pipeline(folder / "ourlab-pipeline", "narval", config, source=releases, tag=PINNED)


def snakemake(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", "scratchflow/profiles/local", *args],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**workflow_env(), "SLURM_CONF": "/dev/null"},
    )


def test_new_pipeline_makes_a_repository_of_the_labs_files_and_scratchflow_at_the_commit(tmp_path, releases):
    lab = tmp_path / "ourlab-pipeline"
    made = new_pipeline(lab, releases, "--cluster", "narval", "--tag", PINNED)
    assert made.returncode == 0, made.stderr
    assert set(git(lab, "ls-files").splitlines()) == {
        ".gitignore", ".gitmodules", "Makefile", "README.md", "Snakefile", "config/config.yaml",
        "profiles/narval/config.v8+.yaml", "requirements.txt", "scratchflow",
    }  # fmt: skip
    assert read_requirements(lab / "requirements.txt") == read_requirements(REPO / "requirements.txt")
    assert git(lab / "scratchflow", "rev-parse", "HEAD") == PINNED
    shown = (REPO / "docs" / "lab-pipeline.md").read_text()
    for name in ("Snakefile", "profiles/narval/config.v8+.yaml"):
        assert f"\n{(lab / name).read_text()}```" in shown, f"docs/lab-pipeline.md shows the {name} it makes"
    targets = set(re.findall(r"^make ([a-z]+)", shown, re.MULTILINE)) | set(re.findall(r"`make ([a-z]+)", shown))
    assert targets == set(re.findall(r"^([a-z]+):", (lab / "Makefile").read_text(), re.MULTILINE)) - {"environment"}
    scratchflows = set(re.findall(r"^([a-z-]+):", (REPO / "Makefile").read_text(), re.MULTILINE))
    both = {"setup", "cluster", "status", "retrain", "verify", "test"}
    assert targets & scratchflows == both, "one name, one meaning in both"
    for target in targets:
        planned = subprocess.run(["make", "-n", target], cwd=lab, capture_output=True, text=True, env=workflow_env())
        assert planned.returncode == 0 and "Nothing to be done" not in planned.stdout, (target, planned.stderr)
    refused = new_pipeline(lab, releases, "--cluster", "narval")
    assert refused.stderr == f"new_pipeline.py: {lab} is not empty: a new pipeline needs a folder of its own\n"
    untagged = new_pipeline(tmp_path / "elsewhere", releases, "--cluster", "narval", "--tag", "v0.0.9")
    assert untagged.returncode != 0 and not (tmp_path / "elsewhere").exists(), "nothing left behind"
    (tmp_path / "empty").mkdir()
    assert new_pipeline(tmp_path / "empty", releases, "--cluster", "narval", "--tag", "v0.0.9").returncode != 0
    assert list((tmp_path / "empty").iterdir()) == [], "a folder given empty is left empty"
    tags = ", ".join(["v99.0.0", *(f"v{version}" for version in changelog_releases(REPO))])
    assert untagged.stderr == (
        f"new_pipeline.py: {releases} has no tag or commit 'v0.0.9' (its releases: {tags}); "
        "give --tag a release's tag or a commit\n"
    )


BUILDING = ("python3 -m venv", "-m pip install")  # what building an environment runs


def planned(lab: Path, target: str, **environment: str) -> list[str]:
    """The commands `make TARGET` runs in the lab's folder (make -n), with the environment variables
    given and no environment active otherwise."""
    made = subprocess.run(
        ["make", "--no-print-directory", "-n", target],
        cwd=lab,
        capture_output=True,
        text=True,
        env={**planned_env(), **environment},
    )
    assert made.returncode == 0, made.stderr
    return made.stdout.replace("\\\n", " ").splitlines()


def test_every_command_runs_in_the_environment_the_lab_activated_and_builds_none(tmp_path, releases):
    """On a cluster, the lab's commands run the Python and snakemake of the environment it set up
    and activated (a venv: $VIRTUAL_ENV; conda: $CONDA_PREFIX), or named (PYTHON_ENV); nothing is
    built, not even for `make status` or `make cluster`. On a laptop with none active, `make run`
    builds .venv here first (make setup) with scratchflow's tested versions, and runs in it."""
    lab = tmp_path / "ourlab-pipeline"
    assert new_pipeline(lab, releases, "--cluster", "narval", "--tag", PINNED).returncode == 0
    cluster_env, conda_env = tmp_path / "scratchflow-env", tmp_path / "conda" / "envs" / "ourlab"
    for chosen in (
        {"VIRTUAL_ENV": str(cluster_env)},
        {"CONDA_PREFIX": str(cluster_env)},
        {"PYTHON_ENV": str(cluster_env)},
    ):
        for target in ("run", "submit", "cluster", "status", "retrain", "test"):
            commands = planned(lab, target, **chosen)
            assert not any(built in command for command in commands for built in BUILDING), (chosen, commands)
            ran = commands[-1]
            assert f"{cluster_env}/bin" in ran or target == "test", (target, commands)
        assert planned(lab, "submit", **chosen)[-1] == (
            f"{cluster_env}/bin/snakemake --profile scratchflow/profiles/narval --workflow-profile profiles/narval "
        )
    both = planned(lab, "status", VIRTUAL_ENV=str(cluster_env), CONDA_PREFIX=str(conda_env))  # a venv over conda's base
    assert both[-1] == f"{cluster_env}/bin/python scratchflow/scripts/status.py ."
    assert planned(lab, "submit", VIRTUAL_ENV=str(cluster_env), ARGS="--unlock")[-1].endswith(" --unlock")

    laptop = planned(lab, "run")
    assert laptop[0] == "python3 -m venv .venv"
    installed = ".venv/bin/python -m pip install --quiet --constraint scratchflow/constraints.txt --requirement"
    assert f"{installed} requirements.txt" in " ".join(" ".join(laptop).split())
    assert laptop[-1] == f'PATH="{lab}/.venv/bin:$PATH" scratchflow/scripts/run_local.sh '
    assert not any(built in command for command in planned(lab, "status") for built in BUILDING), "builds nothing"

    nowhere = subprocess.run(["make", "status"], cwd=lab, capture_output=True, text=True, env=planned_env())
    assert nowhere.returncode != 0 and nowhere.stderr.splitlines()[0] == (
        "make: no Python environment is active and there is no .venv here: activate the one you set up "
        "(scratchflow/docs/clusters.md), or name it (PYTHON_ENV=/path/to/env); on a laptop, make setup builds .venv"
    )
    bare = tmp_path / "bare-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", bare], check=True)
    lacking = subprocess.run(
        ["make", "status"], cwd=lab, capture_output=True, text=True, env={**planned_env(), "VIRTUAL_ENV": str(bare)}
    )
    assert lacking.returncode != 0 and lacking.stderr.splitlines()[0] == (
        f"make: the environment {bare} has no snakemake: install requirements.txt into it (pip install -r "
        "requirements.txt, or as scratchflow/docs/clusters.md says for your cluster), or name another "
        "(PYTHON_ENV=/path/to/env)"
    )
    assert not (lab / ".venv").exists() and not (lab / "scratchflow" / ".venv").exists()


def planned_env() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name not in ("VIRTUAL_ENV", "CONDA_PREFIX")}


def test_a_clone_with_its_releases_tagged_pins_the_newest_which_holds_every_file_the_pipeline_names(tmp_path, releases):
    """As a lab clones scratchflow: new_pipeline.py pins the release the clone is (or descends from),
    and refuses one that lacks a file the pipeline's Makefile, Snakefile or README names, such as
    0.1.0, which predates lab pipelines."""
    scratchflow = clone(releases, tmp_path / "scratchflow")
    git(scratchflow, "checkout", "--quiet", PINNED)
    newest = f"v{changelog_releases(REPO)[0]}"
    made = clones_new_pipeline(scratchflow, tmp_path / "ours")
    assert made.returncode == 0, made.stderr + made.stdout
    assert git(tmp_path / "ours" / "scratchflow", "describe", "--tags", "--exact-match") == newest
    assert (
        f"new_pipeline.py: the submodule's URL is the path {releases}, which a colleague's `git submodule update "
        "--init` cannot reach: point it at a repository they can clone (git submodule set-url scratchflow URL); "
        "on this machine, a clone of the pipeline gets it with `git -c protocol.file.allow=always submodule update "
        "--init` (git >= 2.38 refuses a submodule's path unless told)"
    ) in made.stdout.splitlines(), "a local path is allowed, and said"
    git(tmp_path / "ours", "commit", "--quiet", "--message", "Our pipeline")
    colleague = clone(tmp_path / "ours", tmp_path / "colleague")
    readme = (colleague / "README.md").read_text()
    (command,) = [line.split("  #")[0].strip() for line in readme.splitlines() if "submodule update" in line]
    updated = subprocess.run(command.split(), cwd=colleague, capture_output=True, text=True)
    assert updated.returncode == 0, updated.stderr
    assert git(colleague / "scratchflow", "describe", "--tags", "--exact-match") == newest, "as the README says"
    old = new_pipeline(tmp_path / "old", releases, "--cluster", "narval", "--tag", "v0.1.0")
    assert old.stderr.startswith(
        "new_pipeline.py: v0.1.0 lacks scripts/retrain.py, scripts/check_task.py, docs/lab-pipeline.md, which a "
        "pipeline's Makefile, Snakefile or README names (it predates lab pipelines): give --tag a newer release "
        "(its releases: v99.0.0, "
    )
    assert not (tmp_path / "old").exists()


def clones_new_pipeline(scratchflow: Path, folder: Path) -> subprocess.CompletedProcess:
    """A clone's own new_pipeline.py, as a lab runs it from its clone (Narval's profile)."""
    return subprocess.run(
        [sys.executable, scratchflow / "scripts" / "new_pipeline.py", folder, "--cluster", "narval"],
        capture_output=True,
        text=True,
    )


def test_a_clone_without_release_tags_pins_its_commit_and_says_so(tmp_path):
    scratchflow = clone(REPO, tmp_path / "scratchflow")
    for tag in git(scratchflow, "tag", "--list").split():
        git(scratchflow, "tag", "--delete", tag)
    made = clones_new_pipeline(scratchflow, tmp_path / "ours")
    assert made.returncode == 0, made.stderr
    commit = git(scratchflow, "rev-parse", "--short=12", "HEAD")
    assert f"new_pipeline.py: pinned commit {commit}, not a release: " in made.stdout
    assert git(tmp_path / "ours" / "scratchflow", "rev-parse", "HEAD") == git(scratchflow, "rev-parse", "HEAD")


def test_a_clone_past_its_release_pins_the_release_and_says_how_to_pin_the_clone(tmp_path):
    """A lab reading main's docs in a clone of main gets the release main descends from: it is told
    so, and how to pin what it read about (a newcomer's pipeline pinned v0.2.0 from a clone 56
    commits later, whose tasks.md described what v0.2.0 lacks)."""
    # Tagged upstream, as the lab's clone (and the submodule cloned from its origin) finds it: the
    # checkout under test may hold no tags at all (CI's does not).
    upstream = clone(REPO, tmp_path / "upstream")
    subprocess.run([sys.executable, upstream / "scripts" / "tag_releases.py"], check=True, capture_output=True)
    git(upstream, "commit", "--quiet", "--allow-empty", "--message", "later")
    scratchflow = clone(upstream, tmp_path / "scratchflow")
    release = git(scratchflow, "describe", "--tags", "--abbrev=0", "HEAD")
    after = int(git(scratchflow, "rev-list", "--count", f"{release}..HEAD"))
    made = clones_new_pipeline(scratchflow, tmp_path / "ours")
    assert made.returncode == 0, made.stderr
    commit = git(scratchflow, "rev-parse", "--short=12", "HEAD")
    commits = f"{after} commit{'s' * (after > 1)}"
    assert (
        f"new_pipeline.py: pinned {release}, the release this clone descends from; the clone is {commits} "
        f"after it (CHANGELOG.md, Unreleased), and its docs may say more than {release} does: --tag {commit} pins them"
    ) in made.stdout.splitlines()
    assert git(tmp_path / "ours" / "scratchflow", "describe", "--tags", "--exact-match") == release


def test_a_cluster_of_the_labs_own_is_its_profile_copied_whole_with_its_facts(tmp_path, releases):
    """--cluster PATH: a profile of the lab's own (here Narval's, as a lab would start from it), its
    facts file beside it; the pipeline runs with it alone, and plans."""
    own = tmp_path / "ourhpc"
    own.mkdir()
    profile = (REPO / "profiles" / "narval" / "config.v8+.yaml").read_text()
    (own / "config.v8+.yaml").write_text(profile.replace("../../config/clusters/narval.yaml", "ourhpc-facts.yaml"))
    facts = yaml.safe_load((REPO / "config" / "clusters" / "narval.yaml").read_text())
    facts["cluster"]["name"] = "ourhpc"
    (own / "ourhpc-facts.yaml").write_text(yaml.safe_dump(facts))
    lab = tmp_path / "ourlab-pipeline"
    made = new_pipeline(lab, releases, "--cluster", str(own), "--tag", PINNED)
    assert made.returncode == 0, made.stderr
    assert {"profiles/ourhpc/config.v8+.yaml", "config/clusters/ourhpc.yaml"} <= set(git(lab, "ls-files").split())
    assert "configfile: ../../config/clusters/ourhpc.yaml\n" in (lab / "profiles/ourhpc/config.v8+.yaml").read_text()
    assert "PROFILE := --profile profiles/ourhpc\n" in (lab / "Makefile").read_text()
    planned = subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", "profiles/ourhpc", "--dry-run"],
        cwd=lab,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**workflow_env(), "SLURM_CONF": "/dev/null"},
    )
    assert planned.returncode == 0 and "rule train:" in planned.stdout, planned.stdout[-3000:]
    (tmp_path / "nofacts").mkdir()
    (tmp_path / "nofacts" / "config.v8+.yaml").write_text("executor: slurm\n")
    refused = new_pipeline(tmp_path / "other", releases, "--cluster", str(tmp_path / "nofacts"))
    assert refused.stderr.startswith(f"new_pipeline.py: --cluster {tmp_path / 'nofacts'}: its config.v8+.yaml has ")
    assert not (tmp_path / "other").exists()


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


def test_a_bug_in_a_labs_task_is_named_at_start_up_in_one_line_with_its_line(lab):
    """A lab's check_data that raises what the protocol does not name (its bug, not the config's):
    the task, the exception and the task's line, before anything runs; no traceback of it."""
    task = lab / "ourlab" / "texts.py"
    task.write_text(task.read_text() + "\n\ndef check_data(dataset, sources):\n    return dataset['no_such_key']\n")
    refused = snakemake(lab, "--dry-run")
    assert refused.returncode != 0
    assert (
        f"task ourlab.texts: its check_data raised KeyError: 'no_such_key' (raised at {task}:6 (in check_data))"
        in refused.stdout
    ), refused.stdout[-3000:]
    assert "Traceback" not in refused.stdout and not (lab / "results").exists()


def off_the_cluster(lab: Path, *command: str) -> subprocess.CompletedProcess:
    """`command` in the lab's folder where Slurm does not answer (a Slurm client whose controller is
    not configured), as on a laptop; its whole output in `.stdout`."""
    return subprocess.run(
        list(command),
        cwd=lab,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**workflow_env(), "SLURM_CONF": "/dev/null"},
        timeout=300,
    )


def test_submitting_where_slurm_does_not_answer_says_so_in_one_line_and_submits_nothing(lab):
    """`make submit` off the cluster."""
    submitted = off_the_cluster(lab, sys.executable, "-m", "snakemake", "--profile", "scratchflow/profiles/narval")
    assert submitted.returncode != 0 and "Traceback" not in submitted.stdout, submitted.stdout[-3000:]
    assert "scratchflow preflight: Slurm did not answer (" in submitted.stdout, submitted.stdout[-3000:]
    assert "run from the cluster's login node (or skip the check: --config preflight=False)" in submitted.stdout
    assert not (lab / ".snakemake" / "slurm_logs").exists() and not (lab / "archives").exists()


def test_make_test_off_the_cluster_plans_and_says_in_one_line_that_it_could_not_ask_the_cluster(lab):
    """The lab's `make test` on a laptop (here: a Slurm client whose controller is not configured):
    its dry run with the cluster's profile asks Slurm, which does not answer, and plans on."""
    tested = off_the_cluster(lab, "make", "test")
    assert tested.returncode == 0 and "Traceback" not in tested.stdout, tested.stdout[-3000:]
    said = [line for line in tested.stdout.splitlines() if "preflight" in line]
    assert len(said) == 1 and said[0].startswith("scratchflow preflight: Slurm did not answer ("), said
    assert said[0].endswith(
        "so this dry run could not ask the cluster whether it would run these jobs, nor check their software (on its "
        "login node, the dry run does both)"
    )
    assert not any((lab / folder).exists() for folder in ("archives", "models", "results"))


def test_no_hooks_skips_no_check_and_is_refused_where_jobs_need_the_start_up_to_run_in_their_image(lab):
    """--no-hooks skips scratchflow's onstart, not its checks: the preflight still asks Slurm (which,
    not answering here, refuses the run); on a container cluster, whose job steps onstart puts in
    their image, it is refused in one line first. Nothing submitted or written either way."""

    def submit(profile: str) -> subprocess.CompletedProcess:
        return off_the_cluster(
            lab, sys.executable, "-m", "snakemake", "--profile", f"scratchflow/profiles/{profile}", "--no-hooks"
        )

    checked = submit("narval")
    assert checked.returncode != 0 and "scratchflow preflight: Slurm did not answer (" in checked.stdout, checked.stdout
    refused = submit("dfki")
    assert refused.returncode != 0 and "Traceback" not in refused.stdout, refused.stdout[-3000:]
    assert (
        "scratchflow: --no-hooks skips the start-up that puts the job steps of cluster 'dfki' in their container "
        "image ($SCRATCHFLOW_IMAGE), so its jobs would run outside it: run without --no-hooks (to skip only the "
        "preflight: --config preflight=False)\n"
    ) in refused.stdout
    assert "preflight: Slurm did not answer" not in refused.stdout
    assert not (lab / ".snakemake" / "slurm_logs").exists() and not (lab / "archives").exists()


# docs/lab-pipeline.md's upgrade, as a lab runs it in its pipeline, its environment active.
UPGRADE_RECIPE = re.search(
    r"## Upgrade scratchflow\n\n```bash\n(.*?)```", (REPO / "docs" / "lab-pipeline.md").read_text(), re.S
)[1]
AS_A_LAB = {
    **workflow_env(),
    **ACTIVATED,
    "SLURM_CONF": "/dev/null",
    **{
        f"GIT_{who}_{what}": value
        for who in ("AUTHOR", "COMMITTER")
        for what, value in (("NAME", "Lab"), ("EMAIL", "lab@example.org"))
    },
}


def make(lab: Path, *targets: str) -> subprocess.CompletedProcess:
    """The pipeline's own make, as a lab runs it with its environment active."""
    return subprocess.run(
        ["make", "--no-print-directory", *targets], cwd=lab, capture_output=True, text=True, env=AS_A_LAB
    )


@pytest.mark.slow
def test_a_newer_release_retrains_nothing_and_an_edit_verified_to_change_no_result_stops_flagging_the_runs(
    tmp_path, releases
):
    """A grid of the lab's plain-PyTorch task trained under this commit, its records naming both
    repositories' commits; the task edited mechanically and the pin moved to the next release, which
    changes no run's identity: nothing is to be done, and `make status` flags both runs and names
    `make verify`, which trains the cheaper again in a folder of its own, finds the same weights,
    metrics and predictions, and records it; then the status, runs.tsv and the page say verified, and
    ask to retrain nothing. An edit that changes the initialisation is flagged again, found different
    by `make verify`, and stays flagged."""
    two_runs = {**mlp_run(epochs=20, every_steps=200), "grid": {"seed": [0, 1]}}
    lab = lab_pipeline(tmp_path / "ourlab", "narval", two_runs, source=releases, tag=PINNED)
    run_local = lab / "scratchflow" / "scripts" / "run_local.sh"
    first = subprocess.run([run_local], cwd=lab, capture_output=True, text=True, env=workflow_env())
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    records = [json.loads(path.read_text()) for path in (lab / "results" / "runs").glob("*/record.json")]
    assert len(records) == 2 and {record["task"] for record in records} == {"ourlab.mlp"}
    environment = records[0]["environment"]
    assert environment["scratchflow_version"] == __version__
    assert environment["git"] == {"commit": PINNED, "dirty": False}
    assert environment["pipeline_git"] == {"commit": git(lab, "rev-parse", "HEAD"), "dirty": False}
    assert "2 runs: 2 finished" in make(lab, "status").stdout
    task = lab / "ourlab" / "mlp.py"
    task.write_text(task.read_text().replace(" mlp(", " multilayer_perceptron("))  # a rename: no result changes
    git(lab / "scratchflow", "checkout", "--quiet", NEXT_RELEASE)
    git(lab, "commit", "--quiet", "--all", "--message", f"Our task's names; scratchflow {NEXT_RELEASE}")
    planned = snakemake(lab, "--dry-run")
    assert planned.returncode == 0 and "Nothing to be done" in planned.stdout, planned.stdout[-3000:]
    flagged = make(lab, "status").stdout
    runs = re.search(r'make verify RUNS="([^"]+)"', flagged)[1].split()
    assert sorted(runs) == sorted(path.name for path in (lab / "results" / "runs").iterdir())
    assert f"trained 2 of 2 runs: {', '.join(runs)}" in flagged, flagged

    verified = make(lab, "verify", f"RUNS={' '.join(runs)}")
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
    assert "has the same weights, metrics and predictions, byte for byte" in verified.stdout
    status = make(lab, "status").stdout
    today = datetime.date.today().isoformat()
    assert "trained by other code or packages, verified (make verify) to give the same results:" in status, status
    assert "gave the same weights, metrics and predictions, byte for byte" in status and today in status
    assert "trained by other code or packages:" not in status and "make retrain" not in status
    assert not (lab / ".snakemake" / "scratchflow" / "verify").exists() or not any(
        (lab / ".snakemake" / "scratchflow" / "verify").iterdir()
    )
    assert snakemake(lab).returncode == 0, "the comparison made again, with what make verify found"
    table = pd.read_csv(lab / "results" / "runs.tsv", sep="\t")
    assert set(table["verified"]) == {today}
    assert "verified (make verify)" in (lab / "results" / "summary.html").read_text()
    reported = snakemake(lab, "--report", "results/report.html")
    assert reported.returncode == 0 and "Report created" in reported.stdout, reported.stdout[-3000:]

    task.write_text(
        task.read_text().replace('torch.manual_seed(params["seed"])', 'torch.manual_seed(params["seed"] + 1)')
    )
    differing = make(lab, "verify", f"RUNS={' '.join(runs)}")
    assert differing.returncode != 0 and "differs in model/" in differing.stdout, differing.stdout[-3000:]
    status = make(lab, "status").stdout
    assert "trained by other code or packages:" in status and "make retrain" in status, status
    assert "make verify found it changes results (run " in status and "make verify RUNS" not in status, status


PAUSED_MID_GRID = mlp_run(epochs=100, every_steps=200)


@pytest.mark.slow
def test_a_run_paused_under_one_release_resumes_under_the_next_to_an_uninterrupted_runs_weights(tmp_path, releases):
    """The upgrade recipe mid-grid: a run of the lab's plain-PyTorch task, paused (USR1) at a
    checkpoint under this commit; the pin moved to the next release (which changes no run's
    identity); the same command resumes the run from its checkpoint, and it ends with the weights and
    metrics of the run trained uninterrupted under the next release."""
    lab = lab_pipeline(tmp_path / "ourlab", "narval", PAUSED_MID_GRID, source=releases, tag=PINNED)
    workflow = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--profile", "scratchflow/profiles/local", "--retries", "0"],
        cwd=lab,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=workflow_env(),
    )
    while not list(lab.glob("checkpoints/*/checkpoint-*/COMPLETE")):
        assert workflow.poll() is None, workflow.communicate()[0][-3000:]
        time.sleep(0.05)
    os.kill(job_process(lab), signal.SIGUSR1)
    paused = workflow.communicate(timeout=600)[0]
    assert workflow.returncode != 0 and not list(lab.glob("results/runs/*/record.json")), paused[-3000:]

    upgraded = subprocess.run(
        ["bash", "-e", "-c", UPGRADE_RECIPE], cwd=lab, capture_output=True, text=True, env=AS_A_LAB
    )
    assert upgraded.returncode == 0, upgraded.stdout[-3000:] + upgraded.stderr[-3000:]
    assert git(lab / "scratchflow", "describe", "--tags") == NEXT_RELEASE, "the newest release"
    assert git(lab, "log", "-1", "--format=%s") == f"scratchflow {NEXT_RELEASE}" and not git(lab, "status", "--short")
    resumed = snakemake(lab)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    (run,) = (lab / "results" / "runs").iterdir()
    record = json.loads((run / "record.json").read_text())
    first, second = record["pieces"]
    assert (first["outcome"], first["signal"]) == ("paused", "SIGUSR1")
    assert first["reached_step"] == second["resumed_from_step"] > 0
    assert record["environment"]["scratchflow_version"] == NEXT_RELEASE[1:]

    uninterrupted = lab_pipeline(
        tmp_path / "uninterrupted", "narval", PAUSED_MID_GRID, source=releases, tag=NEXT_RELEASE
    )
    assert snakemake(uninterrupted).returncode == 0
    reference = uninterrupted / "results" / "runs" / run.name
    assert different_files(run / "model", reference / "model") == []
    assert (run / "metrics.json").read_bytes() == (reference / "metrics.json").read_bytes()


def check_task(lab: Path, contract: str) -> subprocess.CompletedProcess:
    """scratchflow/scripts/check_task.py on one of the lab's contract configs, as `make test` runs it."""
    command = [sys.executable, "scratchflow/scripts/check_task.py", contract]
    return subprocess.run(command, cwd=lab, capture_output=True, text=True, env=workflow_env())


@pytest.mark.slow
def test_a_labs_own_task_is_checked_against_the_task_protocol_with_one_command(lab, bbc_subset, tiny_model):
    """scripts/check_task.py, as `make test` runs it on the lab's contract/ configs."""
    config = workflow_config(bbc_subset, tiny_model, None, task=LAB_TASK)
    config["training"]["epochs"] = 2
    config["checkpointing"]["every_steps"] = 2
    del config["cluster"]
    (lab / "contract").mkdir()
    (lab / "contract" / "texts.yaml").write_text(yaml.safe_dump(config))
    checked = check_task(lab, "contract/texts.yaml")
    assert checked.returncode == 0, checked.stdout + checked.stderr[-3000:]
    assert checked.stdout.count(f"contract/texts.yaml: {LAB_TASK}: ") == checked.stdout.count(": ok\n") == 7


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


def test_a_labs_regression_ranks_by_the_lowest_rmse_draws_its_own_figure_and_refuses_a_halving_search(tmp_path):
    """A materials lab's regression task (tests/regression_lab: an MLP predicting a number, written in
    130 lines with no pruning, progress arithmetic or halving branch): its contract passes (the rung
    check skipped, as it declares); its grid, with no `aggregate:` in the config, names the run of the
    lowest RMSE best; the page shows its predicted-against-true figure and no confusion matrix; a
    halving search, or a goal that contradicts its declaration, is refused at start-up in one line."""
    config = {
        "task": "ourlab.regression",
        "dataset": {"name": "materials", "path": "data/materials.csv", "format": "csv", "target_column": "band_gap"},
        "training": {"epochs": 4},
        "grid": {"learning_rate": [0.001, 0.03]},
        "cluster": {"scratch_root": str(tmp_path / "scratch")},
    }
    lab = lab_pipeline(tmp_path / "lab", "narval", config)

    def run(*args: str) -> subprocess.CompletedProcess:
        command = [lab / "scratchflow" / "scripts" / "run_local.sh", *args]
        return subprocess.run(command, cwd=lab, capture_output=True, text=True, env=workflow_env())

    checked = check_task(lab, "contract/regression.yaml")
    assert checked.returncode == 0, checked.stdout + checked.stderr[-3000:]
    assert checked.stdout.count(": ok\n") == 6
    assert "a halving search's rung: skipped: TRAINS_RUNGS is False" in checked.stdout
    assert checked.stderr == "", "nothing but the checks' lines"

    trained = run()
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    runs = pd.read_csv(lab / "results" / "runs.tsv", sep="\t")
    lowest = runs.loc[runs["rmse"].idxmin(), "run_id"]
    assert runs["rmse"].nunique() == 2
    best = json.loads((lab / "results" / "best_run.json").read_text())
    assert best["goal"] == "min" and best["run"]["run_id"] == lowest
    metrics = [column for column in runs.columns if column in ("rmse", "mae")]
    assert metrics == ["rmse", "mae"] and "hidden" not in runs.columns, "the ranking metric first; no constant"
    assert (lab / "results" / "runs" / lowest / "figures" / "predicted_vs_true.png").is_file()
    page = (lab / "results" / "summary.html").read_text()
    assert "predicted_vs_true" in page and "confusion" not in page.lower()
    assert not (lab / "results" / "best_confusion_matrix.png").exists()
    assert "confusion" not in trained.stdout + trained.stderr

    write_config(lab, {**config, "aggregate": {"goal": "max"}})
    contradicted = run("--dry-run")
    assert contradicted.returncode != 0 and "Traceback" not in contradicted.stderr
    assert "config key aggregate.goal: max contradicts task 'ourlab.regression', which says lower rmse is better" in (
        contradicted.stderr
    )
    del config["grid"]
    space = {"learning_rate": {"log_uniform": [0.001, 0.03]}}
    config["search"] = {"kind": "halving", "trials": 4, "seed": 0, "rungs": [2, 4], "keep": 0.5, "space": space}
    write_config(lab, config)
    halving = run("--dry-run")
    assert halving.returncode != 0 and "Traceback" not in halving.stderr
    assert "config key search.kind: task 'ourlab.regression' trains no halving search's rungs" in halving.stderr
