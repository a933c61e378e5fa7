"""What a run records about itself so that it can be reproduced: where and with what its job ran
(`environment_record`, the commit of a repository), and its job's log. Typed records (a piece's
spec, its entry in pieces.json, record.json) go to and from JSON through one pair of functions:
`plain` and `typed`. How long a job's phases took is scratchflow.timing's; what trained each run,
and where a grid's runs differ in it, scratchflow.provenance's."""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import platform
import re
import socket
import subprocess
import sys
import time
import types
import typing
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, TextIO, TypeVar

from scratchflow import __version__

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
        hints = _field_types(kind)
        return kind(**{name: _as(hints[name], item) for name, item in data.items() if name in hints})
    return data


@functools.cache
def _field_types(kind: type) -> dict[str, Any]:
    # Resolving a dataclass's annotations is most of reading a record: status reads thousands.
    return typing.get_type_hints(kind)


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
