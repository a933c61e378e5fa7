import json
import math

import pytest
from conftest import drawn_figure
from scratchflow.aggregation import (
    UnknownMetric,
    best,
    by_setting,
    check_metric,
    comparison_axis,
    constant_parameters,
    parameter_columns,
    plot_comparison,
    ranked_first,
    setting_columns,
    setting_trained_by,
    summarize,
    trained_by_table,
    varying_columns,
)


def write_run(root, run_id, lr, seed, accuracy, macro_f1):
    folder = root / run_id
    folder.mkdir()
    (folder / "params.json").write_text(json.dumps({"learning_rate": lr, "seed": seed, "epochs": 1}))
    (folder / "metrics.json").write_text(json.dumps({"accuracy": accuracy, "macro_f1": macro_f1, "per_class": {}}))
    return {"params": folder / "params.json", "metrics": folder / "metrics.json"}


def runs(tmp_path):
    """Two settings: learning rate 1e-4 with one seed, 2e-4 with two."""
    return {
        "aaa": write_run(tmp_path, "aaa", 1e-4, 0, 0.90, 0.80),
        "bbb": write_run(tmp_path, "bbb", 2e-4, 0, 0.85, 0.84),
        "ccc": write_run(tmp_path, "ccc", 2e-4, 1, 0.70, 0.69),
    }


def test_the_runs_table_has_a_row_per_run_with_params_and_metrics(tmp_path):
    table = summarize(runs(tmp_path))
    assert list(table["run_id"]) == ["aaa", "bbb", "ccc"]
    assert list(table.columns) == ["run_id", "learning_rate", "seed", "epochs", "accuracy", "macro_f1"]
    assert setting_columns(table) == ["learning_rate", "epochs"]
    assert varying_columns(table, setting_columns(table)) == ["learning_rate"]


def test_the_tables_lead_with_the_ranking_metric_the_others_after_it_in_their_order(tmp_path):
    """A regression ranked by its rmse: rmse is the first metric column of the runs and of the
    settings, not wherever the task happened to report it."""
    table = ranked_first(summarize(runs(tmp_path)), "macro_f1")
    assert list(table.columns) == ["run_id", "learning_rate", "seed", "epochs", "macro_f1", "accuracy"]
    assert table.attrs["metrics"] == ["macro_f1", "accuracy"]
    assert list(by_setting(table).columns)[4:] == [
        *("macro_f1_mean", "macro_f1_std", "macro_f1_count"),
        *("accuracy_mean", "accuracy_std", "accuracy_count"),
    ]


def test_a_parameter_the_same_in_every_run_is_left_out_and_every_one_that_varies_stays(tmp_path):
    table = summarize(runs(tmp_path))
    assert parameter_columns(table) == ["learning_rate", "seed", "epochs"]
    assert constant_parameters(table, parameter_columns(table)) == ["epochs"]
    # A grid of seeds alone: the seed is all that tells its runs apart.
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    table = summarize({run_id: write_run(seeds, run_id, 1e-4, seed, 0.9, 0.8) for seed, run_id in enumerate("ab")})
    assert constant_parameters(table, parameter_columns(table)) == ["learning_rate", "epochs"]


def test_runs_that_differ_only_in_their_seed_are_one_setting_with_mean_spread_and_count(tmp_path):
    settings = by_setting(summarize(runs(tmp_path)))
    assert list(settings["learning_rate"]) == [1e-4, 2e-4]
    assert list(settings["runs"]) == [1, 2]
    assert list(settings["run_ids"]) == ["aaa", "bbb ccc"]
    pair = settings.iloc[1]
    assert pair["macro_f1_mean"] == pytest.approx(0.765)
    assert pair["macro_f1_std"] == pytest.approx(math.sqrt(((0.84 - 0.765) ** 2 + (0.69 - 0.765) ** 2) / 1))
    assert pair["accuracy_count"] == 2
    assert math.isnan(settings.iloc[0]["macro_f1_std"]), "one run has no spread"


def test_the_best_setting_is_chosen_by_its_mean_and_the_best_run_is_named_beside_it(tmp_path):
    table = summarize(runs(tmp_path))
    chosen = best(table, by_setting(table), "macro_f1")
    # 2e-4 has the best single run (0.84) but the lower mean (0.765 against 0.80).
    assert chosen["setting"] == {
        "parameters": {"learning_rate": 1e-4, "epochs": 1},
        "mean": 0.80,
        "std": None,
        "runs": 1,
        "run_ids": ["aaa"],
    }
    assert chosen["run"] == {"run_id": "bbb", "value": 0.84}
    assert json.loads(json.dumps(chosen)) == chosen, "written as JSON as it is"


