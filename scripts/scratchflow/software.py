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
import tempfile
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from scratchflow import SCRATCHFLOW_DIR

BUILD_IMAGE = (
    'scripts/build_image.sh builds one with your pipeline\'s requirements.txt (docs/clusters.md, "Containers")'
)


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
        'install your pipeline\'s requirements.txt into it (docs/clusters.md, "Notes per cluster")'
    )


def describe_failure(error: BaseException) -> str:
    """A job's failure in one line: a missing module with where it is missing, anything else as raised."""
    if isinstance(error, ModuleNotFoundError) and error.name:
        return missing_module_message(error)
    return f"{type(error).__name__}: {error}"


# The file of what every job needs: the pipeline's own (a lab's requirements.txt beside its Snakefile,
# which includes scratchflow's and adds the lab's packages), else scratchflow's.
REQUIREMENTS_FILE = "requirements.txt"
NOTES = 'docs/clusters.md, "Notes per cluster"'
PIP_SECONDS = 600  # a wheelhouse on a cold network filesystem (the Alliance's CVMFS) is slow to list
# pip's words for a requirement it found no file for, and what it found instead; and, where a
# constraint (pip.conf's or PIP_CONSTRAINT's) names the project too, those of a conflict's.
NOT_FOUND = re.compile(
    r"Could not find a (?:final )?version that satisfies the requirement (?P<requirement>\S+)"
    r"(?: \(from (?P<parent>[^)]+)\))? \(from versions: (?P<versions>[^)]*)\)"
)
NO_CANDIDATES = re.compile(r"no matching distributions available for your environment:\n((?: {4}\S+\n?)+)")
# The Alliance's stand-in wheel for a package its modules provide (pyarrow-<v>+dummy.computecanada)
# needs the project <package>-noinstall, whose install aborts: the package's module was not loaded.
MODULE_STAND_IN = re.compile(r"\b([A-Za-z0-9][A-Za-z0-9._]*(?:-[A-Za-z0-9._]+)*?)-noinstall\b")
# What the interpreter the jobs run lacks of the requirements given as arguments: a line for each
# requirement it has no distribution of, or has one outside the requirement's versions. Run by that
# interpreter, which may hold nothing but the standard library: versions are compared where it has
# `packaging` (every environment with snakemake has it), else only the names.
LACKING_DISTRIBUTIONS = """
import importlib.metadata, re, sys
try:
    from packaging.requirements import Requirement
except ImportError:
    try:
        from pip._vendor.packaging.requirements import Requirement
    except ImportError:
        Requirement = None
for line in sys.argv[1:]:
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)[0]
    marker = Requirement(line).marker if Requirement is not None else None
    if marker is not None and not marker.evaluate():
        continue
    try:
        version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        print(f"{line} (not installed)")
        continue
    if Requirement is not None and not Requirement(line).specifier.contains(version, prereleases=True):
        print(f"{line} (it has {version})")
"""


def pipeline_requirements(workflow_dir: Path) -> Path:
    """The requirements file of the pipeline whose Snakefile is in `workflow_dir`: a lab's own
    (docs/lab-pipeline.md), or scratchflow's where the pipeline is scratchflow's own folder."""
    own = workflow_dir / REQUIREMENTS_FILE
    return own if own.is_file() else SCRATCHFLOW_DIR / REQUIREMENTS_FILE


def default_requirements_variable(cluster: Mapping, requirements: Path, environ: MutableMapping[str, str]) -> None:
    """Where the jobs install a requirements file (cluster.requirements_variable), the pipeline's
    `requirements` unless the variable names another: set here, where the workflow starts, for
    every job it submits (the profile's precommand reads it on submission, and sbatch passes the
    environment on)."""
    variable = cluster.get("requirements_variable")
    if variable and not environ.get(variable):
        environ[variable] = str(requirements.resolve())


