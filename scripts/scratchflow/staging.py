"""Moving data between shared storage and node-local scratch, with the real tools (tar, rsync).

Invariants kept here:
- a result on shared storage is complete or absent: it is written under a temporary name, then renamed;
- a scratch directory belongs to one process and is removed by it, on success and on failure; one
  left by a killed process is removed by the next process that stages the same thing on that host.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import itertools
import json
import logging
import os
import queue
import shutil
import stat
import string
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

from scratchflow.dataset import WHOLE, data_sources, list_files
from scratchflow.files import (
    OWNER_TAG,
    NoSpace,
    no_space_line,
    read_json,
    remove_leftovers,
    tree_bytes,
    write_json_atomically,
    written_whole,
)
from scratchflow.snakemake_adapter import JOB_VARIABLES
from scratchflow.timing import PhaseTimer

log = logging.getLogger(__name__)
# Slurm sends every process of a job its wall-time warning, a configured stop signal (USR1, USR2,
# HUP) or scancel's TERM, the rsync of a copy the job is making included. rsync's processes end on
# each, with an exit status that depends on which ended first (19, 20, 10 for the broken pipe the
# other saw, and 0 on USR2, its copy cut short). So no exit status is trusted: a copy is compared
# with its source, and one that is not whole is made again (rsync goes on where it stopped).
RSYNC_OPTIONS = ("--archive", "--delete")
COPY_TRIES = 4

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
# A file in the archive: its member name, its bytes, and its folders (members of their own).
ArchiveMember = tuple[str, int, tuple[str, ...]]


class StagingError(RuntimeError):
    """Data could not be moved safely; the message says what to do."""


# What rsync says when the destination's filesystem, or the user's quota on it, is full.
FULL_DISK_ERRORS = ("No space left on device", "Disk quota exceeded")


def missing_tools(*names: str) -> list[str]:
    return [name for name in names if shutil.which(name) is None]


def require_tools(*names: str) -> None:
    missing = missing_tools(*names)
    if missing:
        raise StagingError(
            f"{', '.join(missing)} not found on PATH ({os.environ.get('PATH', '')}); "
            f"install it (Debian: apt-get install {' '.join(missing)})"
        )


# How an archive travels (dataset keys `compression` and `archive_parts`). Neither key has a schema
# default: an unset key leaves the archive rule's params, and so the archives of existing grids, as
# they were before the keys existed.
COMPRESSIONS = {"none": ".tar", "zstd": ".tar.zst"}
# The program that compresses and decompresses an archive, besides tar.
COMPRESSION_TOOLS = {"none": (), "zstd": ("zstd",)}
# `archive_parts: auto` splits a dataset into parts of about this many bytes; smaller datasets keep
# one archive. Parts pay where a job has CPUs to spare beside the checksum: on 2 cores one archive of
# 100,000 small files stages faster than the same files in parts (benchmarks/README.md).
PART_BYTES = 512 * 2**20
MAX_AUTO_PARTS = 64


def archive_layout(dataset: dict[str, Any]) -> tuple[str, int | str]:
    """The dataset's (compression, archive_parts), defaults filled in."""
    return dataset.get("compression", "none"), dataset.get("archive_parts", "auto")


def archive_suffix(dataset: dict[str, Any]) -> str:
    """`.tar`, or `.tar.zst` for a compressed archive."""
    return COMPRESSIONS[archive_layout(dataset)[0]]


