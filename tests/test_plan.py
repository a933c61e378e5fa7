"""The plan of a grid or search as a plain object: runs, settings, packs and every path a run writes, planned in
Python (no Snakemake), and the same plan read back by the status."""

import itertools
import json
from pathlib import Path

import pytest
import yaml
from conftest import REPO, validated
from scratchflow.classification import TRAINER_CHECKPOINT_MARKER
from scratchflow.plan import RUN_PATHS, NoPlan, Plan


def plan_of(path: Path, **cluster) -> Plan:
    config = yaml.safe_load(path.read_text())
    config.setdefault("cluster", {}).update(cluster)
    validated(config)
    return Plan.from_config(config, TRAINER_CHECKPOINT_MARKER)


# Run ids name every result on disk: a change of code must never rename the runs of an existing grid
# (a change of the config does: the demo's ids last changed with its 32 tokens in batches of 16).
KNOWN_RUN_IDS = {
    "config/config.yaml": ["24823c3fbe", "5f8a9ca6d0", "796d21aa9f", "f9a49e4a86"],
    "config/examples/image/config.yaml": ["7ec9e2493d", "d99ae11257"],
    "config/examples/command/config.yaml": ["0cd6566fd8", "5bbcc4c82c", "b5b4aa7310", "f571a36885"],
}


@pytest.mark.parametrize("config_file", sorted(KNOWN_RUN_IDS))
def test_the_run_ids_of_the_demo_and_the_examples_never_change(config_file, monkeypatch):
    monkeypatch.chdir((REPO / config_file).parent)  # the command example checks its script is there
    assert sorted(plan_of(REPO / config_file).runs) == KNOWN_RUN_IDS[config_file]


def test_the_demo_plans_two_settings_of_two_seeds_each():
    plan = plan_of(REPO / "config" / "config.yaml")
    settings = plan.settings()
    assert len(settings) == 2
    assert all(len(run_ids) == 2 for run_ids in settings.values())
    for run_ids in settings.values():
        assert sorted(plan.runs[run_id]["seed"] for run_id in run_ids) == [0, 1]
    # Every run in exactly one setting, in grid order.
    assert list(itertools.chain.from_iterable(settings.values())) == plan.run_ids


def test_every_path_of_a_run_is_named_once_and_filled_with_its_id():
    paths = RUN_PATHS.of("0123456789")
    assert paths.record == "results/runs/0123456789/record.json"
    assert paths.checkpoints == "checkpoints/0123456789"
    assert paths.train_log == "logs/train/0123456789.log"
    assert all("{run_id}" in template for template in vars(RUN_PATHS).values())
    assert not any("{" in path for path in vars(paths).values())


def test_runs_are_packed_in_grid_order_the_last_pack_taking_what_is_left():
    runs = {f"{index:010d}": {"seed": index} for index in range(5)}
    plan = Plan(runs, {}, None, "command", "loss", "min", "COMPLETE", pack_runs=2)
    assert plan.packs == [["0000000000", "0000000001"], ["0000000002", "0000000003"], ["0000000004"]]
    assert plan.pack_outputs() == [
        *(f"results/packs/train-{pack}.json" for pack in range(3)),
        *(f"results/packs/predict-{pack}.json" for pack in range(3)),
    ]
    # A pack's job waits for what its runs' jobs write last: each run's record, then its metrics.
    assert plan.pack_inputs("train", 2) == ["results/runs/0000000004/record.json"]
    assert plan.pack_inputs("predict", 0) == [
        "results/runs/0000000000/metrics.json",
        "results/runs/0000000001/metrics.json",
    ]
    assert plan.final_outputs()[: len(plan.pack_outputs())] == plan.pack_outputs()


def test_unpacked_runs_have_no_pack_jobs():
    plan = Plan({"0000000000": {}}, {}, None, "command", "loss", "min", "COMPLETE")
    assert not plan.packed and plan.pack_outputs() == []
    assert plan.packs == [["0000000000"]]


def test_a_packed_demo_plans_the_same_runs_as_an_unpacked_one():
    unpacked = plan_of(REPO / "config" / "config.yaml")
    packed = plan_of(REPO / "config" / "config.yaml", pack_runs=3)
    assert packed.runs == unpacked.runs
    assert [len(pack) for pack in packed.packs] == [3, 1]


def test_the_status_reads_the_plan_the_workflow_wrote(tmp_path):
    plan = plan_of(REPO / "config" / "config.yaml")
    with pytest.raises(NoPlan, match=r"results/plan\.json is missing"):
        Plan.read(tmp_path)
    plan.started("slurm").write(tmp_path)
    read = Plan.read(tmp_path)
    assert read == plan.started("slurm")
    assert read.executor == "slurm" and read.run_ids == plan.run_ids
    assert read.identity(plan.run_ids[0]) == plan.identity(plan.run_ids[0])


@pytest.mark.parametrize("pack_runs", [1, 3, 7, 10_000])
def test_every_run_is_in_exactly_one_pack(pack_runs):
    runs = {f"{index:010d}": {"seed": index} for index in range(1_000)}
    plan = Plan(runs, {}, None, "command", "loss", "min", "COMPLETE", pack_runs=pack_runs)
    assert list(itertools.chain.from_iterable(plan.packs)) == plan.run_ids
    assert all(len(pack) == pack_runs for pack in plan.packs[:-1]) and 0 < len(plan.packs[-1]) <= pack_runs


def test_a_plan_file_of_another_version_is_refused_saying_what_to_do(tmp_path):
    written = tmp_path / "results" / "plan.json"
    written.parent.mkdir(parents=True)
    written.write_text('{"metric": "accuracy", "goal": "max", "executor": "local", "runs": {}}')
    with pytest.raises(NoPlan, match="written by another version of scratchflow; run the workflow's command again"):
        Plan.read(tmp_path)


def test_a_plan_file_of_an_earlier_release_reads_with_the_defaults_of_what_came_later(tmp_path):
    """0.4.0 wrote no `configfiles`: after an upgrade that retrains nothing, the workflow writes no
    new plan (it has no job to start), and `make status` and `make verify` read 0.4.0's."""
    plan = Plan({"aaaa": {"seed": 0}}, {}, None, "ourlab.mlp", "accuracy", "max", "COMPLETE", executor="local")
    written = {name: value for name, value in plan._fields().items() if name != "configfiles"}
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "plan.json").write_text(json.dumps(written))
    assert Plan.read(tmp_path) == plan
    (tmp_path / "results" / "plan.json").write_text(json.dumps({**written, "a_later_key": 1}))
    with pytest.raises(NoPlan, match="written by another version of scratchflow"):
        Plan.read(tmp_path)
