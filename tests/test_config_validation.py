"""Bad input fails at start-up, names the key, and runs nothing."""

import copy

import pytest
from conftest import run_workflow, workflow_config, write_config


def broken(config, mutate):
    config = copy.deepcopy(config)
    mutate(config)
    return config


CASES = {
    "unknown key": (lambda c: c["training"].update(epoch=3), ["training", "'epoch' was unexpected"]),
    "wrong type": (lambda c: c["grid"].update(learning_rate=["1e-4"]), ["grid.learning_rate[0]", "1.0e-4"]),
    "empty grid": (lambda c: c.update(grid={}), ["config key grid", "non-empty"]),
    "empty grid list": (lambda c: c["grid"].update(seed=[]), ["grid.seed"]),
    "missing data path": (lambda c: c["dataset"].update(path="/no/such/data"), ["dataset.path", "/no/such/data"]),
    "missing local model": (lambda c: c["model"].update(source="./no-such-model"), ["model.source"]),
    "file for a folder dataset": (lambda c: c["dataset"].update(format="csv"), ["dataset.path", "needs a file"]),
}


@pytest.mark.parametrize("case", CASES)
def test_invalid_config_fails_before_anything_runs(case, tmp_path, bbc_subset, tiny_model):
    mutate, expected = CASES[case]
    write_config(tmp_path, broken(workflow_config(bbc_subset, tiny_model, tmp_path / "scratch"), mutate))
    result = run_workflow(tmp_path, check=False)
    output = result.stdout
    assert result.returncode != 0
    for text in expected:
        assert text in output
    assert "ConfigError" in output
    assert not any((tmp_path / folder).exists() for folder in ("archives", "models", "results", "logs"))
