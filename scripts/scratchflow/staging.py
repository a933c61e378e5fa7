"""Moving data between shared storage and node-local scratch, with the real tools (tar, rsync).

Invariants kept here:
- a result on shared storage is complete or absent: it is written under a temporary name, then renamed;
- a scratch directory belongs to one process and is removed by it, on success and on failure; one
  left by a killed process is removed by the next process that stages the same thing on that host.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import queue
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from scratchflow.dataset import WHOLE, data_sources, list_files
from scratchflow.files import HOST, OWNER_TAG, read_json, write_json_atomically, written_whole
from scratchflow.record import PhaseTimer

log = logging.getLogger(__name__)
# Slurm sends its wall-time warning (SIGUSR1) and scancel's SIGTERM to every process of a job. rsync
# ends itself on both (exit 19 on SIGUSR1, 20 on SIGTERM/SIGINT/SIGHUP), where the job, which is then
# saving its progress, needs the copy it was making: an rsync so stopped runs again and goes on.
RSYNC_STOPPED_BY_SIGNAL = (19, 20)
STOPPED_TOOL_RETRIES = 3

COPY_BLOCK_BYTES = 1024 * 1024

# Byte-for-byte reproducible archives: the same files always give the same checksum.
REPRODUCIBLE_TAR_OPTIONS = (
    "--sort=name",
    "--mtime=@0",
    "--owner=0",
    "--group=0",
    "--numeric-owner",
    "--format=gnu",
    "--exclude=.*",
)


class StagingError(RuntimeError):
    """Data could not be moved safely; the message says what to do."""


def _run(command: list[str], stopped_by_signal: tuple[int, ...] = ()) -> None:
    """Run a tool with arguments as data (no shell); fail with its own error message. A run that
    ends with one of the `stopped_by_signal` codes is started again, up to STOPPED_TOOL_RETRIES times."""
    result = subprocess.run(command, capture_output=True, text=True)
    for _retry in range(STOPPED_TOOL_RETRIES):
        if result.returncode not in stopped_by_signal:
            break
        log.warning("%s was stopped by a signal (%s); running it again", command[0], result.stderr.strip())
        result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise StagingError(f"{command[0]} failed (exit {result.returncode}): {result.stderr.strip()}")


def require_tools(*names: str) -> None:
    missing = [name for name in names if shutil.which(name) is None]
    if missing:
        raise StagingError(
            f"{', '.join(missing)} not found on PATH; install it (Debian: apt-get install {' '.join(missing)})"
        )


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while block := source.read(COPY_BLOCK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def archive_dataset(dataset: dict[str, Any], archive: Path, manifest: Path) -> dict[str, Any]:
    """Pack a dataset (a file or folder tree, or one per split) into ONE tar on shared storage, plus
    its manifest.

    Shared filesystems are slow at many small files and fast at one big one: this is why data
    travels as an archive. The manifest's sha256 is what every stage-in verifies. A dataset with
    splits is packed as `<name>/train`, `<name>/validation`, `<name>/test`, wherever its files lie.
    """
    require_tools("tar")
    sources = data_sources(dataset)
    files = [file for source in sources.values() for file in list_files(source)]
    if not files:
        raise StagingError(f"{', '.join(map(str, sources.values()))}: the dataset has no files")
    if WHOLE in sources:
        root = sources[WHOLE].name
        operands = [f"--directory={sources[WHOLE].parent}", "--", root]
    else:
        root = dataset["name"]
        located = {name: path.resolve() for name, path in sources.items()}
        base = Path(os.path.commonpath([path.parent for path in located.values()]))
        named = {name: path.relative_to(base).as_posix() for name, path in located.items()}
        operands = [
            *(f"--transform={_renaming(member, f'{root}/{name}')}" for name, member in named.items()),
            f"--directory={base}",
            "--",
            *named.values(),
        ]
    tar = ["tar", "--create", "--file=-", *REPRODUCIBLE_TAR_OPTIONS, *operands]
    # tar's output is hashed as it is written: the archive is never read back.
    with written_whole(archive) as partial, tempfile.TemporaryFile() as errors, open(partial, "wb") as writer:
        packing = subprocess.Popen(tar, stdout=subprocess.PIPE, stderr=errors)
        sha256 = _copy_hashing(packing.stdout, writer)
        if packing.wait() != 0:
            errors.seek(0)
            raise StagingError(f"tar failed (exit {packing.returncode}): {errors.read().decode().strip()}")
    record = {
        "dataset": dataset["name"],
        "format": dataset["format"],
        "root": root,
        "files": len(files),
        "bytes": sum(file.stat().st_size for file in files),
        "archive_bytes": archive.stat().st_size,
        "sha256": sha256,
    }
    write_json_atomically(record, manifest)
    return record


def _renaming(member: str, new_name: str) -> str:
    """tar's --transform expression renaming `member` (and what lies below it) to `new_name`; the
    targets of symbolic links stay as they are (flag S)."""

    def pattern(text: str) -> str:
        return "".join(f"\\{c}" if c in "\\.*[]^$," else c for c in text)

    def replacement(text: str) -> str:
        return "".join(f"\\{c}" if c in "\\&," else c for c in text)

    return f"s,^{pattern(member)}\\(/\\|$\\),{replacement(new_name)}\\1,S"


def _copy_hashing(reader: BinaryIO, writer: BinaryIO) -> str:
    """Copy a stream and return its sha256. The hash is computed on a second thread while the copy
    goes on (hashlib lets go of the GIL), so that it adds no time (benchmarks/stage_in.py). If the
    writer stops reading early (tar quits on a damaged archive), the rest is still read and hashed,
    so that the checksum can say what is wrong."""
    digest = hashlib.sha256()
    blocks: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
    hashing = threading.Thread(target=_hash_blocks, args=(digest, blocks), daemon=True)
    hashing.start()
    writing = True
    try:
        while block := reader.read(COPY_BLOCK_BYTES):
            blocks.put(block)
            if writing:
                try:
                    writer.write(block)
                except BrokenPipeError:
                    writing = False
    finally:
        blocks.put(None)
        hashing.join()
    return digest.hexdigest()


def _hash_blocks(digest: Any, blocks: queue.Queue[bytes | None]) -> None:
    while (block := blocks.get()) is not None:
        digest.update(block)


def stage_in(archive: Path, manifest: Path, scratch: Path) -> Path:
    """Extract the archive into scratch, verifying it against its manifest; return the data's path.

    The archive streams from shared storage straight into `tar --extract`, hashed on the way: it is
    read once and never written to scratch (benchmarks/stage_in.py measures why). Data that does
    not match its manifest is deleted and stops the job here, before any training; so does too
    little space on scratch, before anything is written.
    """
    require_tools("tar")
    expected = read_json(manifest)
    _check_space(scratch, expected)
    extracted = scratch / "data"
    extracted.mkdir()
    tar = ["tar", "--extract", "--file=-", f"--directory={extracted}"]
    with open(archive, "rb") as reader, tempfile.TemporaryFile() as errors:
        extracting = subprocess.Popen(tar, stdin=subprocess.PIPE, stderr=errors)
        with contextlib.suppress(OSError):  # a larger pipe lets reading run ahead of tar
            fcntl.fcntl(extracting.stdin.fileno(), fcntl.F_SETPIPE_SZ, COPY_BLOCK_BYTES)
        try:
            actual_sha256 = _copy_hashing(reader, extracting.stdin)
        finally:
            with contextlib.suppress(BrokenPipeError):
                extracting.stdin.close()
            extracting.wait()
        errors.seek(0)
        tar_errors = errors.read().decode(errors="replace").strip()
    if actual_sha256 != expected["sha256"]:
        shutil.rmtree(extracted, ignore_errors=True)
        raise StagingError(
            f"checksum mismatch for {archive}: its sha256 is {actual_sha256}, but {manifest} records "
            f"{expected['sha256']}. The archive is corrupt or was changed after it was made; "
            f"delete {archive} and its manifest so that the workflow rebuilds them."
        )
    if extracting.returncode != 0:
        shutil.rmtree(extracted, ignore_errors=True)
        raise StagingError(f"tar failed (exit {extracting.returncode}): {tar_errors}")
    return extracted / expected["root"]


# What a file takes on disk beyond its bytes, at most (one filesystem block), for the space check.
FILE_OVERHEAD_BYTES = 4096


def _check_space(scratch: Path, manifest: dict[str, Any]) -> None:
    """Fail with the figures, not halfway through extracting with ENOSPC, if the data cannot fit."""
    needed = manifest["bytes"] + manifest["files"] * FILE_OVERHEAD_BYTES
    free = shutil.disk_usage(scratch).free
    if needed > free:
        raise StagingError(
            f"node-local scratch {scratch} has {free / 1e6:.1f} MB free, but staging the dataset needs "
            f"{needed / 1e6:.1f} MB (its {manifest['files']} files, {manifest['bytes'] / 1e6:.1f} MB, "
            "and a block each). Point cluster.scratch_root at a larger disk, or ask "
            "Slurm for more local disk (e.g. --tmp in slurm_extra, where the cluster supports it)."
        )


def _owner_is_gone(name: str) -> bool:
    """True only when `name` carries this host's tag and a pid that no longer exists."""
    parts = name.split("@")
    if len(parts) < 3 or parts[1] != HOST or not parts[2].isdigit():
        return False
    try:
        os.kill(int(parts[2]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def remove_leftovers(folder: Path, prefix: str = "") -> list[Path]:
    """Delete owner-tagged entries of `folder` (those starting with `prefix`, if given) whose owning
    process has died on this host."""
    removed = []
    if folder.is_dir():
        for entry in folder.iterdir():
            if entry.name.startswith(prefix) and _owner_is_gone(entry.name):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
                removed.append(entry)
    return removed


def copy_whole(source: Path, destination: Path) -> None:
    """rsync a file or directory to `destination` (scratch to shared storage, or back), then rename
    it into place.

    Until the rename, the result exists only under a hidden partial name, so a killed copy never
    looks finished. A partial left by a dead process is removed first.
    """
    require_tools("rsync")
    destination.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(destination.parent, f".{destination.name}.")
    partial = destination.with_name(f".{destination.name}.partial{OWNER_TAG}")
    trailing = "/" if source.is_dir() else ""
    _run(["rsync", "--archive", "--delete", f"{source}{trailing}", f"{partial}{trailing}"], RSYNC_STOPPED_BY_SIGNAL)
    if destination.is_dir() and not destination.is_symlink():
        # Renaming over a non-empty directory is not possible: move the old one aside first.
        superseded = destination.with_name(f".{destination.name}.superseded{OWNER_TAG}")
        os.rename(destination, superseded)
        os.rename(partial, destination)
        shutil.rmtree(superseded)
    else:
        os.replace(partial, destination)


def resolve_scratch_root(root: str | None) -> Path:
    """The node-local scratch root: a path that may name environment variables set in the job
    ('$SLURM_TMPDIR', '/disk/scratch/$USER'), or None for the system's temporary directory."""
    if root is None:
        return Path(tempfile.gettempdir())
    expanded = os.path.expandvars(os.path.expanduser(root))
    if "$" in expanded:
        raise StagingError(
            f"scratch root {root!r} names an environment variable that is not set in this job: {expanded!r}"
        )
    return Path(expanded)


@contextlib.contextmanager
def scratch_directory(root: str | None, tag: str, timer: PhaseTimer | None = None) -> Iterator[Path]:
    """A private directory under the scratch root for one job, removed when the job ends, however
    it ends (its removal is timed as the 'cleanup' phase). Leftovers of the same job killed earlier
    on this host are removed on the way in."""
    base = resolve_scratch_root(root)
    base.mkdir(parents=True, exist_ok=True)
    prefix = f"scratchflow-{tag}@"
    remove_leftovers(base, prefix)
    path = Path(tempfile.mkdtemp(prefix=f"scratchflow-{tag}{OWNER_TAG}@", dir=base))
    try:
        yield path
    finally:
        with timer.phase("cleanup") if timer else contextlib.nullcontext():
            shutil.rmtree(path, ignore_errors=True)
