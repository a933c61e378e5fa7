"""The jobs' software checked at start-up on the login node, before anything is submitted: a
wheelhouse cluster's requirements file against a real wheelhouse with real pip, and the Python the
jobs run on a venv or conda cluster, by running it."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import RECIPES, REPO
from scratchflow.software import default_requirements_variable, job_software_problem, pipeline_requirements
from snakemake.profiles import ProfileConfigFileParser

NARVAL = {"image_variable": None, "requirements_variable": "SCRATCHFLOW_REQUIREMENTS"}
EDINBURGH = {"image_variable": None, "requirements_variable": None}
# Their precommands, which each job runs first: Narval's builds a venv from $SCRATCHFLOW_REQUIREMENTS;
# its several-node switch activates one built once on shared storage instead.
NARVAL_PROFILE = REPO / "profiles" / "narval" / "config.v8+.yaml"
SHARED_VENV_SWITCH = RECIPES / "profiles" / "narval-several-nodes.yaml"


def tiny_wheel(wheelhouse: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A pure-Python wheel holding nothing but its metadata: all pip reads to resolve it."""
    dist_info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(wheelhouse / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(
            f"{dist_info}/METADATA",
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            + "".join(f"Requires-Dist: {requirement}\n" for requirement in requires),
        )
        wheel.writestr(f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{dist_info}/RECORD", "")


@pytest.fixture
def wheelhouse(tmp_path) -> Path:
    """alpha 1.0 (which needs beta), beta 2.0 and gamma 1.0, as local wheels."""
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    tiny_wheel(folder, "alpha", "1.0", ("beta>=2",))
    tiny_wheel(folder, "beta", "2.0")
    tiny_wheel(folder, "gamma", "1.0")
    return folder


def handed_over(profile: Path, environ: dict[str, str], monkeypatch) -> str:
    """The profile's precommand as Snakemake hands it to the jobs: read by Snakemake's profile
    parser, which expands the $VARIABLES set where snakemake runs (here: `environ`'s)."""
    monkeypatch.delenv("SCRATCHFLOW_REQUIREMENTS", raising=False)
    if "SCRATCHFLOW_REQUIREMENTS" in environ:
        monkeypatch.setenv("SCRATCHFLOW_REQUIREMENTS", environ["SCRATCHFLOW_REQUIREMENTS"])
    with profile.open() as stream:
        return ProfileConfigFileParser().parse(stream)["precommand"]


def login_node(wheelhouse: Path, requirements: Path | str | None) -> dict[str, str]:
    """The login node's environment as the Alliance sets it: pip finds the wheelhouse through
    PIP_FIND_LINKS (and no other configuration of this machine's)."""
    environ = {**os.environ, "PIP_FIND_LINKS": str(wheelhouse), "PIP_CONFIG_FILE": os.devnull}
    environ.pop("SCRATCHFLOW_REQUIREMENTS", None)
    if requirements is not None:
        environ["SCRATCHFLOW_REQUIREMENTS"] = str(requirements)
    return environ


def check(requirements: Path, environ: dict[str, str], monkeypatch, profile: Path = NARVAL_PROFILE) -> str | None:
    """The jobs' software checked as at start-up on Narval: `requirements`, the pipeline's file."""
    return job_software_problem(NARVAL, handed_over(profile, environ, monkeypatch), requirements, environ)


def test_requirements_the_wheelhouse_holds_with_their_dependencies_pass(tmp_path, wheelhouse, monkeypatch):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# what every job needs\nalpha>=1.0  # and beta, which it needs\ngamma\n")
    environ = login_node(wheelhouse, requirements)
    assert check(requirements, environ, monkeypatch) is None


def test_a_labs_own_package_in_a_folder_of_its_pipeline_is_found_where_its_requirements_name_it(
    tmp_path, wheelhouse, monkeypatch
):
    """docs/lab-pipeline.md: a wheel of the lab's own in the pipeline's wheels/, named in its
    requirements.txt with --find-links (relative to the file), beside the cluster's wheelhouse."""
    (tmp_path / "wheels").mkdir()
    tiny_wheel(tmp_path / "wheels", "ourlab_tools", "1.0")
    lab = tmp_path / "requirements.txt"
    lab.write_text("alpha>=1.0\n--find-links wheels\nourlab-tools==1.0\n")
    assert check(lab, login_node(wheelhouse, lab), monkeypatch) is None
    lab.write_text("alpha>=1.0\ngamma>=3\n--find-links wheels\nourlab-tools==1.0\n")  # gamma: the wheelhouse has 1.0
    lacked = check(lab, login_node(wheelhouse, lab), monkeypatch)
    assert "has no version of gamma>=3 (asked for in requirements.txt: the wheelhouse has 1.0); " in lacked, lacked
    (tmp_path / "wheels" / "ourlab_tools-1.0-py3-none-any.whl").unlink()
    assert "has no version of gamma>=3 (asked for in requirements.txt: the wheelhouse has 1.0), ourlab-tools==1.0 " in (
        check(lab, login_node(wheelhouse, lab), monkeypatch)
    )


def test_the_pipelines_own_requirements_are_what_the_jobs_install_unless_the_variable_names_another(tmp_path):
    """A lab's requirements.txt beside its Snakefile, else scratchflow's; the variable set to it
    where the workflow starts, for the jobs it submits, unless set (to a file of the lab's choice)."""
    assert pipeline_requirements(tmp_path) == REPO / "requirements.txt"
    (tmp_path / "requirements.txt").write_text("-r scratchflow/requirements.txt\n")
    assert pipeline_requirements(tmp_path) == tmp_path / "requirements.txt"
    for unset in ({}, {"SCRATCHFLOW_REQUIREMENTS": ""}):
        default_requirements_variable(NARVAL, pipeline_requirements(tmp_path), unset)
        assert unset == {"SCRATCHFLOW_REQUIREMENTS": str(tmp_path / "requirements.txt")}
    chosen = {"SCRATCHFLOW_REQUIREMENTS": "/somewhere/requirements-gpu.txt"}
    default_requirements_variable(NARVAL, pipeline_requirements(tmp_path), chosen)
    assert chosen == {"SCRATCHFLOW_REQUIREMENTS": "/somewhere/requirements-gpu.txt"}
    unused = {}
    default_requirements_variable(EDINBURGH, pipeline_requirements(tmp_path), unused)
    assert unused == {}


def test_every_requirement_the_wheelhouse_has_no_version_of_is_named_with_its_file_and_the_versions_it_has(
    tmp_path, wheelhouse, monkeypatch
):
    """A lab's requirements.txt includes scratchflow's (here a stand-in) and adds its own packages:
    each requirement the wheelhouse cannot meet is named with the file that asks for it."""
    (tmp_path / "scratchflow").mkdir()
    (tmp_path / "scratchflow" / "requirements.txt").write_text("alpha>=1.0\ngamma>=3.0\n")
    lab = tmp_path / "requirements.txt"
    lab.write_text("-r scratchflow/requirements.txt\nourlab-tools\n")
    environ = login_node(wheelhouse, lab)

    problem = check(lab, environ, monkeypatch)

    assert problem.count("\n") == 0
    assert f"$SCRATCHFLOW_REQUIREMENTS names with pip install --no-index ({lab})" in problem
    lacked = problem[problem.index("has no version of ") : problem.index("; every job's pip install would fail")]
    assert lacked == (
        "has no version of gamma>=3.0 (asked for in scratchflow/requirements.txt: the wheelhouse has 1.0), "
        "ourlab-tools (asked for in requirements.txt: the wheelhouse has none)"
    )
    assert problem.endswith("nothing was submitted")


def test_other_versions_than_scratchflows_tested_ones_are_accepted_within_its_ranges(tmp_path, wheelhouse, monkeypatch):
    """A wheelhouse with another patch version than constraints.txt's: the ranges accept it."""
    tiny_wheel(wheelhouse, "gamma", "1.0.1")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("gamma>=1.0,<2\n")
    assert check(requirements, login_node(wheelhouse, requirements), monkeypatch) is None


def test_a_requirement_the_wheelhouse_has_no_file_of_is_named_where_a_constraint_names_it_too(
    tmp_path, wheelhouse, monkeypatch
):
    """pip's configuration may constrain versions (this machine's pip.conf does torch's): pip then
    says a conflict, listing the projects it has no file of."""
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("alpha==1.0\ntorch>=2.6\n")
    (tmp_path / "constraints.txt").write_text("torch<=2.14.1\n")
    environ = {**login_node(wheelhouse, requirements), "PIP_CONSTRAINT": str(tmp_path / "constraints.txt")}
    problem = check(requirements, environ, monkeypatch)
    assert "has no version of torch>=2.6 (asked for in requirements.txt: no file in the wheelhouse matches it); " in (
        problem
    ), problem


def test_a_dependency_the_wheelhouse_lacks_is_named(tmp_path, wheelhouse, monkeypatch):
    (wheelhouse / "beta-2.0-py3-none-any.whl").unlink()
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("alpha==1.0\n")
    problem = check(requirements, login_node(wheelhouse, requirements), monkeypatch)
    assert "lacks a dependency of what it asks for: beta>=2 (needed by alpha; the wheelhouse has none);" in problem


def test_requirements_that_conflict_are_refused_in_pips_own_words_on_one_line(tmp_path, wheelhouse, monkeypatch):
    tiny_wheel(wheelhouse, "beta", "1.0")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("alpha==1.0\nbeta==1.0\n")  # alpha needs beta>=2
    problem = check(requirements, login_node(wheelhouse, requirements), monkeypatch)
    assert "cannot install it, as the pip of " in problem and "conflicting dependencies" in problem, problem
    assert "\n" not in problem


def test_a_package_a_module_provides_counts_as_installed_and_its_stand_in_says_to_load_the_module(
    tmp_path, wheelhouse, monkeypatch
):
    """The Alliance's way with pyarrow: the wheelhouse holds a stand-in whose install aborts, and the
    `arrow` module puts the real one on the path. Loaded (on the path where the check runs, as in a
    job), the requirement is met; not loaded, the line says to load it."""
    tiny_wheel(wheelhouse, "delta", "5.0+dummy.computecanada", ("delta-noinstall==9999+dummy.computecanada",))
    module = tmp_path / "delta-module" / "site-packages"
    (module / "delta-5.0.dist-info").mkdir(parents=True)
    (module / "delta-5.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: delta\nVersion: 5.0\n")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("alpha>=1.0\ndelta>=4\n")
    environ = login_node(wheelhouse, requirements)
    assert check(requirements, {**environ, "PYTHONPATH": str(module)}, monkeypatch) is None

    problem = check(requirements, environ, monkeypatch)

    assert "\n" not in problem
    assert "and the wheelhouse holds only a stand-in for delta, which the cluster provides as a module: load it " in (
        problem
    ), problem


@pytest.mark.parametrize(
    "value, said",
    [
        ("requirements.txt", "SCRATCHFLOW_REQUIREMENTS=requirements.txt is not an absolute path"),
        ("/no/such/requirements.txt", "SCRATCHFLOW_REQUIREMENTS=/no/such/requirements.txt is not a file"),
    ],
)
def test_a_requirements_variable_relative_or_naming_no_file_is_refused(value, said, tmp_path, wheelhouse, monkeypatch):
    environ = login_node(wheelhouse, value)
    problem = check(REPO / "requirements.txt", environ, monkeypatch)
    assert problem.startswith("scratchflow: config key cluster.requirements_variable: ") and said in problem
    assert "unset it to install your pipeline's requirements.txt" in problem and "\n" not in problem


def test_the_python_the_jobs_run_is_run_once_and_what_it_lacks_of_the_requirements_is_named(tmp_path):
    # This suite's venv holds requirements.txt; a fresh venv holds nothing.
    requirements = REPO / "requirements.txt"
    assert job_software_problem(EDINBURGH, "", requirements, os.environ, sys.executable) is None
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp_path / "env"], check=True)
    bare = str(tmp_path / "env" / "bin" / "python")

    problem = job_software_problem(EDINBURGH, "", requirements, os.environ, bare)

    assert problem.startswith(f"scratchflow: the jobs run {bare}, the Python snakemake runs with, and its ")
    lacked = problem[problem.index("asks for: ") + len("asks for: ") : problem.index(": install it there")]
    assert {"torch>=2.6 (not installed)", "snakemake>=9.27,<10 (not installed)"} <= set(lacked.split(", ")), problem
    assert "\n" not in problem


