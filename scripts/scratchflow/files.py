"""Files on shared storage that appear whole or not at all: written under a hidden partial name,
then renamed into place. A partial left by a killed writer carries its owner's tag
('<name>.partial@<host>@<pid>'), so that a later process can tell it from live work."""

from __future__ import annotations

import contextlib
import json
import os
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
def written_whole(path: Path) -> Iterator[Path]:
    """Yield a hidden partial name to write `path` under; rename it into place only if the writing
    succeeds. Readers see the old file or the whole new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial{OWNER_TAG}")
    try:
        yield partial
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, path)


def write_json_atomically(data: Any, path: Path, sort_keys: bool = True) -> None:
    with written_whole(path) as partial, open(partial, "w") as out:
        json.dump(data, out, indent=2, sort_keys=sort_keys)
        out.write("\n")
        out.flush()
        os.fsync(out.fileno())


def read_json(path: Path) -> Any:
    with open(path) as source:
        return json.load(source)
