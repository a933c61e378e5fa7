"""A lab's own pipeline on scratchflow: a repository that holds only what is the lab's (its Snakefile
of a few lines, config, profile layers, tasks and programs) and scratchflow as a git submodule
checked out at a release's tag, used as a Snakemake module. `scripts/new_pipeline.py` makes one.

Upgrading is moving the submodule to a newer tag (`git -C scratchflow checkout v0.2.0`): the
CHANGELOG says what between the two changes a run's identity, the one thing that retrains runs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from scratchflow import SCRATCHFLOW_DIR
from scratchflow.releases import TAG_PATTERN, git, release_of

SUBMODULE = "scratchflow"  # where the lab's repository holds scratchflow
SUBMODULE_UPDATE = "git submodule update --init"
# A submodule whose URL is a path: git >= 2.38 clones it only when told (protocol.file.allow).
SUBMODULE_UPDATE_FROM_A_PATH = "git -c protocol.file.allow=always submodule update --init"
CLUSTERS = ("dfki", "edinburgh", "lrz", "narval", "oscer")
PROFILE_FILE = "config.v8+.yaml"
FACTS_FOLDER = "config/clusters"  # a cluster's facts, in scratchflow's tree and in a lab's own profile's pipeline
CONFIGFILE_LINE = re.compile(r"^configfile:[ \t]*(?P<path>\S+)[ \t]*$", re.MULTILINE)

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
# e.g. our account's allowance of jobs. One rule's resource (set-resources) goes in as a switch, with
# the rest of scratchflow's key beside it ({submodule}/docs/lab-pipeline.md, "Your settings over a
# cluster's profile").
jobs: 100
"""

MAKEFILE = """\
# Our pipeline: `make run` here, `make submit` on {cluster}'s login node, `make test` before a push.
# Every command runs with the Python environment you activated, holding requirements.txt (on
# {cluster}: the one {submodule}/docs/clusters.md sets up for it); or name one, here once
# (PYTHON_ENV := /path/to/env) or per command (make status PYTHON_ENV=/path/to/env). With none
# active, on a laptop, `make setup` builds .venv here, which `make run` does first.
PYTHON_ENV ?= $(or $(VIRTUAL_ENV),$(CONDA_PREFIX),$(CURDIR)/.venv)
PYTHON := $(PYTHON_ENV)/bin/python
SNAKEMAKE := $(PYTHON_ENV)/bin/snakemake
BUILT_HERE := $(filter $(CURDIR)/.venv,$(abspath $(PYTHON_ENV)))
SCRATCHFLOW := {submodule}
# The Slurm plugin's efficiency report imported only where a run writes it (0.5 on).
REPORT_ON_USE := $(wildcard $(SCRATCHFLOW)/envs/site-packages/snakemake_slurm_report_on_use.*)
PROFILE := {profile_arguments}
# More for Snakemake (run, submit, test's cluster dry run): make submit ARGS="--unlock"
ARGS ?=
NO_VERIFY := make verify: the scratchflow checked out here has no scripts/verify.py: upgrade it \\
    (its docs/lab-pipeline.md says how) or run git submodule update --init

.PHONY: setup environment run submit cluster status retrain verify test

setup: .venv/.installed  ## a laptop's venv in .venv: requirements.txt at the versions scratchflow tests

# Releases before 0.4 pin exact versions in requirements.txt and have no constraints.txt.
.venv/.installed: requirements.txt $(SCRATCHFLOW)/requirements.txt
\tpython3 -m venv .venv
\t.venv/bin/python -m pip install --quiet --upgrade pip
\t@echo "make setup: torch comes from PyPI, on Linux as its CUDA build (several GB); for the CPU build, first:" \\
\t     ".venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
\t.venv/bin/python -m pip install --quiet $(addprefix --constraint ,$(wildcard $(SCRATCHFLOW)/constraints.txt)) \\
\t    --requirement requirements.txt
\t$(if $(REPORT_ON_USE),cp $(REPORT_ON_USE) \\
\t    "$$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')")
\ttouch $@

environment:
\t@[ -d "$(PYTHON_ENV)" ] || {{ echo "make: $(if $(BUILT_HERE),no Python environment is active and there is no" \\
\t    ".venv here,the environment $(PYTHON_ENV) does not exist): activate the one you set up" \\
\t    "($(SCRATCHFLOW)/docs/clusters.md), or name it (PYTHON_ENV=/path/to/env); on a laptop, make setup builds" \\
\t    ".venv" >&2; exit 1; }}
\t@[ -x "$(SNAKEMAKE)" ] || {{ echo "make: the environment $(PYTHON_ENV) has no snakemake: install requirements.txt" \\
\t    "into it (pip install -r requirements.txt, or as $(SCRATCHFLOW)/docs/clusters.md says for your cluster)," \\
\t    "or name another (PYTHON_ENV=/path/to/env)" >&2; exit 1; }}

run: $(if $(BUILT_HERE),setup) environment  ## the whole grid on this machine
\tPATH="$(PYTHON_ENV)/bin:$$PATH" $(SCRATCHFLOW)/scripts/run_local.sh $(ARGS)

submit: environment  ## the whole grid on {cluster}, from its login node, in tmux (Snakemake stays there)
\t@[ -n "$$TMUX$$STY" ] || [ ! -t 0 ] || echo "make submit: not in tmux or screen, so the grid's Snakemake ends" \\
\t    "with this login session (the grid resumes where it stopped when you run it again)" >&2
\t$(SNAKEMAKE) $(PROFILE) $(ARGS)

cluster: environment  ## what {cluster} offers our jobs: idle GPUs and pending jobs per partition; changes nothing
\t$(PYTHON) $(SCRATCHFLOW)/scripts/cluster.py {profile_folders}

status: environment  ## where every run stands
\t$(PYTHON) $(SCRATCHFLOW)/scripts/status.py .

retrain: environment  ## train the runs in RUNS again from zero, and nothing else (make status prints the line)
\t$(PYTHON) $(SCRATCHFLOW)/scripts/retrain.py $(RUNS) -- $(SNAKEMAKE) $(PROFILE)

verify: environment  ## the cheapest of RUNS trained again and compared: what changed changes no result?
\t$(PYTHON) $(or $(wildcard $(SCRATCHFLOW)/scripts/verify.py),$(error $(NO_VERIFY))) $(RUNS) -- $(SNAKEMAKE) $(PROFILE)

test: environment  ## the grid plans here and on {cluster} (its jobs' software too); our tasks keep the protocol
\t$(SNAKEMAKE) --profile $(SCRATCHFLOW)/profiles/local --dry-run --quiet
\t$(SNAKEMAKE) $(PROFILE) --dry-run --quiet $(ARGS)
\t$(if $(wildcard contract/*.yaml),$(PYTHON) $(SCRATCHFLOW)/scripts/check_task.py $(wildcard contract/*.yaml))
"""

