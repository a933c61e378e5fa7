"""Random search (README, "Searching beyond a grid"): trials drawn from (seed, trial index) alone, run
ids that are the runs' parameters, replicates per trial, and the whole lifecycle for every trial."""

from __future__ import annotations

import copy
import math
import re

import pandas as pd
import pytest
import yaml
from conftest import REPO, jobs_run, recipe, run_workflow, validated, workflow_config, write_config, write_recipe_data
from scratchflow.grid import build_run_table
from scratchflow.search import SearchError, check_space, expand_search, trial
from scratchflow.tasks import training_schema

SPACE = {
    "learning_rate": {"log_uniform": [1.0e-5, 1.0e-3]},
    "batch_size": {"choice": [16, 32]},
    "warmup_ratio": {"uniform": [0.0, 0.2]},
    "epochs": {"int_uniform": [1, 3]},
}


def search_config(**search) -> dict:
    """The demo's config with a random search in place of its grid, validated (defaults filled in)."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    del config["grid"]
    config["search"] = {"kind": "random", "trials": 5, "space": SPACE, **search}
    validated(config)
    return config


def test_the_same_config_draws_the_same_runs_and_more_trials_keep_the_first_ones():
    runs = build_run_table(search_config(trials=5))
    assert runs == build_run_table(search_config(trials=5))
    more = build_run_table(search_config(trials=8))
    assert list(more)[:5] == list(runs) and len(more) == 8
    assert all(more[run_id] == params for run_id, params in runs.items())
    assert set(build_run_table(search_config(trials=5, seed=1))).isdisjoint(runs), "another seed, other trials"


def test_a_trial_is_the_run_that_a_grid_of_its_values_is():
    """A run's id is its parameters, however it came to be planned."""
    config = search_config(trials=1)
    ((run_id, params),) = build_run_table(config).items()
    grid = copy.deepcopy(config)
    del grid["search"]
    grid["grid"] = {key: [params[key]] for key in SPACE}
    assert list(build_run_table(grid)) == [run_id]


def test_each_trial_runs_once_per_seed_as_replicates_of_one_setting():
    from scratchflow.plan import Plan

    config = search_config(trials=3, seeds=[0, 1, 2])
    plan = Plan.from_config(config, "trainer_state.json")
    assert len(plan.runs) == 9
    settings = plan.settings()
    assert len(settings) == 3
    for index, run_ids in enumerate(settings.values()):
        assert [plan.runs[run_id]["seed"] for run_id in run_ids] == [0, 1, 2]
        drawn = trial(SPACE, 0, index)
        assert all(plan.runs[run_id][key] == value for run_id in run_ids for key, value in drawn.items())


def test_draws_stay_in_their_space_and_spread_over_it():
    points = expand_search({"seed": 0}, {"trials": 400, "seed": 3, "space": SPACE})
    rates = [point["learning_rate"] for point in points]
    assert all(1.0e-5 <= rate <= 1.0e-3 for rate in rates)
    # Log-uniform: as many below the geometric middle (1e-4) as above.
    assert 0.4 < sum(rate < 1.0e-4 for rate in rates) / len(rates) < 0.6
    assert {point["batch_size"] for point in points} == {16, 32}
    assert {point["epochs"] for point in points} == {1, 2, 3}
    assert all(isinstance(point["epochs"], int) for point in points)
    assert all(0.0 <= point["warmup_ratio"] <= 0.2 for point in points)
    # Four significant digits: readable in the tables.
    assert all(float(f"{rate:.4g}") == rate for rate in rates)
    assert all(point["seed"] == 0 for point in points), "the training seed, without search.seeds"


@pytest.mark.parametrize(
    ("space", "refused"),
    [
        ({"learning_rat": {"uniform": [0.1, 0.2]}}, "search.space.learning_rat: not a training key of this task"),
        ({"seed": {"choice": [0, 1]}}, "search.space.seed: seeds are replicates"),
        ({"learning_rate": {"log_uniform": [-1, 1]}}, "search.space.learning_rate: log_uniform [-1, 1]: -1 is less"),
        (
            {"weight_decay": {"log_uniform": [0, 1]}},
            "search.space.weight_decay: log_uniform [0, 1]: both bounds must be above 0",
        ),
        (
            {"weight_decay": {"uniform": [0.2, 0.1]}},
            "search.space.weight_decay: uniform [0.2, 0.1]: the lower bound must be below the upper",
        ),
        (
            {"weight_decay": {"int_uniform": [0, 2.5]}},
            "search.space.weight_decay: int_uniform [0, 2.5]: both bounds must be integers",
        ),
        (
            {"epochs": {"int_uniform": [1, 2.5]}},
            "search.space.epochs: int_uniform [1, 2.5]: 2.5 is not of type 'integer'",
        ),
        ({"epochs": {"uniform": [1, 3]}}, "search.space.epochs: epochs takes integers, and uniform draws decimals"),
        ({"batch_size": {"choice": [16, 0]}}, "search.space.batch_size: choice [16, 0]: 0 is less than the minimum"),
    ],
)
def test_a_space_that_cannot_be_drawn_is_refused_naming_the_key(space, refused):
    with pytest.raises(SearchError, match=f"^{re.escape(refused)}"):
        check_space(space, training_schema("text-classification"))


def test_a_search_larger_than_max_runs_is_refused_before_it_is_drawn():
    from scratchflow.config import ConfigError, check_grid_size

    config = search_config(trials=60_000, seeds=[0, 1])
    with pytest.raises(ConfigError, match=r"config key search: 120,000 runs \(trials \(60000\) x seeds \(2\)\)"):
        check_grid_size(config)


@pytest.mark.slow
def test_a_random_search_trains_every_trial_and_more_trials_plan_only_the_new_ones(tmp_path, bbc_subset, tiny_model):
    """config/tests/random-search.yaml on the tests' data, with the tiny model and fewer trials."""
    write_recipe_data(tmp_path, bbc_subset)
    config = {**workflow_config(bbc_subset, tiny_model, tmp_path / "scratch"), **recipe("random-search.yaml")}
    del config["grid"]
    config["model"] = {"name": "tiny-bert", "source": str(tiny_model)}
    config["training"] = {"max_length": 32, "epochs": 1}
    config["search"]["trials"] = 1
    write_config(tmp_path, config)
    first = run_workflow(tmp_path)
    assert jobs_run(first.stdout)["train"] == 2
    runs = pd.read_csv(tmp_path / "results" / "runs.tsv", sep="\t")
    summary = pd.read_csv(tmp_path / "results" / "summary.tsv", sep="\t")
    assert sorted(runs["seed"]) == [0, 1]
    assert len(summary) == 1 and list(summary["runs"]) == [2], "the trial's two seeds are replicates"
    space = config["search"]["space"]
    assert runs["learning_rate"].between(*space["learning_rate"]["log_uniform"]).all()
    assert set(runs["batch_size"]) <= set(space["batch_size"]["choice"])
    assert not math.isnan(summary["accuracy_mean"].max())

    # One more trial: Snakemake plans its two seeds' runs alone, the first trial's are done.
    config["search"]["trials"] = 2
    write_config(tmp_path, config)
    planned = jobs_run(run_workflow(tmp_path, "-n").stdout)
    assert planned["train"] == planned["predict"] == 2 and planned["aggregate"] == 1
