"""The switches of docs/clusters.md (config/tests/profiles/: several nodes, one node, a preemptible
partition) applied with scripts/apply_switch.py to a lab pipeline's layer over scratchflow's profile:
Snakemake, which replaces a top-level key of the profile with the layer's whole, then reads every key
of the profile that the switch does not name as the profile has it, the switch's keys as the switch
has them, and the lab's own keys as they were; the pipeline plans with each switch."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ACTIVATED, RECIPES, REPO, git, lab_pipeline, workflow_config, workflow_env
from scratchflow.config import dropped_settings, dropped_settings_line
from scratchflow.profiles import SwitchError, apply_switch, layer_with_switch, merged
from snakemake.resources import Resource

SWITCHES = sorted(path.stem for path in (RECIPES / "profiles").glob("*.yaml"))


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, bbc_subset, tiny_model) -> Path:
    """A lab's pipeline on Narval, as new_pipeline.py makes it (its layer holds `jobs: 100`), with a
    grid of 2 runs and no cluster facts of its own: they come from the profile's configfile."""
    config = workflow_config(bbc_subset, tiny_model, scratch=Path("unused"))
    del config["cluster"]
    return lab_pipeline(tmp_path_factory.mktemp("switches") / "ourlab-pipeline", "narval", config)


@pytest.fixture
def lab(pipeline) -> Path:
    """The pipeline with its profile layers as committed (each test applies its own switches)."""
    git(pipeline, "checkout", "--quiet", "--", "profiles")
    git(pipeline, "clean", "--quiet", "-d", "--force", "--", "profiles")
    return pipeline


def apply(folder: Path, *arguments: str, scratchflow: Path = REPO) -> subprocess.CompletedProcess:
    """scratchflow's scripts/apply_switch.py, run in `folder` (a lab's pipeline) as its docs show."""
    return subprocess.run(
        [sys.executable, scratchflow / "scripts" / "apply_switch.py", *arguments],
        cwd=folder,
        capture_output=True,
        text=True,
    )


def snakemakes_settings(*profiles: Path):
    """What Snakemake's command line takes from `--profile` the first and `--workflow-profile` the
    second: the settings a run gets, read by Snakemake itself."""
    from snakemake.cli import parse_args

    arguments = ["--profile", str(profiles[0])]
    if len(profiles) > 1:
        arguments += ["--workflow-profile", str(profiles[1])]
    return parse_args(arguments)[1]


def as_written(value):
    """A setting as the profile wrote it (a resource's raw value, not Snakemake's object for it)."""
    if isinstance(value, Resource):
        return value.raw
    if hasattr(value, "items"):  # a mapping, or Snakemake's Resources
        return {key: as_written(entry) for key, entry in value.items()}
    if isinstance(value, list):
        return [as_written(entry) for entry in value]
    return value


def key_by_key(settings: dict) -> dict[tuple[str, str], object]:
    """{(rule, resource): value} of a set-resources mapping."""
    return {(rule, name): value for rule, entry in settings.items() for name, value in entry.items()}


@pytest.mark.parametrize("name", SWITCHES)
def test_a_switch_applied_to_a_labs_layer_keeps_every_key_of_the_profile_it_does_not_name(name, lab):
    cluster = name.split("-")[0]
    profile = lab / "scratchflow" / "profiles" / cluster
    applied = apply_switch(lab, name)
    layer = applied.layer
    assert layer == lab / "profiles" / cluster / "config.v8+.yaml"
    assert applied.arguments == f"--profile scratchflow/profiles/{cluster} --workflow-profile profiles/{cluster}"
    assert f"#   snakemake {applied.arguments}\n" in layer.read_text()
    switch = yaml.safe_load((RECIPES / "profiles" / f"{name}.yaml").read_text())
    scratchflows = yaml.safe_load((profile / "config.v8+.yaml").read_text())
    assert switch.keys() - {"set-resources", "set-threads"} <= {"precommand"}, "a new kind of key: check it below"
    alone, layered = snakemakes_settings(profile), snakemakes_settings(profile, layer.parent)

    named = key_by_key(switch.get("set-resources", {}))
    before, after = key_by_key(as_written(alone.set_resources)), key_by_key(as_written(layered.set_resources))
    assert {key: value for key, value in after.items() if key not in named} == {
        key: value for key, value in before.items() if key not in named
    }, "every resource of every rule the switch does not name, as scratchflow's profile has it"
    assert {key: after.get(key) for key in named} == named, "the switch's resources (null: none)"
    threads = {**as_written(alone.set_threads), **switch.get("set-threads", {})}
    assert as_written(layered.set_threads) == threads

    for key in (scratchflows.keys() | switch.keys()) - {"set-resources", "set-threads"}:
        setting = as_written(getattr(layered, key.replace("-", "_")))
        if key in switch:
            assert setting == os.path.expandvars(switch[key]), key  # as Snakemake reads a profile's text
        elif key == "jobs" and cluster == "narval":
            assert setting == 100, "the lab's own key, in the layer new_pipeline.py wrote"
        else:
            assert setting == as_written(getattr(alone, key.replace("-", "_"))), key
    assert layered.configfile == alone.configfile and layered.configfile[0].is_file(), "scratchflow's facts"


