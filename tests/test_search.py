"""Random search (docs/search.md, "Searching beyond a grid"): trials drawn from (seed, trial index) alone, run
ids that are the runs' parameters, replicates per trial, and the whole lifecycle for every trial."""

from __future__ import annotations

import copy
import json
import math
import re

import pandas as pd
import pytest
import yaml
from conftest import (
    REPO,
    jobs_run,
    jobs_started,
    recipe,
    run_workflow,
    same_results,
    validated,
    workflow_config,
    write_config,
    write_recipe_data,
)
from scratchflow.classification import TRAINER_CHECKPOINT_MARKER
from scratchflow.grid import build_run_table
from scratchflow.halving import TIE_BREAK, promoted, validation_name
from scratchflow.search import SearchError, check_halving, check_space, expand_search, trial
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
    plan = Plan.from_config(config, TRAINER_CHECKPOINT_MARKER)
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


@pytest.mark.parametrize(
    ("search", "refused"),
    [
        ({"kind": "random", "rungs": [1, 2]}, "search.rungs: only a halving search has rungs, and kind is 'random'"),
        ({"kind": "halving", "keep": 0.5}, "search.rungs: a halving search needs rungs"),
        ({"kind": "halving", "rungs": [3, 1], "keep": 0.5}, "search.rungs: [3, 1]: each rung must train to more"),
        ({"kind": "halving", "rungs": [1, 3], "keep": 0.5, "space": SPACE}, "search.space.epochs: a halving search"),
    ],
)
def test_a_halving_search_it_cannot_run_is_refused_naming_the_key(search, refused):
    with pytest.raises(SearchError, match=f"^{re.escape(refused)}"):
        check_halving({"space": {"learning_rate": SPACE["learning_rate"]}, **search})


def test_a_halving_search_trains_its_runs_to_the_last_rung_and_refuses_packed_runs():
    from scratchflow.config import ConfigError

    space = {"learning_rate": SPACE["learning_rate"]}
    config = search_config(kind="halving", rungs=[1, 3, 9], keep=0.34, space=space)
    assert {params["epochs"] for params in build_run_table(config).values()} == {9}
    config = search_config(kind="halving", rungs=[1, 3], keep=0.5, space=space)
    config["cluster"] = {"pack_runs": 4}
    with pytest.raises(ConfigError, match=r"config key cluster\.pack_runs: a halving search"):
        validated(config)


@pytest.mark.parametrize(
    ("values", "keep", "goal", "expected"),
    [
        ({"a": 0.5, "b": 0.9, "c": 0.7, "d": 0.1}, 0.5, "max", ["b", "c"]),
        ({"a": 0.5, "b": 0.9, "c": 0.7, "d": 0.1}, 0.5, "min", ["d", "a"]),
        ({"a": 0.5, "b": 0.9, "c": 0.7}, 0.34, "max", ["b"]),
        ({"a": 0.5, "b": 0.9}, 0.1, "max", ["b"]),  # at least one goes on
        ({"a": 0.5, "b": 0.5, "c": 0.5}, 0.34, "max", ["a"]),  # ties without losses: the search's order
    ],
)
def test_a_rung_sends_on_the_best_share_of_its_settings(values, keep, goal, expected):
    settings = {run_id: [run_id] for run_id in values}
    assert promoted(settings, values, keep, goal)[0] == expected


def test_a_tie_goes_to_the_lower_validation_loss_then_the_earlier_trial():
    """Every trial at the same macro-F1: the one with the best validation loss was stopped, since
    ties kept the trials' order silently."""
    settings = {"a": ["a"], "b": ["b"], "c": ["c"], "d": ["d"]}
    values = dict.fromkeys(settings, 0.25)
    losses = {"a": 1.2, "b": 0.8, "c": 0.9, "d": 0.8}
    runs, ranking = promoted(settings, values, 0.5, "max", losses)
    assert runs == ["b", "d"] and [entry["runs"] for entry in ranking] == [["b"], ["d"], ["c"], ["a"]]
    assert [entry["loss"] for entry in ranking] == [0.8, 0.8, 0.9, 1.2]
    assert promoted(settings, {**values, "a": 0.3}, 0.25, "max", losses)[0] == ["a"], "the metric first"


@pytest.mark.parametrize(
    ("metric", "validation", "name"),
    [
        ("macro_f1", {"macro_f1": 0.9, "loss": 0.3}, "macro_f1"),
        ("test_loss", {"accuracy": 0.9, "loss": 0.3}, "loss"),  # the command recipe's test_loss
        ("test_loss", {"test_loss": 0.2, "loss": 0.3}, "test_loss"),
        ("bleu", {"loss": 0.3}, None),
    ],
)
def test_a_rung_ranks_by_the_validation_metric_of_the_test_metrics_name(metric, validation, name):
    assert validation_name(metric, validation) == name


def test_a_rung_ranks_a_setting_by_the_mean_of_its_seeds():
    settings = {"x": ["x0", "x1"], "y": ["y0", "y1"]}
    values = {"x0": 0.9, "x1": 0.1, "y0": 0.6, "y1": 0.6}  # x has the best run, y the best mean
    runs, ranking = promoted(settings, values, 0.5, "max")
    assert runs == ["y0", "y1"] and [entry["value"] for entry in ranking] == [0.6, 0.5]


