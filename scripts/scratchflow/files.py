"""Files on shared storage that appear whole or not at all: written under a hidden partial name,
then renamed into place. A partial left by a killed writer carries its owner's tag
('<name>.partial@<host>@<pid>'), so that a later process can tell it from live work."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HOST = socket.gethostname().split(".")[0]
# Owner-tagged names: '<what>@<host>@<pid>[@<random>]'.
OWNER_TAG = f"@{HOST}@{os.getpid()}"


def process_may_live(host: str, pid: int) -> bool:
    """Whether process `pid` on `host` may still run: only one on this machine can be asked; one on
    another machine is assumed alive (nothing here can tell). The one answer to "is its owner
    alive" for owner-tagged names, run holders and the status."""
    if host.split(".")[0] != HOST:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def written_whole(path: Path, needed: int | None = None) -> Iterator[Path]:
    """Yield a hidden partial name to write `path` under; rename it into place only if the block
    raises nothing. Readers see the old file or the whole new one, never a part. A full filesystem
    or quota is raised as NoSpace, with the figures (`needed`: the bytes the writing takes, if known)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial{OWNER_TAG}")
    try:
        yield partial
    except BaseException as error:
        partial.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno in FULL_DISK_ERRNOS:
            raise NoSpace(no_space_line(path.parent, needed, f"writing {path.name} there")) from error
        raise
    os.replace(partial, path)


class NoSpace(OSError):
    """A filesystem (or the user's quota on it) is full: retrying without freeing space cannot help."""


# The errors a write gets when its filesystem, or the user's quota on it, is full.
FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def no_space_line(folder: Path, needed: int | None, doing: str) -> str:
    """One line for a full filesystem: the folder, its filesystem, the bytes needed (where known) and free."""
    mount_point, kind = filesystem_of(folder)
    free = shutil.disk_usage(folder).free
    needs = f"it needs {needed / 1e6:.1f} MB and " if needed is not None else ""
    return (
        f"no space in {folder.absolute()} for {doing}: {needs}its filesystem ({kind} at {mount_point}) has "
        f"{free / 1e6:.1f} MB free (or your quota there is used up). Free space there, then run the same "
        "command again: it goes on from where it stopped"
    )


def require_free_space(folder: Path, needed: int, doing: str) -> None:
    """Raise NoSpace, with the figures, where `folder`'s filesystem has less than `needed` bytes free."""
    if shutil.disk_usage(folder).free < needed:
        raise NoSpace(no_space_line(folder, needed, doing))


def filesystem_of(path: Path) -> tuple[str, str]:
    """The mount point and type of the filesystem that holds `path` (from /proc/self/mounts)."""
    resolved, found = str(path.resolve()), ("/", "unknown")
    with contextlib.suppress(OSError), open("/proc/self/mounts") as mounts:
        for line in mounts:
            _device, mount_point, kind, *_ = line.split()
            mount_point = mount_point.replace("\\040", " ")
            inside = resolved == mount_point or resolved.startswith(mount_point.rstrip("/") + "/")
            if inside and len(mount_point) >= len(found[0]):
                found = (mount_point, kind)
    return found


def write_json_atomically(data: Any, path: Path, sort_keys: bool = True, durable: bool = True) -> None:
    """`data` as JSON in `path`, whole or not at all; `durable`: on disk before it is renamed into
    place (an fsync: a round trip to a shared filesystem's servers, spared for what a crash may lose)."""
    with written_whole(path) as partial, open(partial, "w") as out:
        json.dump(data, out, indent=2, sort_keys=sort_keys)
        out.write("\n")
        if durable:
            out.flush()
            os.fsync(out.fileno())


def remove_whole(path: Path) -> None:
    """Delete a directory so that no half-deleted copy keeps its name: rename first, then delete."""
    doomed = path.with_name(f".{path.name}.deleting{OWNER_TAG}")
    os.rename(path, doomed)
    shutil.rmtree(doomed)


def _owner_is_gone(name: str) -> bool:
    """True only when `name` carries this host's tag and a pid that no longer exists."""
    parts = name.split("@")
    if len(parts) < 3 or parts[1] != HOST or not parts[2].isdigit():
        return False
    return not process_may_live(parts[1], int(parts[2]))


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


def tree_bytes(path: Path) -> int:
    """The bytes of the files under `path` (or of the file)."""
    if not path.is_dir():
        return path.stat().st_size if path.exists() else 0
    return sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file() and not entry.is_symlink())


def file_sha256(path: Path) -> str:
    with open(path, "rb") as source:
        return hashlib.file_digest(source, "sha256").hexdigest()


def read_json(path: Path) -> Any:
    with open(path) as source:
        return json.load(source)