def part_count(requested: int | str, sizes: list[int]) -> int:
    """How many parts the archive of files of these sizes has: as requested, or by size ('auto'),
    never more than there are files."""
    if requested == "auto":
        requested = min(MAX_AUTO_PARTS, -(-sum(sizes) // PART_BYTES))
    return max(1, min(int(requested), len(sizes)))


def balanced_parts(sizes: list[int], count: int) -> list[range]:
    """Cut a list of files (in name order) into `count` runs of consecutive files with about the
    same number of bytes each. Consecutive, so that a folder's files mostly share a part."""
    total, bounds, running = sum(sizes), [0], 0
    for index, size in enumerate(sizes[:-1]):
        running += size
        parts_to_start, files_left = count - len(bounds), len(sizes) - index - 1
        # Cut after this file once the parts so far have their share, or when every part still to
        # come needs one of the files left.
        if parts_to_start and (running >= total * len(bounds) / count or files_left == parts_to_start):
            bounds.append(index + 1)
    bounds.append(len(sizes))
    return [range(start, stop) for start, stop in itertools.pairwise(bounds)]


def part_paths(first: Path, compression: str, count: int) -> list[Path]:
    """`<name>.tar`, `<name>.2.tar`, ... (`.tar.zst` when compressed), beside the first part."""
    suffix = COMPRESSIONS[compression]
    stem = first.name.removesuffix(suffix)
    return [first, *(first.with_name(f"{stem}.{index}{suffix}") for index in range(2, count + 1))]


def data_sha256(part_sha256s: list[str]) -> str:
    """What identifies the data a run trained on: the archive's sha256 when it is one part (as it
    always was), else the sha256 of its parts' checksums, one a line."""
    if len(part_sha256s) == 1:
        return part_sha256s[0]
    return hashlib.sha256("".join(f"{sha256}\n" for sha256 in part_sha256s).encode()).hexdigest()


def archive_dataset(dataset: dict[str, Any], archive: Path, manifest: Path) -> dict[str, Any]:
    """Pack a dataset (a file or folder tree, or one per split) into a tar on shared storage, split
    into parts when it is large, plus its manifest; `archive` is the first (or only) part.

    Shared filesystems are slow at many small files and fast at a few big ones: this is why data
    travels as an archive. Parts, balanced by bytes, are written and later staged in parallel; each
    part's sha256 (of its tar stream, before any compression) is what every stage-in verifies. A
    dataset with splits is packed as `<name>/train`, `<name>/validation`, `<name>/test`, wherever
    its files lie.
    """
    compression, requested_parts = archive_layout(dataset)
    require_tools("tar", *COMPRESSION_TOOLS[compression])
    sources = data_sources(dataset)
    root, base, prefixes, renaming = _archive_names(dataset, sources)
    # In name order.
    members = sorted(
        _member(file, source, prefixes[name]) for name, source in sources.items() for file in list_files(source)
    )
    if not members:
        raise StagingError(f"{', '.join(map(str, sources.values()))}: the dataset has no files")
    sizes = [size for _, size, _ in members]
    ranges = balanced_parts(sizes, part_count(requested_parts, sizes))
    paths = part_paths(archive, compression, len(ranges))
    _remove_other_parts(archive, compression, keep=paths)
    tar = ["tar", "--create", "--file=-", "--no-recursion", *REPRODUCIBLE_TAR_OPTIONS, *renaming, f"--directory={base}"]
    part_sha256s = _write_parts(tar, members, paths, ranges, compression)
    record = {
        "dataset": dataset["name"],
        "format": dataset["format"],
        "root": root,
        "files": len(members),
        "bytes": sum(sizes),
        "archive_bytes": sum(path.stat().st_size for path in paths),
        "compression": compression,
        "parts": [
            {"file": path.name, "files": len(part), "bytes": sum(sizes[index] for index in part), "sha256": sha256}
            for path, part, sha256 in zip(paths, ranges, part_sha256s, strict=True)
        ],
        "sha256": data_sha256(part_sha256s),
    }
    write_json_atomically(record, manifest)
    return record


def _archive_names(dataset: dict[str, Any], sources: dict[str, Path]) -> tuple[str, Path, dict[str, str], list[str]]:
    """Where the dataset goes in the archive: its root folder, the folder tar runs in, each source's
    path from there, and tar's options that rename those paths to `<root>/<split>` (a dataset with
    splits, wherever its files lie)."""
    if WHOLE in sources:
        return sources[WHOLE].name, sources[WHOLE].parent, {WHOLE: sources[WHOLE].name}, []
    root = dataset["name"]
    located = {name: path.resolve() for name, path in sources.items()}
    base = Path(os.path.commonpath([path.parent for path in located.values()]))
    prefixes = {name: path.relative_to(base).as_posix() for name, path in located.items()}
    renaming = [f"--transform={_renaming(prefix, f'{root}/{name}')}" for name, prefix in prefixes.items()]
    return root, base, prefixes, renaming


def _write_parts(
    tar: list[str], members: list[ArchiveMember], paths: list[Path], ranges: list[range], compression: str
) -> list[str]:
    """Write the parts side by side (the members in `ranges[i]` into `paths[i]`); their sha256s, in order."""
    with ThreadPoolExecutor(available_cpus()) as pool:
        return list(
            pool.map(
                lambda path, part: _write_part(
                    tar, _part_members(members, part), path, compression, sum(members[index][1] for index in part)
                ),
                paths,
                ranges,
            )
        )


def _part_members(members: list[ArchiveMember], part: range) -> list[str]:
    """The part's files, each after its folders: tars extracting parts at once into the same
    folders then never create one implicitly (GNU tar fails when another does it first)."""
    folders = {folder for index in part for folder in members[index][2]}
    return sorted(folders | {members[index][0] for index in part})


def _member(file: Path, source: Path, prefix: str) -> ArchiveMember:
    """A file's name in the archive (`source` is archived as `prefix`), its size and its folders."""
    if file == source:
        return prefix, file.stat().st_size, ()
    inner = file.relative_to(source).parts
    folders = tuple("/".join((prefix, *inner[:depth])) for depth in range(len(inner)))
    return "/".join((prefix, *inner)), file.stat().st_size, folders


def _write_part(tar: list[str], members: list[str], path: Path, compression: str, member_bytes: int) -> str:
    """tar `members` (`member_bytes` in all) into `path` (compressed on the way if asked), whole or
    not at all; return the sha256 of the tar stream, hashed as it is written: the part is never read
    back."""
    with (
        written_whole(path, needed=member_bytes) as partial,
        tempfile.NamedTemporaryFile("w") as listing,
        tempfile.TemporaryFile() as errors,
        open(partial, "wb") as writer,
    ):
        listing.write("".join(f"{member}\0" for member in members))
        listing.flush()
        packing = subprocess.Popen(
            [*tar, "--null", "--verbatim-files-from", f"--files-from={listing.name}"],
            stdout=subprocess.PIPE,
            stderr=errors,
        )
        compressing = None
        destination: IO[bytes] = writer
        if compression == "zstd":
            compressing = subprocess.Popen(["zstd", "--quiet", "-c"], stdin=subprocess.PIPE, stdout=writer)
            destination = _piped(compressing.stdin)
        try:
            sha256 = _copy_hashing(_piped(packing.stdout), destination)
        except BaseException:  # the disk full, say: tar would wait on its pipe for good
            packing.kill()
            packing.wait()
            raise
        if compressing:
            destination.close()
            if compressing.wait() != 0:
                raise StagingError(f"zstd failed (exit {compressing.returncode}) compressing {path}")
        if packing.wait() != 0:
            errors.seek(0)
            raise StagingError(f"tar failed (exit {packing.returncode}): {errors.read().decode().strip()}")
    return sha256


def _remove_other_parts(first: Path, compression: str, keep: list[Path]) -> None:
    """Parts of an earlier, differently split archive of the same dataset."""
    stem = first.name.removesuffix(COMPRESSIONS[compression])
    for suffix in COMPRESSIONS.values():
        for path in first.parent.glob(f"{glob.escape(stem)}.*{suffix}"):
            if path not in keep and path.name.removesuffix(suffix)[len(stem) + 1 :].isdigit():
                path.unlink()


def available_cpus() -> int:
    """The CPUs this process may run on (in a Slurm job, those of its allocation)."""
    return len(os.sched_getaffinity(0))


def _renaming(member: str, new_name: str) -> str:
    """tar's --transform expression renaming `member` (and what lies below it) to `new_name`; the
    targets of symbolic links stay as they are (flag S)."""

    def pattern(text: str) -> str:
        return "".join(f"\\{c}" if c in "\\.*[]^$," else c for c in text)

    def replacement(text: str) -> str:
        return "".join(f"\\{c}" if c in "\\&," else c for c in text)

    return f"s,^{pattern(member)}\\(/\\|$\\),{replacement(new_name)}\\1,S"


def _piped(stream: IO[bytes] | None) -> IO[bytes]:
    """A child's stream that was asked for with subprocess.PIPE (typed as optional: None is only for
    the streams that were not)."""
    if stream is None:
        raise RuntimeError("subprocess.Popen gave no pipe for a stream started with subprocess.PIPE")
    return stream


def _copy_hashing(reader: IO[bytes], writer: IO[bytes]) -> str:
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

    Each part goes from shared storage straight into `tar --extract` (through `zstd -d` when
    compressed), hashed while tar reads it: it is never copied to scratch first. Parts are
    extracted at once, as many as this process has CPUs (benchmarks/stage_in.py measures why). Data
    that does not match its manifest is deleted and stops the job here, before any training; so
    does too little space on scratch, before anything is written.
    """
    expected = read_json(manifest)
    compression = expected.get("compression", "none")
    require_tools("tar", *COMPRESSION_TOOLS[compression])
    # Manifests written before archives had parts describe one.
    parts = expected.get("parts") or [{"file": archive.name, "sha256": expected["sha256"]}]
    parts_sha256 = data_sha256([part["sha256"] for part in parts])
    if parts_sha256 != expected["sha256"]:
        raise StagingError(
            f"checksum mismatch in {manifest}: its parts' checksums give {parts_sha256}, but it records "
            f"{expected['sha256']}. The manifest was changed after it was made; delete it so that the "
            "workflow rebuilds the archive."
        )
    _check_space(scratch, expected)
    extracted = scratch / "data"
    extracted.mkdir()
    if len(parts) > 1:  # a dataset of several files has a folder at its root: made here, before the tars
        (extracted / expected["root"]).mkdir()
    failed = threading.Event()

    def extract(part: dict[str, Any]) -> str | None:
        if failed.is_set():  # another part failed: the data is deleted anyway
            return None
        problem = _extract_part(archive.with_name(part["file"]), part["sha256"], compression, extracted, manifest)
        if problem:
            failed.set()
        return problem

    at_once = min(len(parts), available_cpus())
    with ThreadPoolExecutor(at_once) as pool:
        problems = [problem for problem in pool.map(extract, parts) if problem]
    if problems:
        shutil.rmtree(extracted, ignore_errors=True)
        raise StagingError(problems[0])
    log.info(
        "staged %d files from %d part(s) of %s (%d at a time, compression: %s), sha256 verified",
        *(expected["files"], len(parts), archive.name, at_once, compression),
    )
    return extracted / expected["root"]


def _extract_part(part: Path, expected_sha256: str, compression: str, extracted: Path, manifest: Path) -> str | None:
    """Extract one part, hashing its tar stream on the way; what went wrong, or None.

    An uncompressed part is tar's own input, read from the open file, while this thread hashes the
    same open file (pread: the two never share an offset), so no byte passes through Python; a
    compressed one streams from `zstd -d` through this process, hashed, into tar.
    """
    tar = ["tar", "--extract", "--file=-", f"--directory={extracted}"]
    with contextlib.ExitStack() as stack:
        try:
            source = stack.enter_context(open(part, "rb", buffering=0))
        except FileNotFoundError:
            return (
                f"{part}, a part of the archive that {manifest} lists, is missing; "
                f"delete {manifest} so that the workflow rebuilds the archive."
            )
        errors = stack.enter_context(tempfile.TemporaryFile())
        if compression == "zstd":
            decompressing = subprocess.Popen(
                ["zstd", "-d", "-c", "--quiet"], stdin=source, stdout=subprocess.PIPE, stderr=errors
            )
            extracting = subprocess.Popen(tar, stdin=subprocess.PIPE, stderr=errors)
            into_tar = _piped(extracting.stdin)
            with contextlib.suppress(OSError):  # a larger pipe lets reading run ahead of tar
                fcntl.fcntl(into_tar.fileno(), fcntl.F_SETPIPE_SZ, COPY_BLOCK_BYTES)
            try:
                actual_sha256 = _copy_hashing(_piped(decompressing.stdout), into_tar)
            finally:
                with contextlib.suppress(BrokenPipeError):
                    into_tar.close()
                extracting.wait()
                decompressing.wait()
        else:
            extracting = subprocess.Popen(tar, stdin=source, stderr=errors)
            try:
                actual_sha256 = _sha256_of_open_file(source.fileno())
            finally:
                extracting.wait()
        errors.seek(0)
        tool_errors = errors.read().decode(errors="replace").strip()
    if actual_sha256 != expected_sha256:
        return (
            f"checksum mismatch for {part}: its sha256 is {actual_sha256}, but {manifest} records "
            f"{expected_sha256}. The archive is corrupt or was changed after it was made; "
            f"delete {manifest} so that the workflow rebuilds the archive."
        )
    if extracting.returncode != 0:
        return f"tar failed (exit {extracting.returncode}): {tool_errors}"
    return None


def _sha256_of_open_file(descriptor: int) -> str:
    """The sha256 of a whole open file, read with pread (the descriptor's offset is left alone)."""
    digest, offset = hashlib.sha256(), 0
    while block := os.pread(descriptor, COPY_BLOCK_BYTES, offset):
        digest.update(block)
        offset += len(block)
    return digest.hexdigest()


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


def copy_whole(source: Path, destination: Path) -> None:
    """rsync a file or directory to `destination` (scratch to shared storage, or back), renamed into
    place once it matches the source (every file, size and time)."""
    with copied_whole(source, destination):
        pass


@contextlib.contextmanager
def copied_whole(source: Path, destination: Path) -> Iterator[None]:
    """rsync a file or directory to a hidden partial name beside `destination` until it matches the
    source (every file, size and time), run the block, then rename it into place, unless the block
    raised (a run's gate, scratchflow.lease, looks at its fence there).

    Until the rename, the result exists only under a hidden partial name, so a killed copy never
    looks finished. A copy that fails removes its partial; one left by a dead process is removed first.
    """
    require_tools("rsync")
    destination.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(destination.parent, f".{destination.name}.")
    partial = destination.with_name(f".{destination.name}.partial{OWNER_TAG}")
    try:
        _copy_until_whole(source, partial)
        yield
    except BaseException:
        _remove_partial(partial)
        raise
    if destination.is_dir() and not destination.is_symlink():
        # Renaming over a non-empty directory is not possible: move the old one aside first.
        superseded = destination.with_name(f".{destination.name}.superseded{OWNER_TAG}")
        os.rename(destination, superseded)
        os.rename(partial, destination)
        shutil.rmtree(superseded)
    else:
        os.replace(partial, destination)


def _copy_until_whole(source: Path, partial: Path) -> None:
    trailing = "/" if source.is_dir() else ""
    command = ["rsync", *RSYNC_OPTIONS, f"{source}{trailing}", f"{partial}{trailing}"]
    had_source = os.path.lexists(source)
    # Measured before the copy: a task may prune its checkpoint while it is copied, and the line
    # for a full disk then said it needed 0.0 MB.
    needed = tree_bytes(source)
    for _try in range(COPY_TRIES):
        result = subprocess.run(command, capture_output=True, text=True)
        if any(error in result.stderr for error in FULL_DISK_ERRORS):
            raise NoSpace(no_space_line(partial.parent, needed, f"copying {source.name} there"))
        differences = copy_differences(source, partial)
        if not differences and os.path.lexists(partial):
            return
        source_gone = had_source and not os.path.lexists(source)  # a task pruning its checkpoint: no retry helps
        log.warning(
            "rsync's copy of %s is not whole (exit %d%s; %s): %s",
            *(source, result.returncode, f", {result.stderr.strip()}" if result.stderr.strip() else ""),
            "; ".join(differences[:3]),
            "its source was removed meanwhile" if source_gone else "copying again",
        )
        if source_gone:
            raise StagingError(f"{source} was removed while it was copied")
    if result.returncode != 0:
        raise StagingError(f"rsync failed (exit {result.returncode}): {result.stderr.strip()}")
    raise StagingError(
        f"rsync did not copy {source} whole in {COPY_TRIES} tries (it reported success each time): "
        f"{'; '.join(differences[:10])}"
    )


def _remove_partial(partial: Path) -> None:
    if partial.is_dir() and not partial.is_symlink():
        shutil.rmtree(partial, ignore_errors=True)
    else:
        partial.unlink(missing_ok=True)


def copy_differences(source: Path, copy: Path) -> list[str]:
    """How `copy` differs from `source` (a file or a directory tree) in what rsync --archive keeps:
    the entries, each one's kind, a file's size and modification time (whole seconds), a link's
    target; empty when it is a whole copy. rsync writes each file under a temporary name and renames
    it when whole, so a copy cut short shows as files missing or extra, never as a short file under
    its own name; the sizes catch the rest."""
    expected, found = _entries(source), _entries(copy)
    differences = [f"{name or copy.name}: missing" for name in expected if name not in found]
    differences += [f"{name or copy.name}: not in the source" for name in found if name not in expected]
    differences += [
        f"{name or copy.name}: {found[name]} where the source has {expected[name]}"
        for name in expected
        if name in found and found[name] != expected[name]
    ]
    return differences


def _entries(root: Path) -> dict[str, str]:
    """Relative path -> what copy_differences compares, for `root` and everything under it."""

    def described(path: Path) -> str:
        status = path.lstat()
        if stat.S_ISLNK(status.st_mode):
            return f"a link to {os.readlink(path)}"
        if stat.S_ISDIR(status.st_mode):
            return "a directory"
        return f"{status.st_size} bytes of {int(status.st_mtime)}"

    if not os.path.lexists(root):
        return {}
    entries = {"": described(root)}
    if root.is_dir() and not root.is_symlink():
        for folder, directories, files in os.walk(root):
            for name in directories + files:
                path = Path(folder, name)
                entries[str(path.relative_to(root))] = described(path)
    return entries


def resolve_scratch_root(root: str | None, environ: Mapping[str, str] = os.environ) -> Path:
    """The node-local scratch root: a path that may name environment variables set in the job
    ('$SLURM_TMPDIR', '/disk/scratch/$USER'), or None for the system's temporary directory. A Slurm
    variable the job step removed is taken from what the job's Snakemake kept (snakemake_adapter.keep_job_variables)."""
    if root is None:
        return Path(tempfile.gettempdir())
    variables = {**json.loads(environ.get(JOB_VARIABLES) or "{}"), **environ}
    expanded = string.Template(os.path.expanduser(root)).safe_substitute(variables)
    if "$" in expanded:
        raise StagingError(
            f"scratch root {root!r} names an environment variable that is not set in this job: {expanded!r}"
        )
    return Path(expanded)


SCRATCH_PREFIX = "scratchflow-"


@contextlib.contextmanager
def scratch_directory(root: str | None, tag: str, timer: PhaseTimer | None = None) -> Iterator[Path]:
    """A private directory under the scratch root for one job, removed when the job ends, however
    it ends (its removal is timed as the 'cleanup' phase). What scratchflow jobs that died on this
    host left there (killed, or their node lost: a node-local scratch that persists across jobs keeps
    it until then) is removed on the way in, whichever run they trained."""
    base = resolve_scratch_root(root)
    base.mkdir(parents=True, exist_ok=True)
    for removed in remove_leftovers(base, SCRATCH_PREFIX):
        log.info("removed %s, left by a job that died on this host", removed)
    path = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{tag}{OWNER_TAG}@", dir=base))
    try:
        yield path
    finally:
        with timer.phase("cleanup") if timer else contextlib.nullcontext():
            shutil.rmtree(path, ignore_errors=True)