REQUIREMENTS = """\
# Our pipeline's Python packages: scratchflow's (the ranges it supports), then ours. The environment
# we run snakemake from holds them ({submodule}/docs/clusters.md, {cluster}'s notes), every job
# installs them where the cluster's jobs build a venv (SCRATCHFLOW_REQUIREMENTS names this file
# unless set), an image is built from them ({submodule}/scripts/build_image.sh, run here), and
# before anything is submitted they are checked against what the jobs get (make test on the login
# node says so too).
-r {submodule}/requirements.txt
# Ours, a line each: a range, or a version the cluster's wheelhouse has (e.g. scikit-learn>=1.5).
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
# `make setup`'s venv (a laptop's)
.venv/
"""

README = """\
# {name}

Our experiments, on scratchflow pinned at a release as the submodule `{submodule}/` (`git -C
{submodule} describe --tags` names it; {version} when this pipeline was made; its docs:
`{submodule}/docs/lab-pipeline.md`).

```bash
{submodule_update}   # after cloning this repository (and after pulling an upgrade of it)
make run                      # the grid in config/config.yaml on this machine (no env active: builds .venv)
make cluster                  # what {cluster} offers our jobs (on its login node; changes nothing)
make submit                   # the grid on {cluster}, from its login node, in tmux
make status                   # where every run stands (and which runs other code trained)
make retrain RUNS="…"         # train those runs again from zero, and nothing else
make verify RUNS="…"          # or show that what changed changes none of their results (one run, compared)
make test                     # the grid plans, here and on {cluster}; our tasks pass check_task.py
```

Every command runs with the Python environment that is active (on {cluster}, the one
`{submodule}/docs/clusters.md` sets up from our `requirements.txt`), or `PYTHON_ENV=/path/to/env`;
on a laptop with none active, `make setup` builds `.venv` here. Our packages go in `requirements.txt`,
under scratchflow's. Our tasks live beside the Snakefile as Python modules (`task: ourlab.segmentation`
is `ourlab/segmentation.py` and `ourlab/segmentation.schema.yaml`); {profile_sentence}
"""


class PipelineError(RuntimeError):
    """A pipeline that cannot be made as asked: said in one line, nothing left behind."""