@pytest.mark.parametrize("name", SWITCHES)
def test_a_labs_pipeline_plans_with_each_switch_applied_to_its_layer(name, lab):
    applied = apply(lab, name)
    cluster = name.split("-")[0]
    profiles = ["--profile", f"scratchflow/profiles/{cluster}", "--workflow-profile", f"profiles/{cluster}"]
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.endswith(f"Run with:\n  snakemake {' '.join(profiles)}\n")
    layer = (lab / "profiles" / cluster / "config.v8+.yaml").read_text()
    assert f"# Applied: scratchflow/config/tests/profiles/{name}.yaml, over scratchflow " in layer
    planned = subprocess.run(
        [sys.executable, "-m", "snakemake", *profiles, "--dry-run"],
        cwd=lab,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**workflow_env(), "SLURM_CONF": "/dev/null"},
    )
    assert planned.returncode == 0, planned.stdout[-3000:]
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", planned.stdout.split("Job stats:", 1)[1], re.MULTILINE))
    assert int(jobs["train"]) == int(jobs["predict"]) == 2


def test_the_labs_own_keys_and_earlier_switches_stay_and_the_header_says_what_each_came_from(lab, tmp_path):
    """The lab's layer holds keys of its own (a whole set-resources with its train runtime, as the
    docs say to write one); a switch of scratchflow's and then one of the lab's own file change only
    what each names."""
    layer = lab / "profiles" / "narval" / "config.v8+.yaml"
    profile = lab / "scratchflow" / "profiles" / "narval"
    ours = yaml.safe_load(layer.read_text())
    ours["set-resources"] = yaml.safe_load((profile / "config.v8+.yaml").read_text())["set-resources"]
    ours["set-resources"]["train"]["runtime"] = 720
    ours["latency-wait"] = 120
    layer.write_text(yaml.safe_dump(ours))
    bigger_predictions = tmp_path / "bigger-predictions.yaml"
    bigger_predictions.write_text("set-resources:\n  predict:\n    mem_mb: 48000\n")

    assert apply(lab, "narval-one-node").returncode == 0
    applied = apply(lab, str(bigger_predictions), "--cluster", "narval")
    assert applied.returncode == 0, applied.stderr

    settings = snakemakes_settings(profile, layer.parent)
    train, predict = as_written(settings.set_resources["train"]), as_written(settings.set_resources["predict"])
    assert (train["runtime"], train["gpu"], train["cpus_per_task"], train["mem_mb"]) == (720, 4, 48, 64000)
    assert (predict["mem_mb"], predict["gpu"], predict["gpu_model"]) == (48000, 1, "a100")
    assert (settings.jobs, settings.latency_wait) == (100, 120)
    assert as_written(settings.set_threads) == {"train": 48, "predict": 6}
    header = [line for line in layer.read_text().splitlines() if line.startswith("# Applied: ")]
    assert [line.split(", over ")[0] for line in header] == [
        "# Applied: scratchflow/config/tests/profiles/narval-one-node.yaml",
        f"# Applied: {bigger_predictions}",
    ]
    assert "--workflow-profile profiles/narval" in layer.read_text()