def job_software_problem(
    cluster: Mapping,
    precommand: str,
    requirements: Path,
    environ: Mapping[str, str] = os.environ,
    python: str = sys.executable,
) -> str | None:
    """Before any job is submitted (a dry run's too), on the login node: what the jobs' software
    lacks, in one line that names the fix, or None. `requirements`: the pipeline's requirements
    file (`pipeline_requirements`). Each cluster gives jobs their software one way:
    - cluster.requirements_variable (narval): each job builds a fresh venv and installs the file the
      variable names (the pipeline's by default) with `pip install --no-index` from the cluster's
      wheelhouse, in the profile's `precommand`, after loading the cluster's modules: the file is
      resolved here the same way, in a fresh venv of the Python snakemake runs with (the same
      modules' packages visible, the same PIP_FIND_LINKS or pip.conf). A precommand that does not
      name the variable (a venv built once on shared storage: narval-several-nodes.yaml) installs
      nothing from it.
    - cluster.image_variable (dfki, lrz): job steps run in an image, checked where the job steps'
      container is set (scratchflow.containers).
    - neither (edinburgh, oscer): jobs run the interpreter snakemake runs with (a venv or conda env
      on shared storage); it is run once here to find the requirements in it, versions included."""
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
    return environment_problem(python, requirements, environ)


def installs_from(precommand: str, variable: str, environ: Mapping[str, str]) -> bool:
    """Whether the jobs' precommand installs the file `variable` names. Snakemake hands the profile's
    precommand over with its $VARIABLES expanded where they were set when it started: the
    variable, or its value (set but empty, it leaves no trace, and every job's pip would be given an
    empty argument)."""
    value = environ.get(variable, "")
    if variable in environ and not value:
        return True
    named = re.search(rf"\$(?:{variable}\b|\{{{variable}\}})", precommand)
    return bool(named or (value and value in precommand))


def wheelhouse_problem(variable: str, environ: Mapping[str, str], python: str) -> str | None:
    """The requirements file `variable` names, there, and installable with `pip install --no-index`
    into a fresh venv as every job installs it: None, or what the wheelhouse lacks."""
    where = (
        f"scratchflow: config key cluster.requirements_variable: each job installs the requirements file "
        f"${variable} names with pip install --no-index"
    )
    fix = f"unset it to install your pipeline's requirements.txt, or name another file ({NOTES}); nothing was submitted"
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
    with tempfile.TemporaryDirectory(prefix="scratchflow-jobs-venv-") as fresh:
        checked = pip_dry_run(python, fresh, ["--requirement", str(requirements)], environ)
        if checked.returncode == 0:
            return None
        stated = f"{where} ({value}), and the wheelhouse"
        checked_with = f"checked in a fresh venv of {python}, as the jobs install"
        if "No module named pip" in checked.stdout:
            return (
                f"{where}; it is checked here with the pip of {python}, which has none: run snakemake from a venv "
                f"({NOTES}); nothing was submitted"
            )
        if "no such option: --python" in checked.stdout:
            return (
                f"{where}; it is checked here with the pip of {python}, which is older than 22.3: upgrade it "
                "(pip install --no-index --upgrade pip); nothing was submitted"
            )
        lacked = lacking_requirements(requirements, fresh, environ, python)
        if lacked:
            return (
                f"{stated} has no version of {', '.join(lacked)}; every job's pip install would fail: allow a "
                "version the wheelhouse has in the file named (avail_wheels NAME --all-versions lists them), or ask "
                f"your cluster's support for the wheel ({checked_with}); nothing was submitted"
            )
        modules = module_stand_ins(checked.stdout)
        if modules:
            return (
                f"{stated} holds only a stand-in for {', '.join(modules)}, which the cluster provides as a module: "
                "load it before the venv is made, in your login shell and in the profile's precommand "
                f"(module load …; {NOTES}); nothing was submitted"
            )
        dependencies = [f"{requirement} ({detail})" for requirement, detail in not_found(checked.stdout).values()]
        if dependencies:
            return (
                f"{stated} lacks a dependency of what it asks for: {', '.join(dependencies)}; every job's pip install "
                f"would fail: ask for versions whose dependencies the wheelhouse has ({checked_with}); "
                "nothing was submitted"
            )
        errors = [line.removeprefix("ERROR: ") for line in checked.stdout.splitlines() if line.startswith("ERROR: ")]
        said = "; ".join(errors) or " ".join(checked.stdout.split())[-1000:]  # one line, whatever pip printed
        return f"{stated} cannot install it, as the pip of {python} says: {said}; nothing was submitted"


