"""A lab's own pipeline on scratchflow: a repository that holds only what is the lab's (its Snakefile
of a few lines, config, profile layers, tasks and programs) and scratchflow as a git submodule
checked out at a release's tag, used as a Snakemake module. `scripts/new_pipeline.py` makes one.

Upgrading is moving the submodule to a newer tag (`git -C scratchflow checkout v0.2.0`): the
CHANGELOG says what between the two changes a run's identity, the one thing that retrains runs.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from scratchflow import SCRATCHFLOW_DIR, __version__

SUBMODULE = "scratchflow"  # where the lab's repository holds scratchflow
CLUSTERS = ("dfki", "edinburgh", "lrz", "narval", "oscer")

HOST_SNAKEFILE = """\
# {name}: our pipeline on scratchflow, the submodule {submodule}/ at a release's tag.
# Upgrading is checking out a newer tag there (read {submodule}/CHANGELOG.md first).
configfile: "config/config.yaml"


module scratchflow:
    snakefile:
        "{submodule}/Snakefile"
    config:
        config


use rule * from scratchflow
"""

PROFILE_LAYER = """\
# Our settings over scratchflow's {cluster} profile, key by key (a key set here replaces that key
# of scratchflow's profile whole). Run with:
#   snakemake --profile {submodule}/profiles/{cluster} --workflow-profile profiles/{cluster}
# e.g. our account's allowance of jobs, or the train rule's resources for our models:
# set-resources:
#   train:
#     runtime: 720
jobs: 100
"""

MAKEFILE = """\
# Our pipeline: `make run` here, `make cluster` on {cluster}'s login node, `make test` before a push.
SCRATCHFLOW := {submodule}
PYTHON := $(SCRATCHFLOW)/.venv/bin/python
SNAKEMAKE := $(SCRATCHFLOW)/.venv/bin/snakemake

.PHONY: setup run cluster status test

setup:  ## scratchflow's venv (its requirements and the demo's data and model) in $(SCRATCHFLOW)/.venv
\t$(MAKE) -C $(SCRATCHFLOW) setup

run: setup  ## the whole grid on this machine
\t$(SCRATCHFLOW)/scripts/run_local.sh

cluster: setup  ## the whole grid on {cluster}, from its login node
\t$(SNAKEMAKE) --profile $(SCRATCHFLOW)/profiles/{cluster} --workflow-profile profiles/{cluster}

status: setup  ## where every run stands
\t$(PYTHON) $(SCRATCHFLOW)/scripts/status.py .

test: setup  ## the grid plans, here and on {cluster}; our tasks keep scratchflow's task protocol
\t$(SNAKEMAKE) --profile $(SCRATCHFLOW)/profiles/local --dry-run --quiet
\t$(SNAKEMAKE) --profile $(SCRATCHFLOW)/profiles/{cluster} --workflow-profile profiles/{cluster} --dry-run --quiet
\t$(if $(wildcard contract/*.yaml),$(PYTHON) $(SCRATCHFLOW)/scripts/check_task.py $(wildcard contract/*.yaml))
"""

GITIGNORE = """\
# What the workflow writes into its working directory
.snakemake/
archives/
models/
checkpoints/
results/
logs/
__pycache__/
slurm-*.out
"""

README = """\
# {name}

Our experiments, on scratchflow {version}, pinned as the submodule `{submodule}/` (its docs:
`{submodule}/docs/lab-pipeline.md`).

```bash
git submodule update --init   # after cloning this repository
make run                      # the grid in config/config.yaml on this machine
make cluster                  # the same on {cluster}, from its login node
make status                   # where every run stands
make test                     # the grid plans, here and on {cluster}
```

Our tasks live beside the Snakefile as Python modules (`task: ourlab.segmentation` is
`ourlab/segmentation.py` and `ourlab/segmentation.schema.yaml`); our cluster settings in
`profiles/{cluster}/`, over scratchflow's.
"""


class PipelineError(RuntimeError):
    """A pipeline that cannot be made as asked: said in one line, nothing left behind."""


def git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True).stdout


def make_pipeline(folder: Path, cluster: str, source: str, tag: str) -> None:
    """A lab's repository in `folder`: git, scratchflow from `source` (a repository's URL or path) as
    the submodule at `tag`, and the lab's own files, staged for its first commit."""
    if cluster not in CLUSTERS:
        raise PipelineError(f"--cluster {cluster!r}: one of {', '.join(CLUSTERS)}")
    if folder.exists() and any(folder.iterdir()):
        raise PipelineError(f"{folder} is not empty: a new pipeline needs a folder of its own")
    existed = folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        git(folder, "init", "--quiet")
        # A path as the source is a local repository, which git refuses to clone for a submodule unless told.
        git(folder, "-c", "protocol.file.allow=always", "submodule", "--quiet", "add", source, SUBMODULE)
        pin(folder / SUBMODULE, source, tag)
    except BaseException:
        shutil.rmtree(folder)  # left as it was, absent or empty, so that a second try starts clean
        if existed:
            folder.mkdir()
        raise
    fields = {"name": folder.resolve().name, "submodule": SUBMODULE, "cluster": cluster, "version": tag}
    files = {
        "Snakefile": HOST_SNAKEFILE,
        f"profiles/{cluster}/config.v8+.yaml": PROFILE_LAYER,
        "Makefile": MAKEFILE,
        ".gitignore": GITIGNORE,
        "README.md": README,
    }
    for name, template in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(template.format(**fields))
    (folder / "config").mkdir()
    shutil.copy(SCRATCHFLOW_DIR / "config" / "config.yaml", folder / "config" / "config.yaml")
    git(folder, "add", "--all")


def pin(checkout: Path, source: str, tag: str) -> None:
    """Check scratchflow's `checkout` out at `tag` (a release's tag, or any commit)."""
    try:
        git(checkout, "checkout", "--quiet", tag)
    except subprocess.CalledProcessError:
        releases = git(checkout, "tag", "--list", "v*", "--sort=-v:refname").split()
        raise PipelineError(
            f"{source} has no tag or commit {tag!r} (its releases: {', '.join(releases) or 'none tagged'}); "
            "give --tag a release's tag or a commit"
        ) from None


def default_source() -> str:
    """Where this scratchflow came from (its origin), or this checkout itself."""
    try:
        return git(SCRATCHFLOW_DIR, "remote", "get-url", "origin").strip()
    except subprocess.CalledProcessError:
        return str(SCRATCHFLOW_DIR)


def default_tag() -> str:
    return f"v{__version__}"
