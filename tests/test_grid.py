from scratchflow.grid import build_run_table, expand_grid, run_id_for, run_identity

DATASET = {
    "name": "news",
    "path": "/data/news",
    "format": "folder",
    "text_column": "text",
    "label_column": "label",
    "test_fraction": 0.2,
    "validation_fraction": 0.1,
    "split_seed": 0,
}
DEFAULTS = {"learning_rate": 1e-4, "batch_size": 32, "seed": 0}


def config(grid, training=DEFAULTS, dataset=DATASET, model="m"):
    return {"dataset": dataset, "model": {"name": model}, "training": dict(training), "grid": grid}


def test_grid_is_the_cartesian_product_completed_with_defaults():
    runs = expand_grid(DEFAULTS, {"learning_rate": [1e-4, 2e-4], "seed": [0, 1, 2]})
    assert len(runs) == 6
    assert {(run["learning_rate"], run["seed"]) for run in runs} == {
        (lr, seed) for lr in (1e-4, 2e-4) for seed in (0, 1, 2)
    }
    assert all(run["batch_size"] == 32 for run in runs)


def test_adding_a_value_keeps_the_ids_of_existing_runs():
    before = build_run_table(config({"seed": [0, 1]}))
    after = build_run_table(config({"seed": [0, 1, 2]}))
    assert set(before) < set(after)
    assert len(after) == 3
    for run_id, params in before.items():
        assert after[run_id] == params


def test_ids_do_not_depend_on_where_a_value_is_written():
    in_grid = build_run_table(config({"seed": [0]}))
    as_default = build_run_table(config({"batch_size": [32]}))
    assert set(in_grid) == set(as_default)


def test_equal_numbers_give_equal_ids():
    as_int = run_id_for(run_identity({"weight_decay": 0, "epochs": 2}, DATASET, "m"))
    as_float = run_id_for(run_identity({"weight_decay": 0.0, "epochs": 2.0}, DATASET, "m"))
    assert as_int == as_float


def test_ids_change_with_what_changes_the_result_but_not_with_the_data_location():
    base = set(build_run_table(config({"seed": [0]})))
    assert set(build_run_table(config({"seed": [0]}, model="other"))) != base
    assert set(build_run_table(config({"seed": [0]}, dataset={**DATASET, "split_seed": 1}))) != base
    assert set(build_run_table(config({"seed": [0]}, dataset={**DATASET, "path": "/moved/news"}))) == base
    by_price = set(build_run_table(config({"seed": [0]}, dataset={**DATASET, "target_column": "price"})))
    by_rent = set(build_run_table(config({"seed": [0]}, dataset={**DATASET, "target_column": "rent"})))
    assert len({frozenset(base), frozenset(by_price), frozenset(by_rent)}) == 3, "another target, another run"


def test_run_ids_are_short_hex():
    for run_id in build_run_table(config({"seed": [0, 1, 2, 3]})):
        assert len(run_id) == 10
        int(run_id, 16)
