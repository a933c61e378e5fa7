"""The conventions of the Snakemake ecosystem, checked by their own tools."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import docs_text
from scratchflow.lab_pipeline import MAKEFILE

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

CHECKS = {
    "snakemake --lint": [BIN / "snakemake", "--lint"],
    "snakefmt": [BIN / "snakefmt", "--check", "Snakefile", "rules"],
    "ruff check": [BIN / "ruff", "check", "."],
    "ruff format": [BIN / "ruff", "format", "--check", "."],
    "mypy": [BIN / "mypy"],
}


@pytest.mark.parametrize("check", CHECKS)
def test_the_workflow_passes(check):
    result = subprocess.run(CHECKS[check], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    if check == "snakemake --lint":
        assert "Congratulations" in result.stdout + result.stderr


def test_every_make_command_the_readme_gives_runs_something():
    """A target the docs tell users to run must have commands (make -n prints them, runs none):
    `make example-image` once did nothing at all, since make applies no pattern rule to a .PHONY
    target."""
    # docs/lab-pipeline.md's are the lab's Makefile's (tests/test_lab_pipeline.py runs them there).
    docs = docs_text(but=("lab-pipeline.md",))
    commands = set(re.findall(r"^make ([a-z-]+)", docs, re.MULTILINE))
    commands |= set(re.findall(r"`make ([a-z-]+)", docs))
    assert {"demo", "test", "example-image", "example-command", "check"} <= commands
    # A lab's pipeline's own targets (make submit, make run: docs/clusters.md's steps are a pipeline's)
    # are planned in a pipeline by tests/test_lab_pipeline.py.
    ours = set(re.findall(r"^([a-z-]+):", (REPO / "Makefile").read_text(), re.MULTILINE))
    commands -= set(re.findall(r"^([a-z]+):", MAKEFILE, re.MULTILINE)) - ours
    for target in sorted(commands):
        variables = ["PROFILE=profiles/narval"] if target == "cluster" else []
        planned = subprocess.run(["make", "-n", target, *variables], cwd=REPO, capture_output=True, text=True)
        assert planned.returncode == 0, planned.stderr
        assert "Nothing to be done" not in planned.stdout + planned.stderr, f"make {target} does nothing"
