"""Where a job's Python comes from: checked at start-up on the login node, before any job is
submitted, the way the cluster gives jobs their software (a wheelhouse, the Python snakemake runs
with; an image is checked by scratchflow.containers); and named when a job lacks a module it
imports (a container profile's image, or the environment of the interpreter that runs the job).
Standard library only, so that a job can say so when nothing else imports."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from scratchflow import SCRATCHFLOW_DIR

BUILD_IMAGE = 'scripts/build_image.sh builds one with requirements.txt (docs/clusters.md, "Containers")'


def missing_module_message(
    error: ModuleNotFoundError, environ: Mapping[str, str] = os.environ, executable: str = sys.executable
) -> str:
    """What a job that could not import `error.name` says instead of an import traceback."""
    image = environ.get("PYXIS_CONTAINER_IMAGE")
    if image:
        return (
            f"the image {image} has no Python module {error.name!r}, which this job imports "
            f"(its python: {executable}); {BUILD_IMAGE}"
        )
    return (
        f"the Python environment of {executable} has no module {error.name!r}, which this job imports; "
        'install requirements.txt into it (docs/clusters.md, "Notes per cluster")'
    )


def describe_failure(error: BaseException) -> str:
    """A job's failure in one line: a missing module with where it is missing, anything else as raised."""
    if isinstance(error, ModuleNotFoundError) and error.name:
        return missing_module_message(error)
    return f"{type(error).__name__}: {error}"


# What every job needs: scratchflow's own pins (a lab's pipeline holds scratchflow as its module).
REQUIREMENTS = SCRATCHFLOW_DIR / "requirements.txt"
NOTES = 'docs/clusters.md, "Notes per cluster"'
PIP_SECONDS = 600  # a wheelhouse on a cold network filesystem (the Alliance's CVMFS) is slow to list
# pip's words for a requirement it found no file for, and what it found instead; and, where a
# constraint (pip.conf's or PIP_CONSTRAINT's) names the project too, those of a conflict's.
NOT_FOUND = re.compile(
    r"Could not find a (?:final )?version that satisfies the requirement (?P<requirement>\S+)"
    r"(?: \(from (?P<parent>[^)]+)\))? \(from versions: (?P<versions>[^)]*)\)"
)
NO_CANDIDATES = re.compile(r"no matching distributions available for your environment:\n((?: {4}\S+\n?)+)")
# The installed distributions of the names given, by the interpreter the jobs run: those it lacks.
LACKING_DISTRIBUTIONS = """
import importlib.metadata, sys
lacking = []
for name in sys.argv[1:]:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        lacking.append(name)
print(" ".join(lacking))
"""


def job_software_problem(
    cluster: Mapping, precommand: str, environ: Mapping[str, str] = os.environ, python: str = sys.executable
) -> str | None:
    """At start-up on the login node, before any job is submitted: what the jobs' software lacks,
    in one line that names the fix, or None. Each cluster gives jobs their software one way:
    - cluster.requirements_variable (narval): each job builds a venv from the requirements file the
      variable names, with `pip install --no-index` from the cluster's wheelhouse in the profile's
      `precommand`; the file is resolved against the wheelhouse here, with the same pip
      configuration (PIP_FIND_LINKS, pip.conf). A precommand that does not name the variable (a
      venv built once on shared storage: narval-several-nodes.yaml) installs nothing from it.
    - cluster.image_variable (dfki, lrz): job steps run in an image, checked where the job steps'
      container is set (scratchflow.containers).
    - neither (edinburgh, oscer): jobs run the interpreter snakemake runs with (a venv or conda env
      on shared storage); it is run once here to find scratchflow's requirements in it."""
    variable = cluster.get("requirements_variable")
    if variable and cluster.get("image_variable"):
        return (
            "scratchflow: config key cluster.requirements_variable: jobs either build a venv from a requirements "
            "file or run in an image (cluster.image_variable), not both: set one of them to null"
        )
    if cluster.get("image_variable"):
        return None
    if variable:
        return wheelhouse_problem(variable, environ, python) if installs_from(precommand, variable, environ) else None
    return environment_problem(python, environ)


def installs_from(precommand: str, variable: str, environ: Mapping[str, str]) -> bool:
    """Whether the jobs' precommand installs the file `variable` names. Snakemake hands the profile's
    precommand over with its $VARIABLES expanded where they are set: the variable, or its value (set
    but empty, it leaves no trace, and every job's pip would be given an empty argument)."""
    value = environ.get(variable, "")
    if variable in environ and not value:
        return True
    named = re.search(rf"\$(?:{variable}\b|\{{{variable}\}})", precommand)
    return bool(named or (value and value in precommand))


