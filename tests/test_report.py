"""The report's own page: the grid's tables as self-contained HTML, the runs' provenance, the best
run's figures (its confusion matrix where it reports one, its task's own), and the workflow's last
message naming them. (tests/test_workflow.py opens the whole report in a browser.)"""

import json
from pathlib import Path

from conftest import drawn_figure
from scratchflow.accounting import Cost, GridCost
from scratchflow.aggregation import best, by_setting, run_costs, setting_costs, summarize
from scratchflow.figures import pyplot, save_png
from scratchflow.plan import BEST_CONFUSION_MATRIX, RUN_PATHS, Plan, best_run_figures
from scratchflow.report import plot_confusion_matrix, provenance, write_summary_page
from scratchflow.workflow_hooks import describe_results


def record(commit: str, host: str, dirty: bool = False, version: str = "0.1.0") -> dict:
    return {
        "task": "text-classification",
        "data": {"sha256": "abc"},
        "config": {"cluster": {"name": "narval"}},
        "environment": {
            "scratchflow_version": version,
            "git": {"commit": "5c6852b", "dirty": False},
            "pipeline_git": {"commit": commit, "dirty": dirty},
            "host": host,
            "python": "3.11.7",
            "packages": {"torch": "2.13.0", "wandb": None},
        },
        "code": {"task": "text-classification", "folder": None, "files": {}, "sha256": None},
    }


def grid(tmp_path):
    runs = {}
    for run_id, lr, seed, f1 in (("aaa", 1e-4, 0, 0.8), ("bbb", 2e-4, 0, 0.84), ("ccc", 2e-4, 1, 0.69)):
        folder = tmp_path / run_id
        folder.mkdir()
        (folder / "params.json").write_text(json.dumps({"learning_rate": lr, "seed": seed, "note": "<b>&"}))
        (folder / "metrics.json").write_text(json.dumps({"macro_f1": f1}))
        runs[run_id] = {"params": folder / "params.json", "metrics": folder / "metrics.json"}
    table = summarize(runs)
    settings = by_setting(table)
    return table, settings, best(table, settings, "macro_f1")


def local_cost(run_ids: list[str]) -> GridCost:
    """What runs without Slurm cost: CPU-hours from their clocks, no GPU figure."""
    by_run = {run_id: Cost(gpu_hours=None, lost_gpu_hours=None, cpu_hours=0.25, energy_kwh=None) for run_id in run_ids}
    return GridCost(by_run=by_run, by_rung={}, total=sum(by_run.values(), Cost()), site=None)


def test_the_page_holds_every_run_and_setting_escaped_sortable_and_self_contained(tmp_path):
    table, settings, chosen = grid(tmp_path)
    page = tmp_path / "summary.html"
    cost = local_cost(list(table["run_id"]))
    settings = settings.merge(setting_costs(settings, cost.by_run), on="run_ids")
    table = table.merge(run_costs(cost.by_run), on="run_id")
    write_summary_page(settings, table, chosen, {"aaa": record("c0ffee", "n1")}, cost, page, tmp_path)
    text = page.read_text()
    assert "What the grid cost: no Slurm accounting: GPU-hours not known, 0.75 CPU-hours" in text
    assert "<th>cpu_hours</th>" in text and 'data-value="0.5"' in text, "a setting's runs' cost, summed"
    for run_id in ("aaa", "bbb", "ccc"):
        assert f'<td class="text">{run_id}</td>' in text
    assert text.count("<tr") == 1 + 3 + 1 + 2 + len(provenance([record("c0ffee", "n1")]))
    assert "&lt;b&gt;&amp;" in text and "<b>&" not in text, "parameter values are data, not markup"
    assert 'data-value="0.84"' in text, "sorted by full value, whatever is shown"
    assert 'class="sortable"' in text and "addEventListener" in text
    assert "http" not in text, "no outside resources: it previews inside Snakemake's report"
    assert 'id="trained-by"' not in text, "one run: trained by nothing but its own code and packages"
    assert "Superseded" not in text, "no piece was"


