"""The docs a newcomer walks: a short README with a table of contents, and no reference that leads
nowhere. Every relative link names a file (and a heading) that exists, and every `FILE, "Heading"` or
`see "Heading"` anywhere in the repository (docs, config comments, error messages) names a heading of
that file."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import DOCS, REPO

PAGES = [*DOCS, *(REPO / folder / "README.md" for folder in ("config", "benchmarks", "config/tests"))]
# A file named in prose, as a path or as the text of a link to it, then the heading's title in quotes
# (several joined by "and"); what wraps inside a comment is joined again.
FILE_REFERENCE = re.compile(
    r"(?<![\w/.-])(docs/[\w-]+\.md|benchmarks/README\.md|config/README\.md|README(?:\.md)?)\]?(?:\([^)\s]*\))?"
    r"[,:]?\s+((?:\\?\"[^\"\\]+\\?\"(?:\s+and\s+)?)+)"
)
SAME_FILE_REFERENCE = re.compile(r"(?:\bsee \"([^\"]+)\")|(?:\"([^\"]+)\" (?:above|below)\b)")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def headings(page: Path) -> list[str]:
    """The titles of a markdown page's headings, outside its code blocks."""
    titles, in_code = [], False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (match := re.match(r"#{1,6} (.+)", line)):
            titles.append(match.group(1).strip())
    return titles


def names_of(title: str) -> set[str]:
    """What a reference may call a heading: its title, or the title without its number ("5. ") or
    its closing parenthesis ("(2026-11-24)", "(goal: …)")."""
    bare = re.sub(r"^\d+\. ", "", title)
    return {title, bare, re.sub(r" \([^)]*\)$", "", title), re.sub(r" \([^)]*\)$", "", bare)}


def anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def repository_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, text=True
    ).stdout.split()
    return [REPO / name for name in listed if Path(name).suffix in {".md", ".py", ".yaml", ".smk", ".txt", ".sh", ""}]


def joined(text: str) -> str:
    """A quoted title wrapped over lines, in prose or in a comment, as one line."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)


def target_of(name: str) -> Path:
    return REPO / ("README.md" if name == "README" else name)


def test_the_readme_is_short_and_opens_with_its_contents():
    readme = REPO / "README.md"
    lines = readme.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move the detail into docs/"
    contents = readme.read_text().split("## Contents", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"\]\(#([\w-]+)\)", contents)
    own = {anchor(title) for title in headings(readme)}
    assert set(listed) == own - {"scratchflow", "contents"}, "the contents list every section, and only those"


def test_the_readme_leads_to_every_page_of_the_docs():
    readme = (REPO / "README.md").read_text()
    for page in (REPO / "docs").glob("*.md"):
        assert f"](docs/{page.name})" in readme, f"the README does not lead to docs/{page.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_names_a_file_and_heading_that_exist(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.relative_to(REPO)} links to {target}, which does not exist"
        if fragment:
            anchors = {anchor(title) for title in headings(linked)}
            where = path or "itself"
            assert fragment in anchors, f"{page.relative_to(REPO)} links to #{fragment}, no heading of {where}"


def test_every_reference_to_a_section_names_a_heading_of_its_file():
    broken = []
    for source in repository_files():
        try:
            text = source.read_text()
        except (UnicodeDecodeError, IsADirectoryError):
            continue
        for match in FILE_REFERENCE.finditer(text):
            target = target_of(match.group(1))
            titles = set().union(*(names_of(title) for title in headings(target))) if target.exists() else set()
            for quoted in re.findall(r"\\?\"([^\"\\]+)\\?\"", match.group(2)):
                if joined(quoted) not in titles:
                    broken.append(f'{source.relative_to(REPO)}: {match.group(1)}, "{joined(quoted)}"')
        if source.suffix == ".md":
            titles = set().union(*(names_of(title) for title in headings(source)))
            for match in SAME_FILE_REFERENCE.finditer(text):
                quoted = joined(match.group(1) or match.group(2))
                if quoted not in titles:
                    broken.append(f'{source.relative_to(REPO)}: see "{quoted}"')
    assert not broken, "references to no heading:\n" + "\n".join(broken)


def test_the_version_is_the_newest_release_or_the_next_ones_dev0_and_the_licence_is_there():
    """A release is a version bump with its CHANGELOG entry in one commit; between releases the
    version is the next one's .dev0 and CHANGELOG.md has an Unreleased section (CHANGELOG.md's rule),
    so that a run trained between releases never records the last release's number."""
    from packaging.version import Version
    from scratchflow import __version__
    from scratchflow.releases import changelog_releases

    changelog = (REPO / "CHANGELOG.md").read_text()
    newest = changelog_releases(REPO)[0]
    if "\n## Unreleased\n" in changelog:
        assert Version(__version__).is_devrelease and Version(__version__) > Version(newest), __version__
    else:
        assert __version__ == newest, "the newest section of CHANGELOG.md is the version's"
    assert "MIT License" in (REPO / "LICENSE").read_text()
