"""The conventions of the Snakemake ecosystem, checked by their own tools."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

CHECKS = {
    "snakemake --lint": [BIN / "snakemake", "--lint"],
    "snakefmt": [BIN / "snakefmt", "--check", "Snakefile", "rules"],
    "ruff check": [BIN / "ruff", "check", "."],
    "ruff format": [BIN / "ruff", "format", "--check", "."],
}


@pytest.mark.parametrize("check", CHECKS)
def test_the_workflow_passes(check):
    result = subprocess.run(CHECKS[check], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    if check == "snakemake --lint":
        assert "Congratulations" in result.stdout + result.stderr
