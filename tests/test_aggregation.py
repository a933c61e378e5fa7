import json

import pytest
from scratchflow.aggregation import UnknownMetric, best_run, plot_comparison, summarize, varying_columns


def write_run(root, run_id, lr, seed, accuracy, macro_f1):
    folder = root / run_id
    folder.mkdir()
    (folder / "params.json").write_text(json.dumps({"learning_rate": lr, "seed": seed, "epochs": 1}))
    (folder / "metrics.json").write_text(json.dumps({"accuracy": accuracy, "macro_f1": macro_f1, "per_class": {}}))
    return {"params": folder / "params.json", "metrics": folder / "metrics.json"}


def runs(tmp_path):
    return {
        "aaa": write_run(tmp_path, "aaa", 1e-4, 0, 0.90, 0.80),
        "bbb": write_run(tmp_path, "bbb", 2e-4, 0, 0.85, 0.84),
        "ccc": write_run(tmp_path, "ccc", 2e-4, 1, 0.70, 0.69),
    }


def test_summary_has_a_row_per_run_with_params_and_metrics(tmp_path):
    summary = summarize(runs(tmp_path))
    assert list(summary["run_id"]) == ["aaa", "bbb", "ccc"]
    assert list(summary.columns) == ["run_id", "learning_rate", "seed", "epochs", "accuracy", "macro_f1"]
    assert varying_columns(summary) == ["learning_rate", "seed"]


def test_the_best_run_depends_on_the_chosen_metric(tmp_path):
    summary = summarize(runs(tmp_path))
    assert best_run(summary, "accuracy") == {"run_id": "aaa", "metric": "accuracy", "goal": "max", "value": 0.90}
    assert best_run(summary, "macro_f1")["run_id"] == "bbb"


def test_the_plot_is_a_png(tmp_path):
    plot = tmp_path / "out" / "comparison.png"
    plot_comparison(summarize(runs(tmp_path)), "macro_f1", "max", plot)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in plot.parent.iterdir()] == ["comparison.png"]


def test_a_loss_is_compared_by_its_lowest_value(tmp_path):
    summary = summarize(runs(tmp_path))
    assert best_run(summary, "accuracy", goal="min")["run_id"] == "ccc"
    plot_comparison(summary, "accuracy", "min", tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"


def test_a_metric_no_run_reports_is_refused_naming_those_that_exist(tmp_path):
    with pytest.raises(UnknownMetric, match="'f1': no run reports it; the runs report: accuracy, macro_f1"):
        best_run(summarize(runs(tmp_path)), "f1")