def test_a_layer_that_would_drop_the_train_jobs_gpu_is_refused_by_make_test_and_written_whole_on_request(lab):
    """The layer 0.2.0 suggested, `set-resources: train: runtime: 720`, replaces scratchflow's
    set-resources whole: train would ask for no GPU, the default memory and no stop signal, and
    predict for nothing. `make test` refuses it in one line naming what it drops and the command that
    writes the layer whole; after that command the pipeline plans, with the lab's runtime and every
    other resource of scratchflow's."""
    layer = lab / "profiles" / "narval" / "config.v8+.yaml"
    layer.write_text(layer.read_text() + "set-resources:\n  train:\n    runtime: 720\n")
    environment = {**os.environ, **ACTIVATED, "SLURM_CONF": "/dev/null"}
    tested = subprocess.run(["make", "test"], cwd=lab, capture_output=True, text=True, env=environment)
    assert tested.returncode != 0
    refusal = [line for line in tested.stderr.splitlines() if line.startswith("scratchflow:")]
    assert refusal == [
        "scratchflow: the layer profiles/narval/config.v8+.yaml replaces scratchflow's narval profile's keys whole "
        "and drops set-resources: train's slurm_extra, cpus_per_task, mem_mb, GPUs; all of predict's (gpu, "
        "gpu_model, cpus_per_task, mem_mb, runtime) (train jobs would ask for no GPU and get no stop signal before "
        "their wall time): write it whole, your values kept: python scratchflow/scripts/apply_switch.py "
        "profiles/narval/config.v8+.yaml"
    ], tested.stderr[-3000:]
    assert "Traceback" not in tested.stderr

    written = apply(lab, "profiles/narval/config.v8+.yaml")
    assert written.returncode == 0, written.stderr
    profile = lab / "scratchflow" / "profiles" / "narval"
    settings = snakemakes_settings(profile, layer.parent)
    scratchflows = as_written(snakemakes_settings(profile).set_resources)
    assert as_written(settings.set_resources) == merged(scratchflows, {"train": {"runtime": 720}})
    assert settings.jobs == 100, "the layer's other keys stay"
    tested = subprocess.run(["make", "test"], cwd=lab, capture_output=True, text=True, env=environment)
    assert tested.returncode == 0, tested.stderr[-3000:]


def test_what_a_layer_drops_of_scratchflows_profile_is_named_and_a_switchs_exchanges_are_not():
    """The settings in effect against scratchflow's profile: a rule's GPU may change syntax and a
    several-node switch may remove `gpu`; the GPUs, the stop signal and every other resource stay."""
    profile = {
        "default-resources": {"mem_mb": 4000, "runtime": 60},
        "set-resources": {
            "train": {"gpu": 1, "gpu_model": "a100", "mem_mb": 64000, "slurm_extra": "--signal=USR1@600"},
            "predict": {"gpu": 1, "runtime": 30},
        },
        "set-threads": {"train": 12, "predict": 6},
    }

    def in_effect(
        train: dict, predict: dict | None = None, defaults=("mem_mb", "runtime"), threads=("train", "predict")
    ):
        rules = {"train": train} | ({"predict": predict} if predict is not None else {})
        names = {"set-resources": {rule: set(entry) for rule, entry in rules.items()}}
        return names | {"set-threads": set(threads), "default-resources": set(defaults)}, rules

    several_nodes = {"mem_mb": 64000, "nodes": 2, "slurm_extra": "--signal=USR1@600 --gpus-per-node=a100:4"}
    assert dropped_settings(profile, *in_effect(several_nodes, {"gres": "gpu:1", "runtime": 30})).lost == {}
    dropped = dropped_settings(profile, *in_effect({"runtime": 720}, None, ("runtime",), ("train",)))
    assert dropped.lost == {
        "set-resources": ["train's mem_mb, slurm_extra, GPUs", "all of predict's (gpu, runtime)"],
        "set-threads": ["predict"],
        "default-resources": ["mem_mb"],
    }
    assert dropped.train_gpus and dropped.stop_signal
    another_signal = {**several_nodes, "slurm_extra": "--qos=long --gpus-per-node=4"}
    dropped = dropped_settings(profile, *in_effect(another_signal, {"gpu": 1, "runtime": 30}))
    assert dropped.lost == {"set-resources": ["train's --signal=USR1@600 (in slurm_extra)"]}
    assert (dropped.train_gpus, dropped.stop_signal) == (False, True)
    on_cpu_on_purpose = {"gpu": 0, "mem_mb": 64000, "slurm_extra": "--signal=USR1@600"}
    assert dropped_settings(profile, *in_effect(on_cpu_on_purpose, {"gpu": 1, "runtime": 30})).lost == {}
    on_the_command_line = dropped_settings_line("narval", dropped, None, "scratchflow")
    assert on_the_command_line.startswith(
        "scratchflow: settings given over scratchflow's narval profile (on the command line, or in another "
        "profile) replace its keys whole and drop "
        "set-resources: train's --signal=USR1@600 (in slurm_extra) (train jobs would get no stop signal before "
        "their wall time): put the change in a switch file and apply it to your layer (python "
        "scratchflow/scripts/apply_switch.py FILE --cluster narval;"
    )