@dataclass(frozen=True)
class Cluster:
    """The cluster a pipeline runs on: one of scratchflow's profiles, under the lab's layer, or the
    lab's own profile (`own`: its folder, copied whole into the pipeline with its facts file)."""

    name: str
    own: Path | None = None

    @classmethod
    def named(cls, given: str) -> Cluster:
        """`--cluster`: a cluster scratchflow has a profile for, or the path of a profile's folder whose
        `configfile:` names the cluster's facts file."""
        if given in CLUSTERS:
            return cls(given)
        folder = Path(given).expanduser().resolve()
        if not (folder / PROFILE_FILE).is_file():
            raise PipelineError(
                f"--cluster {given}: one of {', '.join(CLUSTERS)}, or the folder of a profile of your own "
                f"(its {PROFILE_FILE}; docs/lab-pipeline.md, 'A cluster not in the list')"
            )
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", folder.name):
            raise PipelineError(f"--cluster {given}: name the profile's folder in lower case, e.g. ourhpc/")
        found = CONFIGFILE_LINE.search((folder / PROFILE_FILE).read_text())
        if not found:
            raise PipelineError(
                f"--cluster {given}: its {PROFILE_FILE} has no configfile: line naming the cluster's facts "
                "(scratch, longest run time: start from one of scratchflow's config/clusters/*.yaml)"
            )
        if not (folder / found["path"].strip("'\"")).is_file():
            raise PipelineError(f"--cluster {given}: its configfile: {found['path']} is not there")
        return cls(folder.name, folder)

    @property
    def profile_arguments(self) -> str:
        if self.own:
            return f"--profile profiles/{self.name}"
        return f"--profile $(SCRATCHFLOW)/profiles/{self.name} --workflow-profile profiles/{self.name}"

    @property
    def profile_folders(self) -> str:
        return f"profiles/{self.name}" if self.own else f"$(SCRATCHFLOW)/profiles/{self.name} profiles/{self.name}"

    @property
    def profile_sentence(self) -> str:
        if self.own:
            return f"our cluster's profile in\n`profiles/{self.name}/`, its facts in `{FACTS_FOLDER}/{self.name}.yaml`."
        return f"our cluster settings in\n`profiles/{self.name}/`, over scratchflow's."


@dataclass(frozen=True)
class Pin:
    """What the pipeline's submodule is checked out at: a release's tag, or a commit; and what a
    lab should know of it (one line each)."""

    tag: str
    notes: tuple[str, ...] = ()


def make_pipeline(folder: Path, cluster: str, source: str, tag: str | None = None) -> Pin:
    """A lab's repository in `folder`: git, scratchflow from `source` (a repository's URL or path) as
    the submodule at `tag` (default: the release this scratchflow is, or its commit where it has no
    release tags), and the lab's own files, staged for its first commit."""
    target = Cluster.named(cluster)
    if folder.exists() and any(folder.iterdir()):
        raise PipelineError(f"{folder} is not empty: a new pipeline needs a folder of its own")
    existed = folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    checkout = folder / SUBMODULE
    try:
        git(folder, "init", "--quiet")
        # A path as the source is a local repository, which git refuses to clone for a submodule unless told.
        git(folder, "-c", "protocol.file.allow=always", "submodule", "--quiet", "add", source, SUBMODULE)
        pinned = pin(checkout, source, tag)
        lacking = [name for name in named_files(target) if not (checkout / name).exists()]
        if lacking:
            raise PipelineError(
                f"{pinned.tag} lacks {', '.join(lacking)}, which a pipeline's Makefile, Snakefile or README names "
                f"(it predates lab pipelines): give --tag a newer release (its releases: "
                f"{', '.join(releases_in(checkout)) or 'none tagged'})"
            )
    except BaseException:
        shutil.rmtree(folder)  # left as it was, absent or empty, so that a second try starts clean
        if existed:
            folder.mkdir()
        raise
    fields = {
        "name": folder.resolve().name,
        "submodule": SUBMODULE,
        "cluster": target.name,
        "version": pinned.tag,
        "profile_arguments": target.profile_arguments,
        "profile_folders": target.profile_folders,
        "profile_sentence": target.profile_sentence,
        "submodule_update": SUBMODULE_UPDATE_FROM_A_PATH if Path(source).exists() else SUBMODULE_UPDATE,
    }
    files = {
        "Snakefile": HOST_SNAKEFILE,
        "Makefile": MAKEFILE,
        "requirements.txt": REQUIREMENTS,
        ".gitignore": GITIGNORE,
        "README.md": README,
    }
    if not target.own:
        files[f"profiles/{target.name}/{PROFILE_FILE}"] = PROFILE_LAYER
    for name, template in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(template.format(**fields))
    if target.own:
        copy_own_profile(target.name, target.own, folder)
    (folder / "config").mkdir(exist_ok=True)
    shutil.copy(checkout / "config" / "config.yaml", folder / "config" / "config.yaml")  # the release's demo grid
    git(folder, "add", "--all")
    if Path(source).exists():
        # This clone's own `git submodule update` (after pulling an upgrade) fetches from the path too.
        git(checkout, "config", "protocol.file.allow", "always")
        return Pin(pinned.tag, (*pinned.notes, local_source_note(source)))
    return pinned


