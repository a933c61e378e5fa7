"""What a run records about itself so that it can be reproduced and its overhead seen."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from scratchflow import __version__

RECORDED_PACKAGES = ("torch", "transformers", "accelerate", "tokenizers", "pandas", "numpy", "snakemake")


class PhaseTimer:
    """Wall-clock seconds per lifecycle phase (stage, train, sync, cleanup, ...)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - start, 3)


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


def package_versions(names: tuple[str, ...] = RECORDED_PACKAGES) -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


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
