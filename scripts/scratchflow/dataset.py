"""Reading a labelled text dataset in any of the supported layouts, and splitting it reproducibly."""

from __future__ import annotations

import hashlib
import importlib.util
import random
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

PACKAGE_PREFIX = "package:"
TABLE_SEPARATORS = {"csv": ",", "tsv": "\t"}
FORMATS = ("folder", "csv", "tsv", "jsonl")
SPLITS = ("train", "validation", "test")


class DatasetError(ValueError):
    """The dataset on disk does not match what the config says about it."""


@dataclass(frozen=True)
class Example:
    id: str
    text: str
    label: str


def resolve_location(location: str) -> Path:
    """A filesystem path, or 'package:NAME/sub/path' for data shipped inside an installed package.

    The package is located without importing it: some data packages print or do work on import.
    """
    if not location.startswith(PACKAGE_PREFIX):
        return Path(location).expanduser()
    package, _, inner = location[len(PACKAGE_PREFIX) :].partition("/")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError(f"{location!r}: no installed Python package named {package!r}")
    return Path(next(iter(spec.submodule_search_locations))) / inner


def list_files(path: Path) -> list[Path]:
    """The files that make up a dataset: the file itself, or every non-hidden file below a folder."""
    if path.is_file():
        return [path]
    return sorted(
        file
        for file in path.rglob("*")
        if file.is_file() and not any(part.startswith(".") for part in file.relative_to(path).parts)
    )


def fingerprint(path: Path) -> str:
    """A cheap digest of the names, sizes and modification times of a dataset's files.

    Used as a rule parameter, it makes Snakemake rebuild the archive when any file changes, without
    listing thousands of files as inputs.
    """
    digest = hashlib.sha256()
    for file in list_files(path):
        status = file.stat()
        name = file.name if file == path else file.relative_to(path).as_posix()
        digest.update(f"{name}\0{status.st_size}\0{status.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def load_examples(path: Path, fmt: str, text_column: str, label_column: str) -> list[Example]:
    """Every labelled example of the dataset at `path`, in a stable order."""
    if fmt == "folder":
        return _load_folder(path)
    if fmt in TABLE_SEPARATORS:
        table = pd.read_csv(path, sep=TABLE_SEPARATORS[fmt], dtype=str, keep_default_na=False)
    elif fmt == "jsonl":
        table = pd.read_json(path, lines=True, dtype=False)
    else:
        raise DatasetError(f"unknown dataset format {fmt!r}; expected one of {', '.join(FORMATS)}")
    missing = [column for column in (text_column, label_column) if column not in table.columns]
    if missing:
        raise DatasetError(f"{path}: no column {' or '.join(map(repr, missing))}; it has {list(table.columns)}")
    return [
        Example(id=str(row_number), text=str(text), label=str(label))
        for row_number, (text, label) in enumerate(zip(table[text_column], table[label_column], strict=True))
    ]


def _load_folder(root: Path) -> list[Example]:
    """One sub-folder per label, one file per example (undecodable bytes are replaced, not fatal)."""
    if not root.is_dir():
        raise DatasetError(f"{root}: a 'folder' dataset must be a directory with one sub-folder per label")
    examples = [
        Example(
            id=file.relative_to(root).as_posix(),
            text=file.read_text(encoding="utf-8", errors="replace"),
            label=file.relative_to(root).parts[0],
        )
        for file in list_files(root)
        if len(file.relative_to(root).parts) > 1
    ]
    if not examples:
        raise DatasetError(f"{root}: no files inside label sub-folders")
    return examples


def split_examples(
    examples: list[Example], test_fraction: float, validation_fraction: float, seed: int
) -> dict[str, list[Example]]:
    """A stratified train/validation/test split that depends only on the examples and the seed."""
    by_label: dict[str, list[Example]] = {}
    for example in sorted(examples, key=lambda example: example.id):
        by_label.setdefault(example.label, []).append(example)
    splits: dict[str, list[Example]] = {name: [] for name in SPLITS}
    for label, members in sorted(by_label.items()):
        random.Random(f"{seed}/{label}").shuffle(members)
        n_test = round(len(members) * test_fraction)
        n_validation = round(len(members) * validation_fraction)
        splits["test"] += members[:n_test]
        splits["validation"] += members[n_test : n_test + n_validation]
        splits["train"] += members[n_test + n_validation :]
    for name in SPLITS:
        splits[name].sort(key=lambda example: example.id)
    if not splits["train"] or not splits["test"]:
        raise DatasetError(
            f"{len(examples)} examples are too few for test_fraction={test_fraction}, "
            f"validation_fraction={validation_fraction}: the train or test split is empty"
        )
    return splits


def check_examples(examples: list[Example], dataset: dict) -> None:
    """What training needs of the data: text and a label in every example, two labels or more, and
    enough examples for the configured split. Raises DatasetError naming the config key."""

    def rows(found: list[Example]) -> str:
        shown = ", ".join(example.id for example in found[:5])
        return f"{len(found)} example(s) ({shown}{', ...' if len(found) > 5 else ''})"

    without_text = [example for example in examples if not example.text.strip()]
    if without_text:
        raise DatasetError(
            f"dataset.text_column {dataset['text_column']!r}: {rows(without_text)} have no text; "
            "remove them or fill them in"
        )
    without_label = [example for example in examples if not example.label.strip()]
    if without_label:
        raise DatasetError(f"dataset.label_column {dataset['label_column']!r}: {rows(without_label)} have no label")
    labels = label_names(examples)
    if len(labels) < 2:
        raise DatasetError(
            f"dataset.label_column {dataset['label_column']!r}: one label only ({labels}); need two or more"
        )
    try:
        split_examples(examples, dataset["test_fraction"], dataset["validation_fraction"], dataset["split_seed"])
    except DatasetError as error:
        raise DatasetError(f"dataset.test_fraction/validation_fraction: {error}") from None


def label_names(examples: list[Example]) -> list[str]:
    """The labels in a fixed order, which fixes the model's label ids."""
    return sorted({example.label for example in examples})