def wheelhouse_problem(variable: str, environ: Mapping[str, str], python: str) -> str | None:
    """The requirements file `variable` names, set, there, and installable with `pip install
    --no-index` as every job installs it: None, or which pins the wheelhouse lacks."""
    where = (
        f"scratchflow: config key cluster.requirements_variable: each job installs the requirements file "
        f"${variable} names with pip install --no-index"
    )
    fix = f"export {variable}=/path/to/scratchflow/requirements.txt ({NOTES}); nothing was submitted"
    value = environ.get(variable, "")
    if not value:
        return f"{where}, but {variable} is not set: {fix}"
    requirements = Path(value)
    if not requirements.is_absolute():
        return (
            f"{where}, which every job reads from its own directory: {variable}={value} is not an absolute path: {fix}"
        )
    if not requirements.is_file():
        return f"{where}: {variable}={value} is not a file: {fix}"
    checked = pip_dry_run(python, ["--requirement", str(requirements)], environ)
    if checked.returncode == 0:
        return None
    stated = f"{where} ({value}), and the wheelhouse"
    if "No module named pip" in checked.stdout:
        return (
            f"{where}; it is checked here with the pip of {python}, which has none: run snakemake from a venv "
            f"({NOTES}); nothing was submitted"
        )
    lacked = lacking_pins(requirements, environ, python)
    if lacked:
        return (
            f"{stated} lacks what it pins: {', '.join(lacked)}; every job's pip install would fail: pin a version "
            f"the wheelhouse has, or take the line out (checked with the pip of {python}, as the jobs install); "
            "nothing was submitted"
        )
    dependencies = [f"{requirement} ({detail})" for requirement, detail in not_found(checked.stdout).values()]
    if dependencies:
        return (
            f"{stated} lacks a dependency of its pins: {', '.join(dependencies)}; every job's pip install would "
            f"fail: pin versions whose dependencies the wheelhouse has (checked with the pip of {python}); "
            "nothing was submitted"
        )
    errors = [line.removeprefix("ERROR: ") for line in checked.stdout.splitlines() if line.startswith("ERROR: ")]
    said = "; ".join(errors) or " ".join(checked.stdout.split())[-1000:]  # one line, whatever pip printed
    return f"{stated} cannot install it, as the pip of {python} says: {said}; nothing was submitted"


def lacking_pins(requirements: Path, environ: Mapping[str, str], python: str) -> list[str]:
    """The file's own pins (and those of the files it includes with -r) that the wheelhouse has no
    file for, each with the versions it has, in the file's order. pip may name one at a time: those
    found are left out of the next try, one pip per pin lacking at most, and one more."""
    pins = {distribution_name(pin): pin for pin in read_requirements(requirements)}
    remaining, lacked = dict(pins), {}
    while remaining:
        tried = pip_dry_run(python, ["--no-deps", *remaining.values()], environ)
        # Alone, pins conflict only with a constraint of pip's configuration, which pip tells as a
        # conflict, listing the projects with no file that matches.
        unmatched = {name: "no file in the wheelhouse matches it" for name in without_match(tried.stdout)}
        found = {name: detail for name, (_, detail) in not_found(tried.stdout).items()} | unmatched
        found = {name: detail for name, detail in found.items() if name in remaining}
        if tried.returncode == 0 or not found:
            break
        for name, detail in found.items():
            lacked[name] = f"{remaining.pop(name)} ({detail})"
    return [lacked[name] for name in pins if name in lacked]


def pip_dry_run(python: str, requirements: list[str], environ: Mapping[str, str]) -> subprocess.CompletedProcess:
    """pip resolving `requirements` as a job's `pip install --no-index` does, installing nothing;
    what it says, errors and the explanation of a conflict, in `stdout`."""
    command = [python, "-m", "pip", "install", "--dry-run", "--no-index", "--ignore-installed"]
    command += ["--disable-pip-version-check", "--no-input", "--no-color", *requirements]
    try:
        return subprocess.run(
            command, env=dict(environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=PIP_SECONDS
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return subprocess.CompletedProcess(command, 1, f"ERROR: {error}")


def not_found(pip_output: str) -> dict[str, tuple[str, str]]:
    """The requirements pip found no file for: name (normalized) -> the requirement as pip read it,
    and the pin that needs it (for a dependency) with the versions the wheelhouse has."""
    found = {}
    for match in NOT_FOUND.finditer(pip_output):
        needed_by = f"needed by {match['parent']}; " if match["parent"] else ""
        detail = f"{needed_by}the wheelhouse has {match['versions'] or 'none'}"
        found[distribution_name(match["requirement"])] = (match["requirement"], detail)
    return found


def without_match(pip_output: str) -> list[str]:
    """The projects a conflict's explanation lists as having no file that matches (normalized)."""
    return [distribution_name(name) for listed in NO_CANDIDATES.findall(pip_output) for name in listed.split()]


def environment_problem(python: str, environ: Mapping[str, str]) -> str | None:
    """The interpreter the jobs run holds scratchflow's requirements (REQUIREMENTS): None, or which
    it lacks. Installed distributions are looked up, not imported: one short process."""
    names = [distribution_name(pin) for pin in read_requirements(REQUIREMENTS)]
    where = f"scratchflow: the jobs run {python}, the Python snakemake runs with"
    try:
        looked = subprocess.run(
            [python, "-c", LACKING_DISTRIBUTIONS, *names],
            env=dict(environ),
            capture_output=True,
            text=True,
            timeout=PIP_SECONDS,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{where}, which could not be run to find its packages: {error}"
    if looked.returncode != 0:
        return f"{where}, which could not be run to find its packages: {looked.stderr.strip()[-500:]}"
    lacked = looked.stdout.split()
    if not lacked:
        return None
    return (
        f"{where}, and its environment lacks {', '.join(lacked)} of scratchflow's requirements.txt: install it there "
        f"(pip install -r {REQUIREMENTS}, or your cluster's way: {NOTES}); nothing was submitted"
    )


def read_requirements(path: Path) -> list[str]:
    """The requirement lines of a pip requirements file and of those it includes (-r), comments and
    other options left out."""
    pins = []
    for line in path.read_text().splitlines():
        line = re.sub(r"(^|\s)#.*", "", line).strip()
        included = re.fullmatch(r"(?:-r|--requirement)(?:\s+|=)(\S+)", line)
        if included:
            pins += read_requirements(path.parent / included[1])
        elif line and not line.startswith("-"):
            pins.append(line)
    return pins


def distribution_name(requirement: str) -> str:
    """A requirement's distribution name, normalized as pip compares names (PEP 503)."""
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    return re.sub(r"[-_.]+", "-", name[0] if name else requirement).lower()