def test_the_page_says_which_runs_had_a_piece_superseded_and_what_that_cost(tmp_path):
    table, settings, chosen = grid(tmp_path)
    records = {run_id: record("c0ffee", "n1") for run_id in ("aaa", "bbb", "ccc")}
    records["bbb"]["pieces"] = [{"piece": 1, "outcome": "superseded"}, {"piece": 2, "outcome": "finished"}]
    write_summary_page(settings, table, chosen, records, local_cost(list(records)), tmp_path / "page.html")
    assert (
        "Superseded: bbb (piece 1); each trained on after a newer piece took its run over, wrote nothing "
        "after that, and what it trained after its last checkpoint counts as lost."
    ) in (tmp_path / "page.html").read_text()


def test_the_page_says_which_runs_other_packages_trained_and_how_to_train_them_again(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the aggregate job runs in the grid's directory
    (tmp_path / "Makefile").write_text("retrain:\n\techo\nverify:\n\techo\n")
    table, settings, chosen = grid(tmp_path)
    records = {run_id: record("c0ffee", "n1") for run_id in ("aaa", "bbb", "ccc")}
    for minute, written in enumerate(records.values()):
        written["environment"]["finished_at"] = f"2026-11-27T10:0{minute}:00+0000"
    records["bbb"]["environment"]["packages"]["torch"] = "2.12.0"
    write_summary_page(settings, table, chosen, records, local_cost(list(records)), tmp_path / "page.html")
    text = (tmp_path / "page.html").read_text()
    assert (
        '<p id="trained-by"><b>The runs were trained by other code or packages:</b><br>torch 2.12.0 trained 1 of 3 '
        "runs, 2.13.0 the newest: bbb<br>to train it again from zero, and nothing else: make retrain "
        "RUNS=&quot;bbb&quot;<br>or, to show that what changed changes no result (the cheapest trained again and "
        "compared, byte for byte): make verify RUNS=&quot;bbb&quot;</p>"
    ) in text
    (tmp_path / "results").mkdir()
    proven = [{"run": "bbb", "on": "2026-11-29", "changes": [{"what": "torch", "was": "2.12.0", "now": "2.13.0"}]}]
    (tmp_path / "results" / "verified.json").write_text(json.dumps(proven))
    write_summary_page(settings, table, chosen, records, local_cost(list(records)), tmp_path / "page.html")
    assert (
        '<p id="trained-by"><b>The runs were trained by other code or packages, verified (make verify) to give the '
        "same results:</b><br>torch 2.12.0 trained 1 of 3 runs, 2.13.0 the newest: bbb; verified: trained again "
        "with it, run bbb on 2026-11-29 gave the same weights, metrics and predictions, byte for byte</p>"
    ) in (tmp_path / "page.html").read_text()


def test_provenance_names_what_differs_between_runs_with_counts():
    facts = provenance([record("c0ffee", "n1"), record("c0ffee", "n2", dirty=True), record("c0ffee", "n2")])
    assert facts["pipeline commit"] == "c0ffee (2 runs), c0ffee (uncommitted changes) (1 run)"
    assert facts["scratchflow"] == "0.1.0, commit 5c6852b"
    assert facts["hosts"] == "n1 (1 run), n2 (2 runs)"
    assert facts["torch"] == "2.13.0"
    assert facts["wandb"] == "not installed"
    assert facts["cluster"] == "narval"
    assert facts["task code"] == "scratchflow's own (its commit above)"
    lab = {**record("c0ffee", "n1"), "code": {"files": {"ourlab/mlp.py": "9f8e7d6c" * 8}, "sha256": "1" * 64}}
    assert provenance([lab])["task code"] == "ourlab/mlp.py (sha256 9f8e7d6c)"


def test_provenance_tells_runs_of_two_releases_and_a_record_from_before_versions():
    before = record("c0ffee", "n1")
    del before["environment"]["scratchflow_version"], before["environment"]["pipeline_git"]
    facts = provenance([before, record("c0ffee", "n1", version="0.2.0")])
    assert facts["scratchflow"] == "before 0.1.0, commit 5c6852b (1 run), 0.2.0, commit 5c6852b (1 run)"
    assert facts["pipeline commit"] == "not recorded (1 run), c0ffee (1 run)"


MATRIX = {"labels": ["a", "b"], "rows_true_columns_predicted": [[3, 1], [0, 4]]}


def test_the_confusion_matrix_is_drawn_and_a_task_without_one_has_none(tmp_path):
    """A regression's best run reports no confusion matrix: no figure, and the one an earlier best
    run (a classifier's) had is not left behind."""
    drawn = tmp_path / "best_confusion_matrix.png"
    plot_confusion_matrix({"confusion_matrix": MATRIX}, "aaa", drawn)
    # (2.5 + 0.6 per label) x (2 + 0.6 per label) inches at 100 dpi.
    assert drawn_figure(drawn) == (370, 320)
    plot_confusion_matrix({"rmse": 0.3, "mae": 0.2}, "bbb", drawn)
    assert list(tmp_path.iterdir()) == []


def predicted_against_true(run_id: str) -> None:
    """The figure a regression task's predict returned for `run_id`, as its predict job saved it."""
    figure, axes = pyplot().subplots(figsize=(3, 3))
    axes.scatter([1.0, 2.0, 3.0], [1.1, 1.8, 3.2])
    save_png(figure, Path(RUN_PATHS.of(run_id).figures) / "predicted_vs_true.png", dpi=100)


def page_of(tmp_path, figures) -> str:
    table, settings, chosen = grid(tmp_path)
    cost = local_cost(list(table["run_id"]))
    write_summary_page(settings, table, chosen, {"aaa": record("c0ffee", "n1")}, cost, tmp_path / "page.html",
                       tmp_path, figures=figures)  # fmt: skip
    return (tmp_path / "page.html").read_text()


def test_a_regressions_best_run_shows_its_own_figure_and_no_confusion_matrix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    predicted_against_true("bbb")
    plot_confusion_matrix({"rmse": 0.3}, "bbb", Path(BEST_CONFUSION_MATRIX))
    figures = best_run_figures("bbb")
    assert figures == [Path("results/runs/bbb/figures/predicted_vs_true.png")]
    page = page_of(tmp_path, figures)
    assert page.count("<img ") == 1 and '<img src="data:image/png;base64,' in page, "inside the page"
    assert "<figcaption>predicted_vs_true</figcaption>" in page
    assert "confusion" not in page and "true label" not in page


def test_a_classifiers_best_run_shows_its_confusion_matrix_first_with_what_its_rows_are(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    predicted_against_true("bbb")
    plot_confusion_matrix({"confusion_matrix": MATRIX}, "bbb", Path(BEST_CONFUSION_MATRIX))
    figures = best_run_figures("bbb")
    assert figures == [Path(BEST_CONFUSION_MATRIX), Path("results/runs/bbb/figures/predicted_vs_true.png")]
    page = page_of(tmp_path, figures)
    assert page.count("<img ") == 2
    assert (
        "<figcaption>best_confusion_matrix: the test confusion matrix; rows: true label, columns: predicted"
        "</figcaption>" in page
    )
    (tmp_path / "none").mkdir()
    assert "figures" not in page_of(tmp_path / "none", []).split("<h2>Provenance")[0], "no figure, no heading"


def test_the_last_message_lists_the_best_runs_figures_and_no_confusion_matrix_it_lacks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = Plan({"aaa": {}, "bbb": {}}, {}, None, "ourlab.regression", "rmse", "min", "COMPLETE")
    for output in ("results/summary.tsv", "results/summary.html"):
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text("")
    Path("results/best_run.json").write_text(json.dumps({"run": {"run_id": "bbb", "value": 0.3}}))
    predicted_against_true("bbb")
    listed = [line.strip() for line in describe_results(plan, "tensorboard").splitlines() if line.startswith("  /")]
    assert listed == [
        str(tmp_path.resolve() / "results" / name)
        for name in ("summary.tsv", "best_run.json", "summary.html", "runs/bbb/figures/predicted_vs_true.png")
    ]
