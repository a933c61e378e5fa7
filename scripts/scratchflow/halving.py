"""Successive halving (`search: {kind: halving}`, rules/search.smk), in one place: a rung's job
records the run's validation metrics at the rung's epochs (`Rung`, `rung_record`); after each
rung but the last, the decision ranks the settings by them and names the runs that go on
(`promote_job`, `promoted`); the comparison adds every run's rungs as a table and a figure
(`rung_table`, `plot_rungs`). What a search is and how its trials are drawn: scratchflow.search.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scratchflow.failures import FinalFailure
from scratchflow.figures import pyplot, save_png
from scratchflow.files import read_json, write_json_atomically
from scratchflow.ledger import PieceRecord

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rung:
    """A rung of a halving search, as a run's job there sees it: its index (0 first), the epochs it
    trains the run to, and the run's record of the rung (results/runs/<run>/rung-<r>.json)."""

    index: int
    budget_epochs: int  # the run's epochs done at the rung's end
    record_out: Path


# How a rung orders settings of equal value (recorded in each decision).
TIE_BREAK = "equal values: the lower mean validation loss goes first, then the earlier trial"


def promoted(
    settings: dict[str, list[str]],
    values: dict[str, float],
    keep: float,
    goal: str,
    losses: dict[str, float] | None = None,
) -> tuple[list[str], list[dict[str, Any]]]:
    """The runs that go on to the next rung: the best `keep` share of the settings (at least one),
    ranked by the mean of their runs' validation `values` (`goal`: max or min); ties go by TIE_BREAK
    (`losses`: the runs' validation losses, where they report one). Also each setting's ranking
    entry, best first."""
    losses = losses or {}
    ranking = []
    for run_ids in settings.values():
        entry: dict[str, Any] = {"runs": run_ids, "value": sum(values[run_id] for run_id in run_ids) / len(run_ids)}
        if all(run_id in losses for run_id in run_ids):
            entry["loss"] = sum(losses[run_id] for run_id in run_ids) / len(run_ids)
        ranking.append(entry)

    def order(entry: dict[str, Any]) -> tuple[float, float]:
        return (-entry["value"] if goal == "max" else entry["value"]), entry.get("loss", math.inf)

    ranking.sort(key=order)  # stable: the earlier trial goes first among equals
    kept = max(1, math.floor(len(ranking) * keep + 1e-9))
    for place, entry in enumerate(ranking):
        entry["promoted"] = place < kept
    return [run_id for entry in ranking[:kept] for run_id in entry["runs"]], ranking


def validation_name(metric: str, validation: dict[str, float]) -> str | None:
    """The name of `metric` (a test metric, aggregate.metric) among a run's validation metrics: the
    same, or without its `test_` prefix (test_loss -> loss); None if it has neither."""
    return next((name for name in (metric, metric.removeprefix("test_")) if name in validation), None)


def last_validation(record: dict[str, Any], metric: str) -> float | None:
    """A run's validation `metric` at the end of its training (its record.json), if it reported one."""
    validation = record["training"].get("validation", {})
    name = validation_name(metric, validation)
    return validation[name] if name else None


@dataclass(frozen=True)
class RungRecord:
    """A run's record of a rung (results/runs/<run>/rung-<r>.json)."""

    run_id: str
    rung: int
    epochs: int
    params: dict[str, Any]  # the run's training parameters
    global_steps: int | None
    validation: dict[str, float]  # at the end of the rung's epochs: what the rung's decision ranks
    pieces: list[PieceRecord]  # the run's pieces so far, as record.json lists them
    timings_seconds: dict[str, float]  # this rung's piece's phases
    # Where its training diverged in the rung (cause, piece, step): the rung's worst, no validation.
    divergence: dict[str, Any] | None = None


def rung_record(
    run_id: str, params: dict[str, Any], rung: Rung, training: dict[str, Any], pieces: list[PieceRecord]
) -> RungRecord:
    """The run's record of the rung (for `rung.record_out`), as its last piece ends."""
    if not training.get("validation"):
        raise ValueError(
            f"rung {rung.index} of run {run_id}: the training reported no validation metrics, and a "
            "halving search ranks the runs by them (a command program writes validation.json: docs/search.md)"
        )
    return RungRecord(
        *(run_id, rung.index, rung.budget_epochs, params, training.get("global_steps"), training["validation"], pieces),
        timings_seconds=pieces[-1].timings_seconds,
    )


def diverged_rung_record(
    run_id: str, params: dict[str, Any], rung: Rung, ended: FinalFailure, pieces: list[PieceRecord]
) -> RungRecord:
    """The run's record of a rung in which its training diverged: no validation, and the worst of
    the rung whatever the metric (`promote_job`)."""
    return RungRecord(
        *(run_id, rung.index, rung.budget_epochs, params, ended.step, {}, pieces),
        timings_seconds=pieces[-1].timings_seconds,
        divergence={"cause": ended.cause, "piece": pieces[-1].piece, "step": ended.step},
    )


