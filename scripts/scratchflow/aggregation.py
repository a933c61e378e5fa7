"""Comparing the runs of a grid: one table, the best run, one picture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from scratchflow.staging import read_json, written_whole

SUMMARY_METRICS = ("accuracy", "macro_f1")
# A plot stays readable up to about this many bars; larger grids show their best runs.
MOST_RUNS_PLOTTED = 40


def summarize(runs: dict[str, dict[str, Path]]) -> pd.DataFrame:
    """One row per run: its id, its parameters, and its headline test metrics.

    `runs` maps run_id -> {"params": params.json, "metrics": metrics.json}.
    """
    rows = []
    for run_id, files in runs.items():
        params = read_json(files["params"])
        metrics = read_json(files["metrics"])
        rows.append({"run_id": run_id, **params, **{name: metrics[name] for name in SUMMARY_METRICS}})
    return pd.DataFrame(rows)


def best_run(summary: pd.DataFrame, metric: str) -> dict[str, Any]:
    """The row with the highest `metric`; ties go to the run listed first."""
    best = summary.loc[summary[metric].idxmax()]
    return {"run_id": best["run_id"], "metric": metric, "value": float(best[metric])}


def varying_columns(summary: pd.DataFrame) -> list[str]:
    """The parameters that differ between runs: the grid's axes, as far as the table shows them."""
    parameters = [column for column in summary.columns if column not in ("run_id", *SUMMARY_METRICS)]
    return [column for column in parameters if summary[column].astype(str).nunique() > 1]


def plot_comparison(summary: pd.DataFrame, metric: str, path: Path) -> None:
    """A horizontal bar per run, labelled with the parameters that vary, best run highlighted."""
    import matplotlib

    matplotlib.use("Agg")  # no display on cluster nodes
    import matplotlib.pyplot as plt

    ordered = summary.nlargest(MOST_RUNS_PLOTTED, metric).sort_values(metric)
    axes_names = varying_columns(summary)
    labels = [
        f"{row['run_id']}  " + ", ".join(f"{name}={row[name]}" for name in axes_names) for _, row in ordered.iterrows()
    ]
    best_id = best_run(summary, metric)["run_id"]
    colours = ["tab:orange" if run_id == best_id else "tab:blue" for run_id in ordered["run_id"]]
    figure, axes = plt.subplots(figsize=(9, 1.2 + 0.45 * len(ordered)))
    axes.barh(labels, ordered[metric], color=colours)
    for position, value in enumerate(ordered[metric]):
        axes.text(value, position, f" {value:.3f}", va="center")
    axes.set_xlabel(f"test {metric}")
    axes.set_xlim(0, 1.08)
    shown = f"best {len(ordered)} of {len(summary)}" if len(ordered) < len(summary) else str(len(summary))
    axes.set_title(f"{shown} runs; best run {best_id} in orange")
    figure.tight_layout()
    with written_whole(path) as partial:
        figure.savefig(partial, dpi=110, format="png")
    plt.close(figure)
