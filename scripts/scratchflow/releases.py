"""scratchflow's releases. A release is the commit that sets `__version__` in
`scripts/scratchflow/__init__.py` to it and adds its section to CHANGELOG.md; the repository tags it
`v<version>` (`scripts/tag_releases.py` finds and tags every release). Between releases,
`__version__` is the next release's `.dev0` (PEP 440), so that a run trained between releases never
records the last release's number.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

VERSION_FILE = "scripts/scratchflow/__init__.py"
RELEASE_HEADING = re.compile(r"^## (\d+\.\d+\.\d+) \(\d{4}-\d{2}-\d{2}\)$", re.MULTILINE)
TAG_PATTERN = "v[0-9]*"


class ReleaseError(RuntimeError):
    """A release that CHANGELOG.md names and the history does not hold."""


def git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True).stdout


def changelog_releases(folder: Path) -> list[str]:
    """The releases CHANGELOG.md in `folder` names, newest first."""
    return RELEASE_HEADING.findall((folder / "CHANGELOG.md").read_text())


def release_commit(folder: Path, version: str) -> str:
    """The commit of `folder`'s history that set `__version__` to `version`."""
    line = f'__version__ = "{version}"'
    # -S: the commits that change how often the line occurs; the oldest of them added it.
    commits = git(folder, "log", "--reverse", "--format=%H", "-S", line, "--", VERSION_FILE).split()
    if not commits:
        raise ReleaseError(f"CHANGELOG.md names release {version}, and no commit set {line} in {VERSION_FILE}")
    return commits[0]


def tag_releases(folder: Path) -> dict[str, str]:
    """Tag every release CHANGELOG.md names at its commit, as the repository tags them: {tag: commit}.
    A tag already there is left as it is (a release is never moved)."""
    tags = set(git(folder, "tag", "--list", TAG_PATTERN).split())
    tagged = {}
    for version in changelog_releases(folder):
        tag, commit = f"v{version}", release_commit(folder, version)
        if tag not in tags:
            git(folder, "tag", tag, commit)
        tagged[tag] = commit
    return tagged


def release_of(folder: Path) -> str | None:
    """The newest release tag that the checkout in `folder` is, or descends from; None where it has no
    release tags (a clone without its tags, a fork that never fetched them)."""
    try:
        return git(folder, "describe", "--tags", "--abbrev=0", "--match", TAG_PATTERN, "HEAD").strip()
    except subprocess.CalledProcessError:
        return None