def test_what_cannot_be_applied_is_said_in_one_line_and_nothing_is_written(lab, tmp_path):
    layer = lab / "profiles" / "narval" / "config.v8+.yaml"
    written = layer.read_text()
    unknown = apply(lab, "narval-three-nodes")
    assert unknown.stderr.startswith("apply_switch.py: no switch narval-three-nodes: name one of scratchflow's (")
    assert "narval-several-nodes" in unknown.stderr and unknown.stderr.count("\n") == 1
    no_precommand = tmp_path / "no-precommand.yaml"
    no_precommand.write_text("precommand: null\n")
    removing = apply(lab, str(no_precommand), "--cluster", "narval")
    assert removing.stderr.startswith("apply_switch.py: the switch removes precommand, which scratchflow's profile")
    unknown_cluster = apply(lab, str(no_precommand))
    assert "scratchflow has no profile for the cluster 'no'" in unknown_cluster.stderr
    assert layer.read_text() == written
    clone = tmp_path / "a-fresh-clone"
    (clone / "scratchflow").mkdir(parents=True)  # its submodule not checked out yet
    uninitialised = apply(clone, "narval-one-node")
    assert uninitialised.stderr == (
        f"apply_switch.py: {clone}/scratchflow holds no scratchflow yet: run git submodule update --init in {clone}\n"
    )
    assert not (clone / "profiles").exists()


def test_a_switch_merges_into_a_profile_key_by_key_and_null_removes_a_key():
    profile = {"jobs": 50, "set-resources": {"train": {"gpu": 1, "mem_mb": 64000}, "predict": {"gpu": 1}}}
    switch = {"set-resources": {"train": {"gpu": None, "nodes": 2}}, "precommand": "module load python"}
    assert merged(profile, switch) == {
        "jobs": 50,
        "set-resources": {"train": {"mem_mb": 64000, "nodes": 2}, "predict": {"gpu": 1}},
        "precommand": "module load python",
    }
    assert profile["set-resources"]["train"] == {"gpu": 1, "mem_mb": 64000}, "the profile itself is unchanged"
    # Over a layer that holds its own set-resources (read whole by Snakemake), the switch merges into the layer's.
    layer = {"jobs": 100, "set-resources": {"train": {"runtime": 720}}}
    assert layer_with_switch(profile, layer, switch) == {
        "jobs": 100,
        "set-resources": {"train": {"runtime": 720, "nodes": 2}},
        "precommand": "module load python",
    }
    with pytest.raises(SwitchError, match="the switch removes jobs"):
        layer_with_switch(profile, layer, {"jobs": None})


def test_a_working_directory_of_scratchflows_own_folder_gets_the_layer_and_that_folder_is_never_written(tmp_path):
    """Run as docs/clusters.md's "Step by step" runs scratchflow: its Snakefile and profile from its
    clone, the workflow in a working directory of its own, where the layer goes. In scratchflow's own
    folder (here a copy of it) the switch is refused: its profiles are scratchflow's."""
    workdir = tmp_path / "experiments"
    workdir.mkdir()
    applied = apply(workdir, "oscer-one-node")
    assert applied.returncode == 0, applied.stderr
    profile = REPO / "profiles" / "oscer"
    run = f"--snakefile {REPO / 'Snakefile'} --profile {profile} --workflow-profile profiles/oscer"
    assert applied.stdout.endswith(f"Run with:\n  snakemake {run}\n")
    train = as_written(snakemakes_settings(profile, workdir / "profiles" / "oscer").set_resources["train"])
    assert (train["gres"], train["slurm_partition"], train["mem_mb"]) == ("gpu:2", "gpu", 32000)
    assert "nodes" not in train and train["slurm_extra"] == "--signal=USR1@600"

    scratchflow = tmp_path / "scratchflow"
    for folder in ("scripts", "profiles", "config/tests/profiles"):
        shutil.copytree(REPO / folder, scratchflow / folder, ignore=shutil.ignore_patterns("__pycache__"))
    before = (scratchflow / "profiles" / "oscer" / "config.v8+.yaml").read_text()
    refused = apply(scratchflow, "oscer-one-node", scratchflow=scratchflow)
    assert refused.stderr == (
        f"apply_switch.py: {scratchflow} is scratchflow's own folder, whose profiles are not yours to change: apply "
        "the switch in your pipeline's folder, or the working directory you run the workflow in (--pipeline DIR)\n"
    )
    assert (scratchflow / "profiles" / "oscer" / "config.v8+.yaml").read_text() == before