def test_a_version_outside_the_requirements_range_is_named_with_the_version_installed(tmp_path):
    """A lab's line narrows what scratchflow's allows; the environment has another version."""
    lab = tmp_path / "requirements.txt"
    lab.write_text(f"-r {REPO / 'requirements.txt'}\npytest>=99\n")
    problem = job_software_problem(EDINBURGH, "", lab, os.environ, sys.executable)
    installed = importlib.metadata.version("pytest")
    assert f"lacks what {lab} asks for: pytest>=99 (it has {installed}): install it there" in problem, problem


def test_a_container_cluster_is_checked_where_its_image_is_set_and_not_with_a_requirements_file_too():
    image = {"image_variable": "SCRATCHFLOW_IMAGE", "requirements_variable": None}
    # Not run: scratchflow.containers checks the image where it sets the job steps' container.
    assert job_software_problem(image, "", REPO / "requirements.txt", {}, "/no/such/python") is None
    both = {"image_variable": "SCRATCHFLOW_IMAGE", "requirements_variable": "SCRATCHFLOW_REQUIREMENTS"}
    refused = job_software_problem(both, "", REPO / "requirements.txt", {}, "/no/such/python")
    assert "not both: set one of them to null" in refused


def test_a_precommand_that_installs_nothing_from_the_requirements_file_needs_none(monkeypatch):
    """Narval's several-node switch: every node activates a venv built once on shared storage."""
    environ = {"SCRATCHFLOW_REQUIREMENTS": "/no/such/requirements.txt"}
    shared_venv = handed_over(SHARED_VENV_SWITCH, environ, monkeypatch)
    assert job_software_problem(NARVAL, shared_venv, REPO / "requirements.txt", environ, "/no/such/python") is None
    narval = handed_over(NARVAL_PROFILE, {}, monkeypatch)
    unset = job_software_problem(NARVAL, narval, REPO / "requirements.txt", {}, sys.executable)
    assert "SCRATCHFLOW_REQUIREMENTS is not set" in unset