def lacking_requirements(requirements: Path, fresh: str, environ: Mapping[str, str], python: str) -> list[str]:
    """The file's own requirements (and those of the files it includes with -r) that the wheelhouse
    has no matching file for, each with the file that asks for it and the versions the wheelhouse
    has, in the file's order. pip may name one at a time: those found are left out of the next try,
    one pip per requirement lacking at most, and one more."""
    asked = requirement_sources(requirements)
    links = [f"--find-links={folder}" for folder in find_links(requirements)]  # the files' own, as pip reads them
    remaining, lacked = {name: line for name, (line, _) in asked.items()}, {}
    while remaining:
        tried = pip_dry_run(python, fresh, [*links, "--no-deps", *remaining.values()], environ)
        # Alone, requirements conflict only with a constraint of pip's configuration, which pip tells
        # as a conflict, listing the projects with no file that matches.
        unmatched = {name: "no file in the wheelhouse matches it" for name in without_match(tried.stdout)}
        found = {name: detail for name, (_, detail) in not_found(tried.stdout).items()} | unmatched
        found = {name: detail for name, detail in found.items() if name in remaining}
        if tried.returncode == 0 or not found:
            break
        for name, detail in found.items():
            lacked[name] = f"{remaining.pop(name)} (asked for in {shown(asked[name][1], requirements)}: {detail})"
    return [lacked[name] for name in asked if name in lacked]


def shown(path: Path, requirements: Path) -> str:
    """A requirements file as its reader knows it: by its path from the top file's folder."""
    return os.path.relpath(path, requirements.parent) if path != requirements else path.name