def promote_job(
    *,
    rung: int,
    epochs: int,
    records: list[Path],
    settings: dict[str, list[str]],
    metric: str,
    goal: str,
    keep: float,
    decision_out: Path,
) -> None:
    """After a rung: rank its settings (`settings`: the whole search's) by the mean validation
    `metric` of their runs in the rung, and name the runs of the best `keep` share, which go on to
    the next rung (the others stop here). A run that diverged in the rung ranks as the worst value
    there is (its setting's mean with it), and is named in the decision's `diverged`."""
    values, losses, params, diverged = {}, {}, {}, {}
    for path in records:
        record = read_json(path)
        run_id, validation = record["run_id"], record["validation"]
        params[run_id] = record["params"]
        if record.get("divergence"):
            diverged[run_id] = record["divergence"]
            continue
        name = validation_name(metric, validation)
        if name is None:
            raise ValueError(
                f"rung {rung}: run {run_id} has no validation {metric!r} (it has: {', '.join(sorted(validation))}); "
                "aggregate.metric names the metric a halving search ranks by"
            )
        values[run_id] = validation[name]
        if "loss" in validation:
            losses[run_id] = validation["loss"]
    worst = math.inf if goal == "min" else -math.inf
    ranked = {**values, **dict.fromkeys(diverged, worst)}
    in_rung = {label: [run_id for run_id in run_ids if run_id in ranked] for label, run_ids in settings.items()}
    in_rung = {label: ids for label, ids in in_rung.items() if ids}
    going_on, ranking = promoted(in_rung, ranked, keep, goal, losses)
    for entry in ranking:  # JSON has no infinity: a setting with a diverged run has no mean
        entry["value"] = entry["value"] if math.isfinite(entry["value"]) else None
    promoted_runs = [run_id for run_id in ranked if run_id in going_on]  # in the search's order
    decision = {
        "rung": rung,
        "epochs": epochs,
        "metric": metric,
        "goal": goal,
        "keep": keep,
        "ties": TIE_BREAK,
        "values": values,
        "ranking": ranking,
        "params": params,
        "promoted": promoted_runs,
        "diverged": diverged,
    }
    write_json_atomically(decision, decision_out, sort_keys=False)
    log.info(
        "rung %d (%d epoch(s)): %d of %d setting(s) go on by validation %s (%s): %s",
        *(rung, epochs, sum(entry["promoted"] for entry in ranking), len(ranking), metric, goal),
        ", ".join(promoted_runs),
    )


def rung_table(decisions: list[dict[str, Any]], last_epochs: int, last_values: dict[str, float]) -> pd.DataFrame:
    """One row per run of a halving search: its parameters, the last rung it reached (0 for the
    first) and the epochs it trained to there, and its validation metric at every rung it trained (after the
    decisions' rungs, the last rung's: `last_values`, at `last_epochs`); the furthest first."""
    # Here, not at the top: every train job imports this module (its Rung), and trains without pandas.
    import pandas as pd

    from scratchflow.aggregation import cell

    metric = decisions[0]["metric"]
    rows: dict[str, dict[str, Any]] = {}
    budgets = [(decision["rung"], decision["epochs"], decision["values"]) for decision in decisions]
    budgets.append((len(decisions), last_epochs, last_values))
    for rung, epochs, values in budgets:
        for run_id, value in values.items():
            row = rows.setdefault(
                run_id,
                {"run_id": run_id, **{key: cell(item) for key, item in decisions[0]["params"][run_id].items()}},
            )
            row.update({"rung": rung, "epochs_trained": epochs, f"validation_{metric}_at_{epochs}_epochs": value})
    table = pd.DataFrame(list(rows.values()))
    last = [column for column in table.columns if column.startswith("validation_")][::-1]
    ascending = [False] + [decisions[0]["goal"] == "min"] * len(last)
    return table.sort_values(["rung", *last], ascending=ascending, na_position="last").reset_index(drop=True)


def plot_rungs(table: pd.DataFrame, metric: str, goal: str, path: Path) -> None:
    """The validation metric against the epochs trained, a line per run across the rungs it
    reached; the runs of the last rung drawn bold, in colour."""
    plt = pyplot()
    columns = [column for column in table.columns if column.startswith(f"validation_{metric}_at_")]
    epochs = [int(column.split("_at_")[1].split("_")[0]) for column in columns]
    last_rung = table["rung"].max()
    figure, axes = plt.subplots(figsize=(8, 5))
    for _, row in table.iloc[::-1].iterrows():  # the furthest drawn last, on top
        reached = row["rung"] == last_rung
        axes.plot(
            epochs[: row["rung"] + 1],
            [row[column] for column in columns[: row["rung"] + 1]],
            marker="o",
            color=None if reached else "lightgray",
            linewidth=2.5 if reached else 1,
            label=row["run_id"] if reached else None,
            zorder=3 if reached else 2,
        )
    axes.set_xticks(epochs)
    axes.set_xlabel("epochs trained (the rungs)")
    axes.set_ylabel(f"validation {metric} ({'higher' if goal == 'max' else 'lower'} is better)")
    finished = int((table["rung"] == last_rung).sum())
    axes.set_title(f"successive halving: {len(table)} runs; the {finished} of the last rung in colour")
    axes.legend(title="last rung", fontsize="small")
    figure.tight_layout()
    save_png(figure, path, dpi=110)
