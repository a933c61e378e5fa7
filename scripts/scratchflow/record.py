"""What a run records about itself so that it can be reproduced (how long its phases took:
scratchflow.timing); what trained each run of a grid, where the runs differ in it, and the line that
trains the odd ones again. Typed records (a piece's spec, its entry in pieces.json, record.json) go
to and from JSON through one pair of functions: `plain` and `typed`."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import importlib.metadata
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
import time
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, TextIO, TypeVar

from scratchflow import SCRATCHFLOW_DIR, __version__
from scratchflow.files import file_sha256
from scratchflow.tasks import is_lab_task

Record = TypeVar("Record")


def plain(value: Any) -> Any:
    """`value` as JSON holds it: a dataclass as a dict of all its fields (None as null), a Path as
    its string, containers item by item."""
    if is_dataclass(value) and not isinstance(value, type):
        return {field.name: plain(getattr(value, field.name)) for field in fields(value)}
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value


def typed(kind: type[Record], data: Any) -> Record:
    """The dataclass `kind` from what `plain` made of one (its fields' annotations say what each
    becomes: a Path, a nested dataclass, a dict of Paths). Keys it has no field for are left out: a
    record written by another release still reads."""
    return _as(kind, data)


def _as(kind: Any, data: Any) -> Any:
    if data is None:
        return None
    origin, arguments = typing.get_origin(kind), typing.get_args(kind)
    if origin in (types.UnionType, typing.Union):
        return _as(next(argument for argument in arguments if argument is not type(None)), data)
    if origin is dict:
        return {key: _as(arguments[1], item) for key, item in data.items()}
    if origin is list:
        return [_as(arguments[0], item) for item in data]
    if kind is Path:
        return Path(data)
    if isinstance(kind, type) and is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        return kind(**{name: _as(hints[name], item) for name, item in data.items() if name in hints})
    return data


def git_state(directory: Path) -> dict[str, Any]:
    """The commit the workflow ran from, and whether its tracked files had uncommitted changes."""

    def git(*args: str) -> str | None:
        try:
            result = subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return result.stdout.strip() if result.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def package_versions() -> dict[str, str]:
    """Every distribution installed where the job runs, by its normalized name (PEP 503), with its
    version: what the job's environment was, whichever versions a wheelhouse, module or image gave
    it (a module's packages, on the path, included). The first of a name on the path wins, as for
    imports. Read from the `<name>-<version>.dist-info` folders' names where it can be (reading
    every distribution's metadata took 0.5 s a job), else from the metadata."""
    versions: dict[str, str] = {}
    for distribution in importlib.metadata.distributions():
        folder = getattr(distribution, "_path", None)  # importlib's PathDistribution keeps its folder there
        if isinstance(folder, Path) and folder.suffix == ".dist-info" and folder.stem.count("-") == 1:
            name, version = folder.stem.split("-")
        else:
            name, version = distribution.metadata["Name"] or "", distribution.version
        if name:
            versions.setdefault(re.sub(r"[-_.]+", "-", name).lower(), version)
    return dict(sorted(versions.items()))


def environment_record(workflow_dir: Path) -> dict[str, Any]:
    """Where and with what a job ran: scratchflow's release and commit (`git`), and the commit of the
    pipeline it ran in (the working directory's repository: a lab's own, or scratchflow's)."""
    return {
        "scratchflow_version": __version__,
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "os": platform.freedesktop_os_release().get("PRETTY_NAME") if Path("/etc/os-release").is_file() else None,
        # The image a container profile's job step runs in (pyxis reads it from the job's environment).
        "container_image": os.environ.get("PYXIS_CONTAINER_IMAGE"),
        "packages": package_versions(),
        "git": git_state(workflow_dir),
        "pipeline_git": git_state(Path.cwd()),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def code_record(task: str, module_file: Path, params: dict[str, Any]) -> dict[str, Any]:
    """The code that trains a run beyond scratchflow's own (whose release and commit the record's
    `environment` names, and with them the built-in tasks): a lab's task module and its schema
    fragment, or a `command` task's program file. Each file's sha256 by its name in `folder` (the
    folder the lab's tasks are found in, or the working directory the program runs in), and one
    sha256 of them all; a built-in task, or a program on PATH, has no files and no sha256."""
    if is_lab_task(task):
        folder = module_root(task, module_file)
        files = [module_file, module_file.with_suffix(".schema.yaml")]
    elif task == "command":
        folder, files = Path.cwd(), [program] if (program := program_file(params["command"])) else []
    else:  # a built-in task: no code of its own
        return {"task": task, "folder": None, "files": {}, "sha256": None}
    hashes = {file_name(path, folder): file_sha256(path) for path in files if path.is_file()}
    return {
        "task": task,
        "folder": str(folder) if hashes else None,
        "files": hashes,
        "sha256": combined_sha256(hashes) if hashes else None,
    }


def module_root(task: str, module_file: Path) -> Path:
    """The folder a lab's task module is imported from: `ourlab.mlp` at <root>/ourlab/mlp.py (or
    <root>/ourlab/mlp/__init__.py)."""
    depth = len(task.split(".")) - (module_file.name != "__init__.py")
    return module_file.resolve().parents[depth]


def program_file(argv: list[str]) -> Path | None:
    """The file of a `command` task's program (the script a known interpreter runs, or the program
    itself), as `training.program_git` finds it; None for a program found on PATH."""
    # Imported here: the command task imports this module (git_state).
    from scratchflow.tasks.command import interpreted_script

    program = Path(interpreted_script(argv) or argv[0]).expanduser()
    return program if program.is_file() else None


def file_name(path: Path, folder: Path) -> str:
    """A file's name in `folder`, or its absolute path where it lies outside."""
    resolved = path.resolve()
    return str(resolved.relative_to(folder.resolve())) if resolved.is_relative_to(folder.resolve()) else str(resolved)


def combined_sha256(hashes: dict[str, str]) -> str:
    """One sha256 of named files' sha256 (as `sha256sum` lists them, by name)."""
    listed = "".join(f"{sha256}  {name}\n" for name, sha256 in sorted(hashes.items()))
    return hashlib.sha256(listed.encode()).hexdigest()


# What trained a run besides its task's code, as the runs of one comparison are compared: the record's
# name for each (in `environment`) and the name it is told by.
TRAINED_BY = {
    "scratchflow_version": "scratchflow",
    "python": "Python",
    "torch": "torch",
    "transformers": "transformers",
}
SHORT = 8  # a sha256 as it is shown: its first characters
MOST_RUNS_NAMED = 10  # in a sentence; the line that retrains them names them all


def trained_by(record: dict[str, Any]) -> dict[str, str] | None:
    """What trained a run, as text: TRAINED_BY's, and `code`, the sha256 of its task's code (or
    "scratchflow's" for a built-in task); None for a record that names no environment."""
    environment = record.get("environment")
    if not environment:
        return None
    packages = environment.get("packages") or {}
    facts = {}
    for name in TRAINED_BY:
        if name in ("scratchflow_version", "python"):
            facts[name] = str(environment.get(name) or "not recorded")
        else:
            facts[name] = str(packages.get(name) or "not installed")
    code = record.get("code")
    facts["code"] = "not recorded" if code is None else (code["sha256"] or "scratchflow's")
    return facts


@dataclass(frozen=True)
class Difference:
    """A way the runs of one comparison differ in what trained them, told in one line, and the runs
    to train again so that they no longer do."""

    line: str
    runs: list[str]


def differences(records: dict[str, dict[str, Any]], folder: Path) -> list[Difference]:
    """How the runs (run id -> record, in grid order) differ in what trained them: each code file a
    run records against that file as it is now (in `folder`, the directory the grid runs in, or else
    where the run found it; each file hashed once), then scratchflow's release, Python, torch and
    transformers among the runs, where the runs that differ from the newest run are the odd ones."""
    facts = {run_id: run_facts for run_id, record in records.items() if (run_facts := trained_by(record))}
    found = _code_differences(records, folder, len(facts))
    unknown = [
        run_id for run_id, fact in facts.items() if fact["code"] == "not recorded" and _own_code(records[run_id])
    ]
    if unknown:
        found.append(
            Difference(
                f"{_count(len(unknown), len(facts))} record no sha256 of their task's code (trained before "
                f"scratchflow recorded it; whether it has changed since is not known): {_named(unknown)}",
                [],
            )
        )
    newest = None
    for name, shown in TRAINED_BY.items():
        values = {run_id: fact[name] for run_id, fact in facts.items()}
        if len(set(values.values())) < 2:
            continue
        newest = newest or max(facts, key=lambda run_id: _finished_at(records[run_id]))
        odd = [run_id for run_id, value in values.items() if value != values[newest]]
        others = ", ".join(dict.fromkeys(values[run_id] for run_id in odd))
        line = f"{shown} {others} trained {_count(len(odd), len(facts))}, {values[newest]} the newest: {_named(odd)}"
        found.append(Difference(line, odd))
    return found


def _own_code(record: dict[str, Any]) -> bool:
    """Whether the run's task is the lab's own code: a lab's task module, or a `command` task's program."""
    task = record.get("task", "")
    return is_lab_task(task) or task == "command"


def _code_differences(records: dict[str, dict[str, Any]], folder: Path, compared: int) -> list[Difference]:
    hashed: dict[Path, str | None] = {}  # each file as it is now, hashed once
    now: dict[str, str | None] = {}  # a file's name -> its sha256 now
    older: dict[str, dict[str, list[str]]] = {}  # a file's name -> a sha256 runs recorded -> those runs
    for run_id, record in records.items():
        code = record.get("code") or {}
        for name, recorded in code.get("files", {}).items():
            path = folder / name
            if not path.is_file() and code.get("folder"):
                path = Path(code["folder"]) / name
            if path not in hashed:
                hashed[path] = file_sha256(path) if path.is_file() else None
            now.setdefault(name, hashed[path])
            if hashed[path] != recorded:
                older.setdefault(name, {}).setdefault(recorded, []).append(run_id)
    found = []
    for name, by_sha256 in older.items():
        runs = [run_id for run_id in records if any(run_id in listed for listed in by_sha256.values())]
        was = ", ".join(sha256[:SHORT] for sha256 in by_sha256)
        current = now[name]
        how = (
            f"as it was before (sha256 {was} ≠ now {current[:SHORT]})" if current else f"(sha256 {was}), not there now"
        )
        found.append(Difference(f"{name} {how} trained {_count(len(runs), compared)}: {_named(runs)}", runs))
    return found


def _finished_at(record: dict[str, Any]) -> float:
    stamp = (record.get("environment") or {}).get("finished_at")
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S%z").timestamp() if stamp else 0.0


def _count(runs: int, of: int) -> str:
    return f"{runs} of {of} runs"


def _named(run_ids: list[str]) -> str:
    shown = ", ".join(run_ids[:MOST_RUNS_NAMED])
    return shown + (f" and {len(run_ids) - MOST_RUNS_NAMED} more" if len(run_ids) > MOST_RUNS_NAMED else "")


def to_retrain(found: list[Difference], run_ids: list[str]) -> list[str]:
    """The runs any difference names, in the grid's order (`run_ids`)."""
    named = {run_id for difference in found for run_id in difference.runs}
    return [run_id for run_id in run_ids if run_id in named]


def difference_lines(records: dict[str, dict[str, Any]], workdir: Path, halving: bool) -> list[str]:
    """Where the runs of the grid in `workdir` (their records, in grid order) differ in what trained
    them, with the line that trains the odd ones again from zero (no such line for a halving
    search's runs); none where they do not differ: what the status and the report's page say."""
    found = differences(records, workdir)
    if not found:
        return []
    lines = ["trained by other code or packages:", *(f"  {difference.line}" for difference in found)]
    redo = to_retrain(found, list(records))
    if redo and halving:
        lines.append(
            "  a halving search's runs are not trained again one by one: run the search again in a new directory"
        )
    elif redo:
        these = "it" if len(redo) == 1 else f"these {len(redo)} runs"
        lines.append(f"  to train {these} again from zero, and nothing else: {retrain_line(redo, workdir)}")
    return lines


def retrain_line(run_ids: list[str], workdir: Path) -> str:
    """The line that trains `run_ids` of the grid in `workdir` again from zero (scripts/retrain.py),
    run from here: `make retrain` where this folder's Makefile has that target (scratchflow's own
    folder, a lab's pipeline), else the script itself."""
    runs = " ".join(run_ids)
    elsewhere = workdir.resolve() != Path.cwd().resolve()
    if _has_retrain_target(Path("Makefile")):
        return f'make retrain RUNS="{runs}"' + (f" DIR={shlex.quote(str(workdir))}" if elsewhere else "")
    script = SCRATCHFLOW_DIR / "scripts" / "retrain.py"
    return shlex.join([sys.executable, str(script), *run_ids, *(["--dir", str(workdir)] if elsewhere else [])])


def _has_retrain_target(makefile: Path) -> bool:
    try:
        return any(line.startswith("retrain:") for line in makefile.read_text().splitlines())
    except (FileNotFoundError, UnicodeDecodeError):
        return False


def keep_piece_log(log_path: Path, piece: int) -> Path | None:
    """A second name for this job's log, `<run_id>.piece-<N>.log` beside it: Snakemake deletes a
    rule's log before it runs the job again, and the log of the piece that was killed or paused is
    the one a user needs. A hard link, so it holds every line the job writes, up to a SIGKILL; in the
    log's own folder, since some filesystems (BeeGFS) link only within a folder. None where the
    filesystem has no hard links."""
    kept = log_path.with_name(f"{log_path.stem}.piece-{piece}{log_path.suffix}")
    try:
        kept.unlink(missing_ok=True)  # an earlier training of the run, whose checkpoints were released
        os.link(log_path, kept)
    except OSError:
        return None
    return kept


@contextlib.contextmanager
def output_to_log(log_path: str | os.PathLike[str]) -> Iterator[TextIO]:
    """Send everything the job prints, C libraries included, to the rule's log file; yield the
    console (the job's stderr before: Snakemake's output, on a cluster the plugin's Slurm log) for
    the few lines that belong there too."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_path, "a") as log, os.fdopen(os.dup(saved[1]), "w", buffering=1) as console:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield console
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
