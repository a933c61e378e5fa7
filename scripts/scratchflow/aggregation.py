"""Comparing the runs of a grid on any metric the task reports: runs that differ only in their seed are
replicates of one setting, compared by their mean and spread; the best setting and the best run."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from scratchflow.accounting import Cost
from scratchflow.failures import unfinished_line
from scratchflow.figures import pyplot, save_png
from scratchflow.files import read_json
from scratchflow.plan import REPLICATE_KEY
from scratchflow.provenance import SHORT, TRAINED_BY, trained_by
from scratchflow.tasks import numbers

# A plot stays readable up to about this many bars; larger grids show their best settings.
MOST_SETTINGS_PLOTTED = 40


class UnknownMetric(ValueError):
    """The metric to compare runs by is reported by no run."""


class NothingToCompare(RuntimeError):
    """Every run of the grid failed in a way a retry cannot fix, or diverged: nothing to compare."""

    traceback_says_nothing = True  # its message says it all (scratchflow.jobs.job_context)

    def __init__(self, unfinished: dict[str, tuple[str, dict[str, Any]]]) -> None:
        lines = [unfinished_line(run_id, outcome, said) for run_id, (outcome, said) in unfinished.items()]
        super().__init__(
            "no run finished, none to compare; fix what failed (or change what diverged), then run the same "
            "command: it trains the failed runs again.\n  " + "\n  ".join(lines)
        )


def with_unfinished_runs(
    table: pd.DataFrame, unfinished: dict[str, tuple[str, dict[str, Any]]], params: dict[str, dict[str, Any]]
) -> pd.DataFrame:
    """The runs' table with `outcome` (finished, diverged, failed) and `detail`, and the runs that
    did not finish after those that did, ranked last: their parameters, no metrics, and in `detail`
    why (the cause, where in the lab's code, the piece and the step)."""
    finished = table.assign(outcome="finished", detail="")
    rows = [
        {
            "run_id": run_id,
            **{key: cell(value) for key, value in params[run_id].items()},
            "outcome": outcome,
            "detail": unfinished_line(run_id, outcome, said).removeprefix(f"run {run_id} {outcome}").lstrip(": "),
        }
        for run_id, (outcome, said) in unfinished.items()
    ]
    return pd.concat([finished, pd.DataFrame(rows)], ignore_index=True) if rows else finished


def summarize(runs: dict[str, dict[str, Path]]) -> pd.DataFrame:
    """One row per run: its id, its parameters, and every flat numeric test metric it reports.

    `runs` maps run_id -> {"params": params.json, "metrics": metrics.json}. Metric columns come after
    the parameters; `table.attrs["metrics"]` names them.
    """
    rows, metric_names = [], {}
    for run_id, files in runs.items():
        params = read_json(files["params"])
        metrics = numbers(read_json(files["metrics"]))
        metric_names.update(dict.fromkeys(metrics))
        rows.append({"run_id": run_id, **{key: cell(value) for key, value in params.items()}, **metrics})
    table = pd.DataFrame(rows)
    table = table[[column for column in table.columns if column not in metric_names] + list(metric_names)]
    table.attrs["metrics"] = list(metric_names)
    return table


def ranked_first(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """`runs` (summarize) with `metric`, the one the runs are ranked by, its first metric column, the
    other metrics after it in their order: every table of the comparison leads with it."""
    metrics = [metric, *(name for name in runs.attrs["metrics"] if name != metric)]
    ranked = runs[[column for column in runs.columns if column not in metrics] + metrics]
    ranked.attrs["metrics"] = metrics
    return ranked


def cell(value: Any) -> Any:
    """A parameter as one table cell (a command's argv becomes one string, a mapping its JSON)."""
    if isinstance(value, list):
        return " ".join(map(str, value))
    return json.dumps(value, sort_keys=True) if isinstance(value, dict) else value


def parameter_columns(runs: pd.DataFrame) -> list[str]:
    """The runs' training parameters (the seed too): every column of summarize's table but the id
    and the metrics."""
    metrics = runs.attrs.get("metrics", [])
    return [column for column in runs.columns if column not in ("run_id", *metrics)]


def setting_columns(runs: pd.DataFrame) -> list[str]:
    """The parameters that make a setting: all but the seed, whose runs are replicates."""
    return [column for column in parameter_columns(runs) if column != REPLICATE_KEY]


def by_setting(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per setting (runs that differ only in their seed): its parameters, how many runs it
    has and which, and per metric the mean, standard deviation (empty for one run) and count."""
    metrics = runs.attrs["metrics"]
    keys = setting_columns(runs)
    grouped = runs.groupby(keys, dropna=False, sort=False) if keys else runs.groupby(lambda _: 0, sort=False)
    statistics = grouped[metrics].agg(["mean", "std", "count"])
    statistics.columns = [f"{metric}_{statistic}" for metric, statistic in statistics.columns]
    settings = grouped["run_id"].agg(run_ids=lambda ids: " ".join(ids), runs="count")
    table = pd.concat([settings, statistics], axis=1).reset_index(drop=not keys)
    table.attrs["metrics"] = metrics
    return table


def run_costs(by_run: dict[str, Cost]) -> pd.DataFrame:
    """One row per run: its id and what it cost (scratchflow.accounting.COLUMNS; empty where the
    site does not record a figure)."""
    return pd.DataFrame([{"run_id": run_id, **cost.as_row()} for run_id, cost in by_run.items()])


def setting_costs(settings: pd.DataFrame, by_run: dict[str, Cost]) -> pd.DataFrame:
    """One row per setting (by its run_ids): what its runs cost together."""
    rows = []
    for run_ids in settings["run_ids"]:
        summed = sum((by_run[run_id] for run_id in run_ids.split()), Cost())
        rows.append({"run_ids": run_ids, **summed.as_row()})
    return pd.DataFrame(rows)


def trained_by_table(records: dict[str, dict[str, Any]], verified: Mapping[str, str] | None = None) -> pd.DataFrame:
    """One row per run (its record's id): what trained it, in a column `trained_by_<what>` for each
    of scratchflow, python, torch, transformers and code (the sha256 of the task's code, its first
    characters) in which the runs differ, and `verified` (the days `make verify` found that what
    trained a run otherwise reproduces its results: `verified`, provenance.verified_runs) where any
    run is; only `run_id` where none of these."""
    facts = {run_id: trained_by(record) or {} for run_id, record in records.items()}
    names = {name: f"trained_by_{TRAINED_BY.get(name, name).lower()}" for name in (*TRAINED_BY, "code")}
    differing = [name for name in names if len({fact.get(name) for fact in facts.values()}) > 1]
    verified = verified or {}
    rows = [
        {
            "run_id": run_id,
            **{names[name]: _shown(name, fact.get(name)) for name in differing},
            **({"verified": verified.get(run_id)} if verified else {}),
        }
        for run_id, fact in facts.items()
    ]
    columns = ["run_id", *(names[name] for name in differing), *(["verified"] if verified else [])]
    return pd.DataFrame(rows, columns=columns)


def _shown(name: str, value: str | None) -> str | None:
    if name == "code" and value is not None and len(value) == 64:  # a sha256
        return value[:SHORT]
    return value


def setting_trained_by(settings: pd.DataFrame, by_run: pd.DataFrame) -> pd.DataFrame:
    """One row per setting (by its run_ids): each column of `by_run` (trained_by_table) as the
    distinct values of its runs, joined by ", "."""
    columns = [column for column in by_run.columns if column != "run_id"]
    values = by_run.set_index("run_id")
    rows = [
        {
            "run_ids": run_ids,
            **{column: ", ".join(dict.fromkeys(map(str, values.loc[run_ids.split(), column]))) for column in columns},
        }
        for run_ids in settings["run_ids"]
    ]
    return pd.DataFrame(rows, columns=["run_ids", *columns])


def check_metric(runs: pd.DataFrame, metric: str) -> None:
    if metric not in runs.attrs.get("metrics", runs.columns) or runs[metric].isna().all():
        raise UnknownMetric(
            f"aggregate.metric {metric!r}: no run reports it; the runs report: "
            + ", ".join(runs.attrs.get("metrics", []))
        )


def best(runs: pd.DataFrame, settings: pd.DataFrame, metric: str, goal: str = "max") -> dict[str, Any]:
    """The best setting by its mean `metric` (highest for goal max, lowest for min) and, named
    beside it, the best single run; ties go to the one listed first."""
    check_metric(runs, metric)
    mean = settings[f"{metric}_mean"]
    setting = settings.iloc[mean.argmax() if goal == "max" else mean.argmin()]
    run = runs.iloc[runs[metric].argmax() if goal == "max" else runs[metric].argmin()]
    return {
        "metric": metric,
        "goal": goal,
        "setting": {
            "parameters": {name: plain(setting[name]) for name in setting_columns(runs)},
            "mean": float(setting[f"{metric}_mean"]),
            "std": plain(setting[f"{metric}_std"]),
            "runs": int(setting["runs"]),
            "run_ids": setting["run_ids"].split(),
        },
        "run": {"run_id": run["run_id"], "value": float(run[metric])},
    }


def plain(value: Any) -> Any:
    """A table cell as JSON: numpy scalars as Python numbers, NaN (no value) as null."""
    if hasattr(value, "item"):
        value = value.item()
    return None if isinstance(value, float) and math.isnan(value) else value


def varying_columns(table: pd.DataFrame, columns: list[str]) -> list[str]:
    """Those of `columns` that differ between rows: the grid's axes, as far as the table shows them."""
    return [column for column in columns if table[column].astype(str).nunique() > 1]


def constant_parameters(runs: pd.DataFrame, parameters: list[str]) -> list[str]:
    """Those of `parameters` with the same value in every run of `runs`: the tables leave them out
    (they tell no run from another; each run's params.json and record.json keep them)."""
    varying = varying_columns(runs, parameters)
    return [column for column in parameters if column not in varying]


def comparison_axis(
    runs: pd.DataFrame, settings: pd.DataFrame, metric: str, goal: str
) -> tuple[str, tuple[float, float]]:
    """The comparison's axis: its label (the metric as the runs report it on the test split; what a
    bar shows: one run, or the mean and spread of a setting's seeds) and its limits (from zero, or
    the lowest value, to a little past the longest bar or dot, with room for the bar's figure)."""
    name = metric if metric.startswith("test") else f"test {metric}"
    replicated = bool((settings["runs"] > 1).any())
    shown = "mean ± std over each setting's seeds, a dot per run" if replicated else "one run per setting"
    label = f"{name}: {shown} ({'higher' if goal == 'max' else 'lower'} is better)"
    spread = (settings[f"{metric}_mean"] + settings[f"{metric}_std"].fillna(0)).max()
    top = max(float(runs[metric].max()), float(spread))
    bottom = min(0.0, float(runs[metric].min()))
    return label, (bottom, top * 1.15 if top > 0 else 1.0)


def plot_comparison(runs: pd.DataFrame, settings: pd.DataFrame, metric: str, goal: str, path: Path) -> None:
    """A horizontal bar per setting at its mean, a line for its standard deviation and a dot per
    run, labelled with the parameters that vary; the best setting in orange."""
    plt = pyplot()

    winner = best(runs, settings, metric, goal)["setting"]["run_ids"]
    mean = f"{metric}_mean"
    chosen = settings.nlargest if goal == "max" else settings.nsmallest
    ordered = chosen(MOST_SETTINGS_PLOTTED, mean).sort_values(mean, ascending=goal == "max")
    axes_names = varying_columns(settings, setting_columns(runs))
    labels = [
        ", ".join(f"{name}={row[name]}" for name in axes_names) + f"  ({row['runs']} run{'s' * (row['runs'] > 1)})"
        for _, row in ordered.iterrows()
    ]
    colours = ["tab:orange" if row["run_ids"].split() == winner else "tab:blue" for _, row in ordered.iterrows()]
    figure, axes = plt.subplots(figsize=(9, 1.2 + 0.45 * len(ordered)))
    axes.barh(
        labels,
        ordered[mean],
        color=colours,
        alpha=0.6,
        xerr=ordered[f"{metric}_std"].fillna(0),
        capsize=3,
        ecolor="dimgray",
    )
    values = runs.set_index("run_id")[metric]
    for position, (_, row) in enumerate(ordered.iterrows()):
        replicates = values[row["run_ids"].split()]
        axes.scatter(replicates, [position] * len(replicates), color="tab:red", s=14, zorder=3)
        axes.text(row[mean], position + 0.3, f" {row[mean]:.3f}", va="center", fontsize="small")
    label, limits = comparison_axis(runs, ordered, metric, goal)
    axes.set_xlabel(label)
    axes.set_xlim(*limits)
    shown = f"best {len(ordered)} of {len(settings)}" if len(ordered) < len(settings) else str(len(settings))
    axes.set_title(f"{shown} settings, {len(runs)} runs; best setting in orange")
    figure.tight_layout()
    save_png(figure, path, dpi=110)
