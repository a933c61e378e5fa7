"""Searches: `search:` instead of `grid:`, trials drawn from a space of the task's training keys.

Trial i of a search with seed s is drawn by a generator seeded with (s, i) alone, so the same config
draws the same runs, and more trials keep the first ones (and their run ids: a run's id is its
parameters, as for a grid). Each trial runs once per training seed in `seeds` (replicates).

Successive halving (`kind: halving`) trains every trial to the first rung's epochs, then only the
best `keep` of the settings by validation metric on to the next rung, resuming from their own
checkpoints, and so on. A run's identity is its configuration trained to the last rung (its epochs,
so its learning-rate schedule, are the last rung's), whatever rung it reaches: a run that reaches the
last rung is the run a grid of the same configuration trains, with the same id and weights.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

# Drawn numbers keep this many significant digits: readable in tables, and no loss for a search.
SIGNIFICANT_DIGITS = 4
# The parameter whose values are replicates of one setting, not settings of their own (a grid's seed
# list, a search's seeds); never a dimension of a search's space.
REPLICATE_KEY = "seed"
HALVING = "halving"
# The training key a halving search's rungs set: a budget in epochs.
BUDGET_KEY = "epochs"


class SearchError(ValueError):
    """The search's space or settings cannot be drawn from; the message names the key."""


def check_space(space: dict[str, dict[str, Any]], training: dict[str, Any]) -> None:
    """Refuse what cannot be drawn, naming the key: a key the task does not take (`training`: the
    task's schema fragment), the seed, bounds out of order, a log-uniform bound <= 0, an int-uniform
    bound that is not an integer, a distribution that draws values the key does not take (decimals
    for an integer key; a bound or choice outside what the key allows)."""
    import jsonschema

    properties = training.get("properties", {})
    others = training.get("additionalProperties", False)
    for key, distribution in sorted(space.items()):
        name = f"search.space.{key}"
        if key == REPLICATE_KEY:
            raise SearchError(f"{name}: seeds are replicates, not a dimension to search: list them in search.seeds")
        item = properties.get(key, others)
        if item is False:
            raise SearchError(f"{name}: not a training key of this task; it takes: {', '.join(sorted(properties))}")
        item = item if isinstance(item, dict) else {}
        (kind, values), *_ = distribution.items()
        for value in values:  # the choices, or the range's bounds
            problem = next(iter(jsonschema.Draft202012Validator(item).iter_errors(value)), None)
            if problem is not None:
                raise SearchError(f"{name}: {kind} {values}: {problem.message}")
        if kind == "choice":
            continue
        if kind == "uniform" and item.get("type") == "integer":
            raise SearchError(f"{name}: {key} takes integers, and uniform draws decimals: use int_uniform or choice")
        low, high = values
        if not low < high:
            raise SearchError(f"{name}: {kind} [{low}, {high}]: the lower bound must be below the upper")
        if kind == "log_uniform" and low <= 0:
            raise SearchError(f"{name}: log_uniform [{low}, {high}]: both bounds must be above 0")
        if kind == "int_uniform" and not all(float(bound).is_integer() for bound in values):
            raise SearchError(f"{name}: int_uniform [{low}, {high}]: both bounds must be integers")


def draw(distribution: dict[str, Any], generator: random.Random) -> Any:
    (kind, values), *_ = distribution.items()
    if kind == "choice":
        return generator.choice(values)
    low, high = values
    if kind == "int_uniform":
        return generator.randint(int(low), int(high))
    if kind == "log_uniform":
        return _rounded(math.exp(generator.uniform(math.log(low), math.log(high))))
    return _rounded(generator.uniform(low, high))


def _rounded(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def trial(space: dict[str, dict[str, Any]], seed: int, index: int) -> dict[str, Any]:
    """The parameters of trial `index`: from (seed, index) alone, one draw per key in name order."""
    generator = random.Random(f"scratchflow-search/{seed}/{index}")
    return {key: draw(space[key], generator) for key in sorted(space)}


def check_halving(search: dict[str, Any]) -> None:
    """Refuse rungs and keep outside a halving search, and in one: missing, or rungs that do not
    increase, or epochs in the space (the rungs set them)."""
    if search["kind"] != HALVING:
        for key in ("rungs", "keep"):
            if key in search:
                raise SearchError(f"search.{key}: only a halving search has {key}, and kind is {search['kind']!r}")
        return
    for key in ("rungs", "keep"):
        if key not in search:
            raise SearchError(f"search.{key}: a halving search needs rungs (epochs, increasing) and keep (a share)")
    rungs = search["rungs"]
    if any(later <= earlier for earlier, later in itertools.pairwise(rungs)):
        raise SearchError(f"search.rungs: {rungs}: each rung must train to more epochs than the one before")
    if BUDGET_KEY in search["space"]:
        raise SearchError(
            f"search.space.{BUDGET_KEY}: a halving search trains its runs to the last rung's epochs "
            f"(search.rungs: {rungs}); remove {BUDGET_KEY} from the space"
        )


def expand_search(defaults: dict[str, Any], search: dict[str, Any]) -> list[dict[str, Any]]:
    """Every trial, once per seed of `search.seeds` (once with the training seed without it),
    completed with the defaults, trial by trial; a halving search's runs train to its last rung."""
    replicates = [{REPLICATE_KEY: seed} for seed in search["seeds"]] if search.get("seeds") else [{}]
    budget = {BUDGET_KEY: search["rungs"][-1]} if search.get("kind") == HALVING else {}
    return [
        {**defaults, **trial(search["space"], search["seed"], index), **budget, **replicate}
        for index in range(search["trials"])
        for replicate in replicates
    ]


def search_size(search: dict[str, Any]) -> int:
    """The runs of a search, before trials that draw the same parameters are merged."""
    return search["trials"] * max(1, len(search.get("seeds") or []))


def swept_keys(config: dict[str, Any]) -> list[str]:
    """The training keys the runs vary: the grid's, or the search space's and the seed with seeds."""
    if "grid" in config:
        return sorted(config["grid"])
    search = config.get("search", {})
    return sorted({*search.get("space", {}), *([REPLICATE_KEY] if search.get("seeds") else [])})


def swept_values(config: dict[str, Any], key: str) -> list[Any]:
    """The values the runs give `key` that a config lists (a grid's, a search's choices); [] for none."""
    if "grid" in config:
        return list(config["grid"].get(key, []))
    return list(config.get("search", {}).get("space", {}).get(key, {}).get("choice", []))