def pip_dry_run(
    python: str, fresh: str, requirements: list[str], environ: Mapping[str, str]
) -> subprocess.CompletedProcess:
    """pip resolving `requirements` as a job's `pip install --no-index` does in the fresh venv it
    makes (`fresh`: an empty folder, made a venv of `python`'s base interpreter once), installing
    nothing; what it says, errors and the explanation of a conflict, in `stdout`. Packages the
    cluster's modules put on the path (PYTHONPATH) count as installed there, as in a job."""
    venv_python = Path(fresh, "bin", "python")
    try:
        if not venv_python.exists():
            subprocess.run(
                [python, "-m", "venv", "--without-pip", fresh],
                env=dict(environ),
                check=True,
                capture_output=True,
                timeout=PIP_SECONDS,
            )
        command = [python, "-m", "pip", "--python", str(venv_python), "install", "--dry-run", "--no-index"]
        command += ["--disable-pip-version-check", "--no-input", "--no-color", *requirements]
        return subprocess.run(
            command, env=dict(environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=PIP_SECONDS
        )
    except subprocess.CalledProcessError as error:
        return subprocess.CompletedProcess(error.cmd, 1, f"ERROR: {error.stderr.decode(errors='replace').strip()}")
    except (OSError, subprocess.TimeoutExpired) as error:
        return subprocess.CompletedProcess([python], 1, f"ERROR: {error}")


def not_found(pip_output: str) -> dict[str, tuple[str, str]]:
    """The requirements pip found no file for: name (normalized) -> the requirement as pip read it,
    and the requirement that needs it (for a dependency) with the versions the wheelhouse has."""
    found = {}
    for match in NOT_FOUND.finditer(pip_output):
        needed_by = f"needed by {match['parent']}; " if match["parent"] else ""
        detail = f"{needed_by}the wheelhouse has {match['versions'] or 'none'}"
        found[distribution_name(match["requirement"])] = (match["requirement"], detail)
    return found


def module_stand_ins(pip_output: str) -> list[str]:
    """The packages whose stand-in pip reached: a module provides them, and it was not loaded."""
    return list(dict.fromkeys(distribution_name(name) for name in MODULE_STAND_IN.findall(pip_output)))


def without_match(pip_output: str) -> list[str]:
    """The projects a conflict's explanation lists as having no file that matches (normalized)."""
    return [distribution_name(name) for listed in NO_CANDIDATES.findall(pip_output) for name in listed.split()]


def environment_problem(python: str, requirements: Path, environ: Mapping[str, str]) -> str | None:
    """The interpreter the jobs run, `python`, holds what `requirements` asks for (with the files
    it includes), versions included: None, or what it lacks, in one line. Installed distributions
    are looked up, not imported: one short process."""
    lines = [line for line, _ in requirement_sources(requirements).values()]
    where = f"scratchflow: the jobs run {python}, the Python snakemake runs with"
    try:
        looked = subprocess.run(
            [python, "-c", LACKING_DISTRIBUTIONS, *lines],
            env=dict(environ),
            capture_output=True,
            text=True,
            timeout=PIP_SECONDS,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{where}, which could not be run to find its packages: {error}"
    if looked.returncode != 0:
        return f"{where}, which could not be run to find its packages: {looked.stderr.strip()[-500:]}"
    lacked = looked.stdout.splitlines()
    if not lacked:
        return None
    return (
        f"{where}, and its environment lacks what {requirements} asks for: {', '.join(lacked)}: install it there "
        f"(pip install -r {requirements}, or your cluster's way: {NOTES}); nothing was submitted"
    )


def requirement_sources(path: Path) -> dict[str, tuple[str, Path]]:
    """The requirement lines of a pip requirements file and of those it includes (-r), by
    distribution name (the first line naming one wins, as pip would report a second), each with
    the file it is in."""
    found: dict[str, tuple[str, Path]] = {}
    for line, source in _requirement_lines(path):
        found.setdefault(distribution_name(line), (line, source))
    return found


def read_requirements(path: Path, include: bool = True) -> list[str]:
    """The requirement lines of a pip requirements file and, with `include`, of those it includes
    (-r), comments and other options left out."""
    return [line for line, source in _requirement_lines(path) if include or source == path]


def find_links(path: Path) -> list[Path]:
    """The folders a requirements file (and those it includes) names with --find-links, each
    relative to its file, as pip reads them."""
    folders = []
    for line in path.read_text().splitlines():
        line = re.sub(r"(^|\s)#.*", "", line).strip()
        included = re.fullmatch(r"(?:-r|--requirement)(?:\s+|=)(\S+)", line)
        link = re.fullmatch(r"(?:-f|--find-links)(?:\s+|=)(\S+)", line)
        if included:
            folders += find_links(path.parent / included[1])
        elif link:
            folders.append(path.parent / link[1] if "://" not in link[1] else Path(link[1]))
    return folders


def _requirement_lines(path: Path) -> list[tuple[str, Path]]:
    lines = []
    for line in path.read_text().splitlines():
        line = re.sub(r"(^|\s)#.*", "", line).strip()
        included = re.fullmatch(r"(?:-r|--requirement)(?:\s+|=)(\S+)", line)
        if included:
            lines += _requirement_lines(path.parent / included[1])
        elif line and not line.startswith("-"):
            lines.append((line, path))
    return lines


def distribution_name(requirement: str) -> str:
    """A requirement's distribution name, normalized as pip compares names (PEP 503)."""
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    return re.sub(r"[-_.]+", "-", name[0] if name else requirement).lower()
