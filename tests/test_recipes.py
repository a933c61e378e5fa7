"""Every config shape the docs show is a file in config/tests/ that they show verbatim,
and every one of them plans (`snakemake -n`, on the tests' small data); the tests named in each
file's header run it."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml
from conftest import RECIPES, REPO, docs_text, run_workflow, write_recipe_data

RECIPE_FILES = sorted(path.name for path in RECIPES.glob("*.yaml"))
PROFILE_SWITCHES = sorted(path.name for path in (RECIPES / "profiles").glob("*.yaml"))
# Recipes that need a cluster profile (packing is refused where jobs run on this machine).
PROFILE = {"packed-runs.yaml": "edinburgh"}


def documented_blocks() -> dict[str, str]:
    """The docs' YAML blocks that name a recipe on their first line, by the recipe's file name."""
    blocks = re.findall(r"```yaml\n(.*?)```", docs_text(), re.DOTALL)
    named = {}
    for block in blocks:
        first = re.match(r"# config/tests/([\w.-]+\.yaml)", block)
        if first:
            named[first.group(1)] = block
    return named


def test_the_docs_show_every_recipe_as_its_file_holds_it():
    shown = documented_blocks()
    assert sorted(shown) == RECIPE_FILES, "every recipe in the docs, and every recipe the docs show a file"
    for name, block in shown.items():
        assert block == (RECIPES / name).read_text(), f"the docs' {name} differs from config/tests/{name}"


@pytest.fixture(scope="module")
def recipe_workdir(tmp_path_factory, bbc_subset, animal_images, tiny_resnet) -> Path:
    workdir = tmp_path_factory.mktemp("recipes")
    write_recipe_data(workdir, bbc_subset, animal_images, tiny_resnet)
    return workdir


@pytest.mark.parametrize("name", RECIPE_FILES)
def test_every_recipe_plans(name, recipe_workdir):
    config = recipe_workdir / "config" / "config.yaml"
    config.parent.mkdir(exist_ok=True)
    config.write_text((RECIPES / name).read_text())
    arguments = ["--profile", str(REPO / "profiles" / PROFILE[name])] if name in PROFILE else []
    planned = run_workflow(recipe_workdir, "-n", *arguments)
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", planned.stdout.split("Job stats:", 1)[1], re.MULTILINE))
    written = yaml.safe_load(config.read_text())
    if "search" in written:
        runs = written["search"]["trials"] * len(written["search"].get("seeds", [0]))
    else:
        runs = math.prod(len(values) for values in written["grid"].values())
    if written.get("search", {}).get("kind") == "halving":
        # Its first rung and its decisions, planned; each decision plans the next rung's jobs
        # (tests/test_search.py runs it).
        decisions = len(written["search"]["rungs"]) - 1
        assert int(jobs["train_rung"]) == runs and int(jobs["promote"]) == decisions and "train" not in jobs
    else:
        assert int(jobs["train"]) == int(jobs["predict"]) == runs


def test_the_docs_name_every_profile_switch_and_each_they_name_is_a_file_the_tests_plan():
    named = re.findall(r"\((?:\.\./)?config/tests/profiles/([\w.-]+\.yaml)\)", docs_text())
    assert sorted(set(named)) == PROFILE_SWITCHES


def test_the_docs_show_narvals_several_node_switch_as_its_file_holds_it():
    text = (RECIPES / "profiles" / "narval-several-nodes.yaml").read_text()
    assert f"```yaml\n{text}```" in docs_text()


def test_the_documented_several_node_form_is_oscers_profile():
    """The generic several-node train entry (docs/clusters.md, "Several nodes") is what OSCER's
    profile, which the tests run on two nodes, has."""
    section = (REPO / "docs" / "clusters.md").read_text().split("## Several nodes", 1)[1]
    shown = yaml.safe_load(re.search(r"```yaml\n(  train:\n.*?)```", section, re.DOTALL).group(1))["train"]
    oscer = yaml.safe_load((REPO / "profiles" / "oscer" / "config.v8+.yaml").read_text())["set-resources"]["train"]
    assert shown == {key: oscer[key] for key in shown}
