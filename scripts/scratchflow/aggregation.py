"""Comparing the runs of a grid: one table, the best run, one picture, on any metric the task reports."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from scratchflow.files import read_json, written_whole

# A plot stays readable up to about this many bars; larger grids show their best runs.
MOST_RUNS_PLOTTED = 40
GOALS = ("max", "min")


class UnknownMetric(ValueError):
    """The metric to compare runs by is reported by no run."""


def numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """The flat numeric entries of a metrics file (per-class tables and matrices left out)."""
    return {
        name: value
        for name, value in metrics.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    }


def summarize(runs: dict[str, dict[str, Path]]) -> pd.DataFrame:
    """One row per run: its id, its parameters, and every flat numeric test metric it reports.

    `runs` maps run_id -> {"params": params.json, "metrics": metrics.json}. Metric columns come after
    the parameters; `summary.attrs["metrics"]` names them.
    """
    rows, metric_names = [], {}
    for run_id, files in runs.items():
        params = read_json(files["params"])
        metrics = numbers(read_json(files["metrics"]))
        metric_names.update(dict.fromkeys(metrics))
        rows.append({"run_id": run_id, **{key: _cell(value) for key, value in params.items()}, **metrics})
    summary = pd.DataFrame(rows)
    summary = summary[[column for column in summary.columns if column not in metric_names] + list(metric_names)]
    summary.attrs["metrics"] = list(metric_names)
    return summary


def _cell(value: Any) -> Any:
    """A parameter as one table cell (a command's argv becomes one string)."""
    return " ".join(map(str, value)) if isinstance(value, list) else value


def best_run(summary: pd.DataFrame, metric: str, goal: str = "max") -> dict[str, Any]:
    """The row with the highest (goal max) or lowest (min) `metric`; ties go to the run listed first."""
    if metric not in summary.attrs.get("metrics", summary.columns) or summary[metric].isna().all():
        raise UnknownMetric(
            f"aggregate.metric {metric!r}: no run reports it; the runs report: "
            + ", ".join(summary.attrs.get("metrics", []))
        )
    values = summary[metric]
    best = summary.loc[values.idxmax() if goal == "max" else values.idxmin()]
    return {"run_id": best["run_id"], "metric": metric, "goal": goal, "value": float(best[metric])}


def varying_columns(summary: pd.DataFrame) -> list[str]:
    """The parameters that differ between runs: the grid's axes, as far as the table shows them."""
    metrics = summary.attrs.get("metrics", [])
    parameters = [column for column in summary.columns if column not in ("run_id", *metrics)]
    return [column for column in parameters if summary[column].astype(str).nunique() > 1]


def plot_comparison(summary: pd.DataFrame, metric: str, goal: str, path: Path) -> None:
    """A horizontal bar per run, labelled with the parameters that vary, best run highlighted."""
    import matplotlib

    matplotlib.use("Agg")  # no display on cluster nodes
    import matplotlib.pyplot as plt

    best_id = best_run(summary, metric, goal)["run_id"]
    chosen = summary.nlargest if goal == "max" else summary.nsmallest
    ordered = chosen(MOST_RUNS_PLOTTED, metric).sort_values(metric, ascending=goal == "max")
    axes_names = varying_columns(summary)
    labels = [
        f"{row['run_id']}  " + ", ".join(f"{name}={row[name]}" for name in axes_names) for _, row in ordered.iterrows()
    ]
    colours = ["tab:orange" if run_id == best_id else "tab:blue" for run_id in ordered["run_id"]]
    figure, axes = plt.subplots(figsize=(9, 1.2 + 0.45 * len(ordered)))
    axes.barh(labels, ordered[metric], color=colours)
    for position, value in enumerate(ordered[metric]):
        axes.text(value, position, f" {value:.3f}", va="center")
    axes.set_xlabel(f"test {metric} ({'higher' if goal == 'max' else 'lower'} is better)")
    top = float(ordered[metric].max())
    axes.set_xlim(min(0.0, float(ordered[metric].min())), 1.08 if 0 < top <= 1 else top * 1.15 or 1)
    shown = f"best {len(ordered)} of {len(summary)}" if len(ordered) < len(summary) else str(len(summary))
    axes.set_title(f"{shown} runs; best run {best_id} in orange")
    figure.tight_layout()
    with written_whole(path) as partial:
        figure.savefig(partial, dpi=110, format="png")
    plt.close(figure)