def test_a_search_larger_than_max_runs_is_refused_before_it_is_drawn():
    from scratchflow.config import ConfigError, check_run_count

    config = search_config(trials=60_000, seeds=[0, 1])
    with pytest.raises(ConfigError, match=r"config key search: 120,000 runs \(trials \(60000\) x seeds \(2\)\)"):
        check_run_count(config)


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
    # The trial's parameters, the same in both its runs: in each run's params.json, not in the tables.
    assert not {"learning_rate", "batch_size"} & {*runs.columns, *summary.columns}
    params = pd.DataFrame([json.loads(path.read_text()) for path in tmp_path.glob("results/runs/*/params.json")])
    space = config["search"]["space"]
    assert params["learning_rate"].between(*space["learning_rate"]["log_uniform"]).all()
    assert set(params["batch_size"]) <= set(space["batch_size"]["choice"])
    assert not math.isnan(summary["accuracy_mean"].max())

    # One more trial: Snakemake plans its two seeds' runs alone, the first trial's are done.
    config["search"]["trials"] = 2
    write_config(tmp_path, config)
    planned = jobs_run(run_workflow(tmp_path, "-n").stdout)
    assert planned["train"] == planned["predict"] == 2 and planned["aggregate"] == 1


@pytest.mark.slow
def test_a_halving_search_goes_on_with_the_best_and_its_last_rung_ends_as_a_direct_run(
    uninterrupted_halving_search, tmp_path, bbc_subset, tiny_model
):
    """config/tests/halving-search.yaml on the tests' data with the tiny model (conftest.halving_search):
    2 trials to 10 epochs, the better of them by validation macro-F1 on to 20, resumed from its own
    checkpoint; it ends with the weights, test metrics and predictions of the same configuration
    trained to 20 epochs directly."""
    search_dir = uninterrupted_halving_search
    ran = jobs_started((search_dir / "workflow.out").read_text())
    assert (ran["train_rung"], ran["promote"], ran["train"], ran["predict"]) == (2, 1, 1, 1)

    results = search_dir / "results"
    decision = json.loads((results / "search" / "rung-0.json").read_text())
    values = decision["values"]
    assert len(values) == 2 and decision["epochs"] == 10 and decision["metric"] == "macro_f1"
    assert decision["ties"] == TIE_BREAK and all("loss" in entry for entry in decision["ranking"])
    (promoted,) = decision["promoted"]
    assert values[promoted] == max(values.values()), "the better by validation macro-F1 goes on"
    rungs = pd.read_csv(results / "search" / "rungs.tsv", sep="\t")
    assert dict(zip(rungs["run_id"], rungs["rung"], strict=True)) == {run: int(run == promoted) for run in values}
    assert rungs.loc[rungs["run_id"] == promoted, "validation_macro_f1_at_20_epochs"].notna().all()
    # What each run cost, the one stopped at rung 0 too; the one that went on, more (its 20 epochs).
    cost = dict(zip(rungs["run_id"], rungs["cpu_hours"], strict=True))
    (stopped,) = set(values) - {promoted}
    assert 0 < cost[stopped] < cost[promoted]
    assert "Rung 0: no Slurm accounting" in (results / "summary.html").read_text()
    runs = pd.read_csv(results / "runs.tsv", sep="\t")
    assert list(runs["run_id"]) == [promoted] and runs["validation_macro_f1_at_10_epochs"].tolist() == [
        values[promoted]
    ]
    assert (results / "search" / "rungs.png").stat().st_size > 0
    assert not any((search_dir / "checkpoints" / run_id).exists() for run_id in values), "released when done"

    config = yaml.safe_load((search_dir / "config" / "config.yaml").read_text())
    params = json.loads((results / "runs" / promoted / "params.json").read_text())
    direct = {**config, "cluster": {"scratch_root": str(tmp_path / "scratch")}}
    del direct["search"]
    direct["training"] = params
    direct["grid"] = {"seed": [params["seed"]]}
    write_config(tmp_path, direct)
    write_recipe_data(tmp_path, bbc_subset)
    run_workflow(tmp_path)
    assert [path.name for path in (tmp_path / "results" / "runs").iterdir()] == [promoted], "the same run id"
    assert same_results(search_dir, tmp_path) == [], "weights, test metrics and predictions, byte for byte"
    run_workflow(search_dir, "--report", str(tmp_path / "report.html"))
    assert "results/search/rungs.png" in (tmp_path / "report.html").read_text(), "the report shows the rungs"


def test_a_run_that_diverged_in_a_rung_is_its_worst_whatever_the_goal_and_named_in_the_decision(tmp_path):
    from scratchflow.halving import promote_job

    for goal, values in (("max", {"a": 0.2, "b": 0.9, "c": 0.5}), ("min", {"a": 0.9, "b": 0.1, "c": 0.5})):
        records = []
        for run_id, value in values.items():
            record = {"run_id": run_id, "params": {"learning_rate": 1.0}, "validation": {"accuracy": value}}
            if run_id == "b":  # the best value, but its training diverged
                record.update(validation={}, divergence={"cause": "diverged at step 7: …", "piece": 1, "step": 7})
            records.append(tmp_path / f"{goal}-{run_id}.json")
            records[-1].write_text(json.dumps(record))
        decision = tmp_path / f"{goal}-decision.json"
        settings = {run_id: [run_id] for run_id in values}
        promote_job(
            rung=0, epochs=1, records=records, settings=settings, metric="accuracy", goal=goal, keep=0.67,
            decision_out=decision,
        )  # fmt: skip
        decided = json.loads(decision.read_text())
        assert decided["promoted"] == ["a", "c"] and list(decided["diverged"]) == ["b"], "b ranked last"
        assert decided["ranking"][-1] == {"runs": ["b"], "value": None, "promoted": False}
