"""The run table: a hyperparameter grid (or search, scratchflow.search) expanded into runs with stable ids."""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any

from scratchflow.search import expand_search

RUN_ID_LENGTH = 10
# The task of a config without `task:` (config.schema.yaml's default), left out of a run's identity:
# runs from before there were tasks keep their ids.
DEFAULT_TASK = "text-classification"

# Dataset settings that change what a run trains and is tested on. The dataset's path is left out on
# purpose: moving the data must not rename every run.
DATASET_IDENTITY_KEYS = (
    "name",
    "format",
    "text_column",
    "label_column",
    "test_fraction",
    "validation_fraction",
    "split_seed",
)


def run_identity(
    params: dict[str, Any], dataset: dict[str, Any], model_name: str | None, task: str = DEFAULT_TASK
) -> dict[str, Any]:
    """Everything that determines a run's result, in the form that is hashed into its id. Keys that
    came later (the task, fixed splits, a target column) appear only when used, so earlier runs keep
    their ids."""
    dataset_identity = {key: dataset[key] for key in DATASET_IDENTITY_KEYS}
    if dataset.get("splits"):
        # Which splits the data has, not where they lie: moving the files must not rename runs.
        dataset_identity["splits"] = sorted(dataset["splits"])
    if dataset.get("target_column"):
        # Another target, or a split at random instead of by label: another run.
        dataset_identity["target_column"] = dataset["target_column"]
    identity = {"dataset": dataset_identity, "model": model_name, "training": dict(sorted(params.items()))}
    if task != DEFAULT_TASK:
        identity["task"] = task
    return identity


def _same_number_same_text(value: Any) -> Any:
    """2 and 2.0 (or 0 and 0.0) are the same setting, so they must hash the same."""
    if isinstance(value, dict):
        return {key: _same_number_same_text(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_same_number_same_text(item) for item in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def run_id_for(identity: dict[str, Any]) -> str:
    """A short id that depends only on the run's identity, never on its position in the grid."""
    canonical = json.dumps(_same_number_same_text(identity), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:RUN_ID_LENGTH]


def expand_grid(defaults: dict[str, Any], grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The cartesian product of the grid's lists, each point completed with the defaults.

    A key in the grid overrides the default of the same name, so moving a value from the defaults
    into the grid (or back) leaves the run, and so its id, unchanged.
    """
    keys = sorted(grid)
    points = itertools.product(*(grid[key] for key in keys))
    return [{**defaults, **dict(zip(keys, values, strict=True))} for values in points]


def build_run_table(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """run_id -> that run's complete training parameters, for a validated config: every point of its
    grid, or every trial of its search (trials that draw the same parameters are one run)."""
    runs: dict[str, dict[str, Any]] = {}
    model_name = config["model"]["name"] if config.get("model") else None
    if "search" in config:
        points = expand_search(config["training"], config["search"])
    else:
        points = expand_grid(config["training"], config["grid"])
    for params in points:
        identity = run_identity(params, config["dataset"], model_name, config.get("task", DEFAULT_TASK))
        runs[run_id_for(identity)] = params
    return runs