def test_with_one_seed_per_setting_the_settings_are_the_runs(tmp_path):
    table = summarize(
        {"aaa": write_run(tmp_path, "aaa", 1e-4, 0, 0.9, 0.8), "bbb": write_run(tmp_path, "bbb", 2e-4, 0, 0.8, 0.7)}
    )
    settings = by_setting(table)
    assert list(settings["run_ids"]) == ["aaa", "bbb"]
    assert list(settings["macro_f1_mean"]) == [0.8, 0.7]
    assert best(table, settings, "macro_f1")["run"]["run_id"] == "aaa"


def test_a_loss_is_compared_by_its_lowest_value(tmp_path):
    table = summarize(runs(tmp_path))
    settings = by_setting(table)
    chosen = best(table, settings, "accuracy", goal="min")
    assert chosen["setting"]["run_ids"] == ["bbb", "ccc"]
    assert chosen["run"]["run_id"] == "ccc"
    plot_comparison(table, settings, "accuracy", "min", tmp_path / "plot.png")
    # 9 x (1.2 + 0.45 per setting) inches at 110 dpi.
    assert drawn_figure(tmp_path / "plot.png") == (990, round((1.2 + 0.45 * 2) * 110))


def test_the_plot_is_a_png_written_whole(tmp_path):
    plot = tmp_path / "out" / "comparison.png"
    table = summarize(runs(tmp_path))
    plot_comparison(table, by_setting(table), "macro_f1", "max", plot)
    assert drawn_figure(plot) == (990, round((1.2 + 0.45 * 2) * 110))
    assert [p.name for p in plot.parent.iterdir()] == ["comparison.png"]


def test_a_metric_no_run_reports_is_refused_naming_those_that_exist(tmp_path):
    with pytest.raises(UnknownMetric, match="'f1': no run reports it; the runs report: accuracy, macro_f1"):
        check_metric(summarize(runs(tmp_path)), "f1")


def test_the_comparison_axis_names_the_metric_once_says_what_a_bar_is_and_fits_the_values(tmp_path):
    """A command task's test_mse over settings of one run each: 'test test_mse', 'the seeds' and an
    axis to 1.08 for values below 0.5 were all wrong."""
    for index, (run_id, mse) in enumerate((("aaa", 0.48), ("bbb", 0.31))):
        (tmp_path / run_id).mkdir()
        (tmp_path / run_id / "params.json").write_text(json.dumps({"hidden": 16 * (index + 1)}))
        (tmp_path / run_id / "metrics.json").write_text(json.dumps({"test_mse": mse}))
    files = {run_id: {"params": tmp_path / run_id / "params.json", "metrics": tmp_path / run_id / "metrics.json"}
             for run_id in ("aaa", "bbb")}  # fmt: skip
    table = summarize(files)
    label, (low, high) = comparison_axis(table, by_setting(table), "test_mse", "min")
    assert label == "test_mse: one run per setting (lower is better)"
    assert low == 0 and 0.48 < high < 0.6

    seeds = tmp_path / "seeds"
    seeds.mkdir()
    table = summarize(runs(seeds))
    label, (low, high) = comparison_axis(table, by_setting(table), "accuracy", "max")
    assert label == "test accuracy: mean ± std over each setting's seeds, a dot per run (higher is better)"
    assert 0.9 < high < 1.05


def trained(torch: str, code: str | None) -> dict:
    """A run's record as far as what trained it goes: its packages and its task's code."""
    environment = {"scratchflow_version": "0.2.0", "python": "3.11.7", "packages": {"torch": torch}}
    return {"environment": environment, "code": {"files": {"ourlab/mlp.py": code}, "sha256": code}}


def test_the_tables_show_what_trained_each_run_where_the_runs_differ_in_it_and_only_there(tmp_path):
    table = summarize(runs(tmp_path))
    settings = by_setting(table)
    alike = trained_by_table({run_id: trained("2.13.0", "a" * 64) for run_id in ("aaa", "bbb", "ccc")})
    assert list(alike.columns) == ["run_id"] and list(alike["run_id"]) == ["aaa", "bbb", "ccc"]
    assert list(setting_trained_by(settings, alike).columns) == ["run_ids"]
    differing = trained_by_table(
        {"aaa": trained("2.13.0", "a" * 64), "bbb": trained("2.13.0", "b" * 64), "ccc": trained("2.12.0", "a" * 64)}
    )
    assert differing.to_dict("records") == [
        {"run_id": "aaa", "trained_by_torch": "2.13.0", "trained_by_code": "aaaaaaaa"},
        {"run_id": "bbb", "trained_by_torch": "2.13.0", "trained_by_code": "bbbbbbbb"},
        {"run_id": "ccc", "trained_by_torch": "2.12.0", "trained_by_code": "aaaaaaaa"},
    ]
    assert setting_trained_by(settings, differing).to_dict("records") == [
        {"run_ids": "aaa", "trained_by_torch": "2.13.0", "trained_by_code": "aaaaaaaa"},
        {"run_ids": "bbb ccc", "trained_by_torch": "2.13.0, 2.12.0", "trained_by_code": "bbbbbbbb, aaaaaaaa"},
    ]