def copy_own_profile(name: str, own: Path, folder: Path) -> None:
    """The lab's own profile (its folder `own`), copied whole into `profiles/<name>/`, and the facts
    file its `configfile:` names into `config/clusters/<name>.yaml`, the profile then pointing at that
    copy (the same place as in scratchflow's tree, so that the profile reads the same from either)."""
    profile = folder / "profiles" / name
    shutil.copytree(own, profile)
    settings = (profile / PROFILE_FILE).read_text()
    found = CONFIGFILE_LINE.search(settings)
    assert found is not None, "Cluster.named checked that the profile names its facts file"
    facts = (own / found["path"].strip("'\"")).resolve()
    copied = folder / FACTS_FOLDER / f"{name}.yaml"
    copied.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(facts, copied)
    if facts.is_relative_to(own):
        (profile / facts.relative_to(own)).unlink()  # one facts file in the pipeline, not two
    pointed = str(Path("..", "..", FACTS_FOLDER, copied.name))
    (profile / PROFILE_FILE).write_text(settings[: found.start("path")] + pointed + settings[found.end("path") :])


def named_files(cluster: Cluster) -> list[str]:
    """The files of scratchflow's that the pipeline's files name: the pinned release must hold every
    one, but those the Makefile takes only where they are there (`$(wildcard …)`)."""
    text = "".join(
        template.format(
            name="",
            submodule=SUBMODULE,
            cluster=cluster.name,
            version="",
            profile_arguments=cluster.profile_arguments,
            profile_folders=cluster.profile_folders,
            profile_sentence="",
            submodule_update=SUBMODULE_UPDATE,
        )
        for template in (HOST_SNAKEFILE, MAKEFILE, REQUIREMENTS, README)
    )
    text = re.sub(r"\$\(wildcard \$\(SCRATCHFLOW\)/[^)]*\)", "", text)
    named = re.findall(rf"(?:\$\(SCRATCHFLOW\)|\b{SUBMODULE})/([\w.+/-]*\w)", text)
    return list(dict.fromkeys(named))


def pin(checkout: Path, source: str, tag: str | None) -> Pin:
    """Check scratchflow's `checkout` out at `tag` (a release's tag, or any commit); without one, at
    the release this scratchflow is, or at its commit where it has no release tags."""
    notes: tuple[str, ...] = ()
    if tag is None:
        tag = release_of(SCRATCHFLOW_DIR)
        if tag is None:
            tag = git(SCRATCHFLOW_DIR, "rev-parse", "--short=12", "HEAD").strip()
            notes = (
                f"pinned commit {tag}, not a release: this clone of scratchflow has no release tags "
                "(git fetch --tags; or give --tag vX.Y.Z)",
            )
        elif after := int(git(SCRATCHFLOW_DIR, "rev-list", "--count", f"{tag}..HEAD")):
            # Its docs may describe what the release lacks: say which the pipeline runs.
            commit = git(SCRATCHFLOW_DIR, "rev-parse", "--short=12", "HEAD").strip()
            commits = f"{after} commit{'s' * (after > 1)}"
            notes = (
                f"pinned {tag}, the release this clone descends from; the clone is {commits} after it "
                f"(CHANGELOG.md, Unreleased), and its docs may say more than {tag} does: --tag {commit} pins them",
            )
    try:
        git(checkout, "checkout", "--quiet", tag)
    except subprocess.CalledProcessError:
        releases = releases_in(checkout)
        raise PipelineError(
            f"{source} has no tag or commit {tag!r} (its releases: {', '.join(releases) or 'none tagged'}); "
            "give --tag a release's tag or a commit"
        ) from None
    if tag not in releases_in(checkout):  # a branch or HEAD moves: name the commit it pinned
        tag = git(checkout, "rev-parse", "--short=12", "HEAD").strip()
    return Pin(tag, notes)


def releases_in(checkout: Path) -> list[str]:
    return git(checkout, "tag", "--list", TAG_PATTERN, "--sort=-v:refname").split()


def local_source_note(source: str) -> str:
    return (
        f"the submodule's URL is the path {source}, which a colleague's `git submodule update --init` cannot "
        f"reach: point it at a repository they can clone (git submodule set-url {SUBMODULE} URL); on this "
        f"machine, a clone of the pipeline gets it with `{SUBMODULE_UPDATE_FROM_A_PATH}` (git >= 2.38 "
        "refuses a submodule's path unless told)"
    )


def default_source() -> str:
    """Where this scratchflow came from (its origin), or this checkout itself."""
    try:
        return git(SCRATCHFLOW_DIR, "remote", "get-url", "origin").strip()
    except subprocess.CalledProcessError:
        return str(SCRATCHFLOW_DIR)
