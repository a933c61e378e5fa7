"""What Snakemake's report (`snakemake --report`) shows besides the figures: the grid's tables as one
self-contained HTML page that sorts by any column in the browser, with the best run's figures (its
confusion matrix where it reports one, and its task's own) and the provenance of the runs (and, where
they were trained by other code or packages, which and how to train them again)."""

from __future__ import annotations

import base64
import html
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from scratchflow.accounting import GridCost, described
from scratchflow.failures import DIVERGED, unfinished_line, unfinished_runs
from scratchflow.figures import pyplot, save_png
from scratchflow.files import written_whole
from scratchflow.ledger import SUPERSEDED
from scratchflow.plan import BEST_CONFUSION_MATRIX
from scratchflow.provenance import SHORT, difference_lines
from scratchflow.search import HALVING

# Sorting on a click of a column's head (again: the other way); empty cells last.
SORT_SCRIPT = """
document.querySelectorAll("table.sortable").forEach((table) => {
  table.querySelectorAll("th").forEach((head, column) => head.addEventListener("click", () => {
    const ascending = head.getAttribute("aria-sort") !== "ascending";
    table.querySelectorAll("th").forEach((other) => other.removeAttribute("aria-sort"));
    head.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    const key = (row) => {
      const cell = row.cells[column];
      const text = cell.dataset.value ?? cell.textContent;
      return text === "" ? null : (isNaN(Number(text)) ? text : Number(text));
    };
    const body = table.tBodies[0];
    [...body.rows].sort((a, b) => {
      const x = key(a), y = key(b);
      if (x === null || y === null) return (x === null) - (y === null);
      const order = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
      return ascending ? order : -order;
    }).forEach((row) => body.appendChild(row));
  }));
});
"""

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin-bottom: 2em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th { background: #f0f0f0; cursor: pointer; white-space: nowrap; }
th[aria-sort="ascending"]::after { content: " \\25B2"; }
th[aria-sort="descending"]::after { content: " \\25BC"; }
td.text { text-align: left; font-family: monospace; }
tr.best { background: #fff1e0; }
#trained-by { border-left: 4px solid #d97706; padding-left: 0.8em; }
figure { display: inline-block; margin: 0 1.5em 1.5em 0; vertical-align: top; }
figure img { max-width: 100%; }
figcaption { font-family: monospace; }
"""
# What a figure's name alone does not say.
FIGURE_NOTES = {Path(BEST_CONFUSION_MATRIX).stem: "the test confusion matrix; rows: true label, columns: predicted"}


def _cell(value: Any) -> str:
    """A table cell: numbers keep their full value for sorting and show 4 significant decimals."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return '<td data-value=""></td>'
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f'<td class="text">{html.escape(str(value))}</td>'
    shown = f"{value:.4g}" if isinstance(value, float) and not value.is_integer() else str(value)
    return f'<td data-value="{value!r}">{html.escape(shown)}</td>'


def _table(frame: pd.DataFrame, table_id: str, best: set[str], best_column: str) -> str:
    head = "".join(f"<th>{html.escape(str(column))}</th>" for column in frame.columns)
    rows = []
    for record in frame.to_dict("records"):
        marked = ' class="best"' if record.get(best_column) in best else ""
        rows.append(f"<tr{marked}>" + "".join(_cell(record[column]) for column in frame.columns) + "</tr>")
    body = "".join(rows)
    return f'<table id="{table_id}" class="sortable"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def provenance(records: list[dict[str, Any]]) -> dict[str, str]:
    """Where and with what the runs were trained, from their records: each value with its count."""

    def counted(values: list[Any]) -> str:
        counts = Counter(values)
        return ", ".join(
            f"{value} ({count} run{'s' * (count > 1)})" if len(counts) > 1 else str(value)
            for value, count in counts.items()
        )

    def commit(git: dict[str, Any]) -> str:
        return (git["commit"] or "not a git checkout") + (" (uncommitted changes)" if git["dirty"] else "")

    environments = [record["environment"] for record in records]
    facts = {
        "scratchflow": counted(
            [f"{env.get('scratchflow_version', 'before 0.1.0')}, commit {commit(env['git'])}" for env in environments]
        ),
        "pipeline commit": counted(
            [commit(env["pipeline_git"]) if "pipeline_git" in env else "not recorded" for env in environments]
        ),
        "data sha256": counted([record["data"]["sha256"] for record in records]),
        "task": counted([record["task"] for record in records]),
        "task code": counted([task_code(record) for record in records]),
        "cluster": counted([record["config"].get("cluster", {}).get("name", "local") for record in records]),
        "hosts": counted([env["host"] for env in environments]),
        "python": counted([env["python"] for env in environments]),
    }
    for package in environments[0]["packages"]:
        facts[package] = counted([env["packages"].get(package) or "not installed" for env in environments])
    return facts


def task_code(record: dict[str, Any]) -> str:
    """The code of the run's task as its record names it: each file of the lab's own, with its sha256."""
    code = record.get("code")
    if code is None:
        return "not recorded"
    if not code["files"]:
        return "scratchflow's own (its commit above)"
    return ", ".join(f"{name} (sha256 {sha256[:SHORT]})" for name, sha256 in code["files"].items())


def trained_by_paragraph(records: dict[str, dict[str, Any]], workdir: Path) -> str:
    """Where the runs differ in what trained them, and the line that trains the odd ones again
    (scratchflow.provenance.difference_lines), as a paragraph of the page; empty where they do not."""
    halving = any(record.get("config", {}).get("search", {}).get("kind") == HALVING for record in records.values())
    lines = difference_lines(records, workdir, halving)
    if not lines:
        return ""
    title, *told = (html.escape(line.strip()) for line in lines)
    return f'<p id="trained-by"><b>The runs were {title}</b><br>' + "<br>".join(told) + "</p>"


def write_summary_page(
    settings: pd.DataFrame,
    runs: pd.DataFrame,
    chosen: dict[str, Any],
    records: dict[str, dict[str, Any]],
    cost: GridCost,
    path: Path,
    workdir: Path = Path(),
    figures: Sequence[Path] = (),
) -> None:
    """The runs that failed, named with why; the settings and runs tables (best first, sortable by
    any column, with what each cost), the best setting and run and its `figures` (PNG files, each
    captioned with its name), what the grid cost, and the runs' provenance (`records`, by run id),
    with where they differ in what trained them (their task's code against it as it is now in
    `workdir`, the grid's directory), in one HTML file with no outside resources."""
    metric, goal = chosen["metric"], chosen["goal"]
    setting, run = chosen["setting"], chosen["run"]
    unfinished = unfinished_runs(records)
    facts = "".join(
        f'<tr><th scope="row">{html.escape(name)}</th><td class="text">{html.escape(value)}</td></tr>'
        for name, value in provenance(list(records.values())).items()
    )
    # Those the tables show: a parameter the same in every run tells this setting from none.
    parameters = (
        ", ".join(f"{name}={value}" for name, value in setting["parameters"].items() if name in settings.columns)
        or "the grid's one setting"
    )
    rungs_cost = "".join(
        f"<br>Rung {rung}: {html.escape(described(spent, cost.site))}." for rung, spent in cost.by_rung.items()
    )
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>scratchflow: the grid</title><style>{STYLE}</style></head>
<body>
<h1>{len(runs) - len(unfinished)} runs in {len(settings)} settings</h1>
{unfinished_paragraph(unfinished)}
<p>Best setting by its mean test {html.escape(metric)} ({"highest" if goal == "max" else "lowest"}):
<b>{html.escape(parameters)}</b>, {setting["mean"]:.4f}
{f"± {setting['std']:.4f} " if setting["std"] is not None else ""}over {setting["runs"]} run(s).
Best single run: <b>{html.escape(run["run_id"])}</b> ({run["value"]:.4f}).
The best is highlighted; click a column's head to sort by it.</p>
<p id="cost">What the grid cost: {html.escape(cost.line())}.{rungs_cost}
An empty cost cell: a figure this site does not record.{superseded_sentence(records)}</p>
<h2>Settings (seeds as replicates)</h2>
{_table(settings, "settings", {" ".join(setting["run_ids"])}, "run_ids")}
<h2>Runs</h2>
{_table(runs, "runs", {run["run_id"]}, "run_id")}
{figures_section(run["run_id"], figures)}
<h2>Provenance</h2>
{trained_by_paragraph(records, workdir)}
<table id="provenance">{facts}</table>
<script>{SORT_SCRIPT}</script>
</body></html>
"""
    with written_whole(path) as partial:
        partial.write_text(page)


def figures_section(run_id: str, figures: Sequence[Path]) -> str:
    """The best run's figures, each inside the page (a data URL: the page needs no other file) with
    its name as caption; empty where it has none."""
    if not figures:
        return ""
    shown = []
    for figure in figures:
        caption = html.escape(figure.stem + (f": {FIGURE_NOTES[figure.stem]}" if figure.stem in FIGURE_NOTES else ""))
        data = base64.b64encode(figure.read_bytes()).decode("ascii")
        shown.append(
            f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(figure.stem)}">'
            f"<figcaption>{caption}</figcaption></figure>"
        )
    return f'<h2>The best run\'s figures ({html.escape(run_id)})</h2>\n<div id="figures">{"".join(shown)}</div>'


def unfinished_paragraph(unfinished: dict[str, tuple[str, dict[str, Any]]]) -> str:
    """The runs that diverged (a result, ranked last) and those that failed in a way a retry cannot
    fix (trained again by the same command after a fix), each with why; empty if none."""
    if not unfinished:
        return ""
    diverged = sum(outcome == DIVERGED for outcome, _said in unfinished.values())
    items = "".join(
        f"<li>{html.escape(unfinished_line(run_id, outcome, said))}</li>"
        for run_id, (outcome, said) in unfinished.items()
    )
    return (
        f'<div id="unfinished"><p><b>{diverged} run(s) diverged, {len(unfinished) - diverged} failed</b>, and are '
        "left out of the comparison, listed last in the runs table; a failed run, after a fix, the same command "
        f"trains again:</p><ul>{items}</ul></div>"
    )


def superseded_sentence(records: dict[str, dict[str, Any]]) -> str:
    """Which runs had a piece superseded (it trained on after a newer piece took its run over: its
    Slurm job requeued while its node had stopped answering), as the cost counts it; empty if none."""
    pieces = [
        f"{html.escape(run_id)} (piece {piece['piece']})"
        for run_id, record in records.items()
        for piece in record.get("pieces", [])
        if piece.get("outcome") == SUPERSEDED
    ]
    if not pieces:
        return ""
    return (
        f"<br>Superseded: {', '.join(pieces)}; each trained on after a newer piece took its run over, wrote "
        "nothing after that, and what it trained after its last checkpoint counts as lost."
    )


def plot_confusion_matrix(metrics: dict[str, Any], run_id: str, path: Path) -> None:
    """The best run's confusion matrix (rows: true label, columns: predicted) where its metrics hold
    one; where they do not (a regression), no file at `path`: one an earlier best run had goes."""
    matrix = metrics.get("confusion_matrix")
    if not matrix:
        path.unlink(missing_ok=True)
        return
    plt = pyplot()
    size = len(matrix["labels"])
    figure, axes = plt.subplots(figsize=(2.5 + 0.6 * size, 2 + 0.6 * size))
    counts = matrix["rows_true_columns_predicted"]
    axes.imshow(counts, cmap="Blues")
    axes.set_xticks(range(size), matrix["labels"], rotation=45, ha="right")
    axes.set_yticks(range(size), matrix["labels"])
    top = max(max(row) for row in counts) or 1
    for row_index, row in enumerate(counts):
        for column_index, count in enumerate(row):
            colour = "white" if count > top / 2 else "black"
            axes.text(column_index, row_index, str(count), ha="center", va="center", color=colour)
    axes.set_xlabel("predicted")
    axes.set_ylabel("true")
    axes.set_title(f"best run {run_id}: test confusion matrix")
    figure.tight_layout()
    save_png(figure, path, dpi=100)
