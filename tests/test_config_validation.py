"""Bad input fails at start-up, before any job runs, with a message that names the key and what was
expected. A few cases run the README's local command (those whose environment matters, and those
whose value a shell would run); the others run the start-up itself, `workflow_hooks.read_config`,
which the Snakefile calls before any job, in this process (a Snakemake start each would cost the suite
minutes for nothing more). Profile resources are checked in test_slurm."""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import REPO, run_workflow, workflow_config, write_config


def table(tmp_path: Path, rows: list[tuple[str, str]], header=("text", "label")) -> str:
    path = tmp_path / "data.csv"
    path.write_text(",".join(header) + "\n" + "".join(f'"{text}",{label}\n' for text, label in rows))
    return str(path)


def csv_dataset(rows, header=("text", "label")):
    """A mutation that points the config at a CSV file with these rows."""

    def mutate(config, tmp_path):
        config["dataset"].update(path=table(tmp_path, rows, header), format="csv")

    return mutate


GOOD_ROWS = [(f"article number {index} about {label}", label) for index in range(10) for label in ("sport", "tech")]


def set_key(section, **values):
    def mutate(config, _tmp_path):
        config[section].update(values)

    return mutate


def token_inside_workflow(config, tmp_path):
    (tmp_path / "hf-token").write_text("hf_not_a_real_token")
    config["model"]["token_file"] = str(tmp_path / "hf-token")


def command_task(grid=None, **training):
    def mutate(config, _tmp_path):
        config.update(task="command", aggregate={"metric": "accuracy"})
        config["training"] = {"command": ["python", "train.py"], **training}
        config["grid"] = grid or {"seed": [0]}

    return mutate


def launched_script(text: str, **training):
    """A command task that runs loop.py, holding `text`, through scratchflow.trainer_script."""

    def mutate(config, tmp_path):
        (tmp_path / "loop.py").write_text(text)
        command_task(command=["python", "-m", "scratchflow.trainer_script", "loop.py"], **training)(config, tmp_path)

    return mutate


def a_search(keep_grid: bool = False, **search):
    """A random search in place of the grid (beside it with keep_grid), with `search` replacing keys."""

    def mutate(config, _tmp_path):
        if not keep_grid:
            config.pop("grid")
        space = {"learning_rate": {"log_uniform": [1.0e-5, 1.0e-3]}}
        config["search"] = {"kind": "random", "trials": 2, "space": space, **search}

    return mutate


def image_folder(files: dict[str, bytes]):
    """An image-classification config on a folder holding `files` (path below it -> content)."""

    def mutate(config, tmp_path):
        for name, content in files.items():
            (tmp_path / "images" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "images" / name).write_bytes(content)
        config["task"] = "image-classification"
        config["dataset"].update(path=str(tmp_path / "images"))
        config["training"].pop("max_length")
        config["grid"] = {"seed": [0]}

    return mutate


def text_folder(files: dict[str, str]):
    """A text-classification config on a folder holding `files` (path below it -> text; a path
    ending in / is an empty folder)."""

    def mutate(config, tmp_path):
        for name, text in files.items():
            (tmp_path / "texts" / name).parent.mkdir(parents=True, exist_ok=True)
            if not name.endswith("/"):
                (tmp_path / "texts" / name).write_text(text)
        config["dataset"].update(path=str(tmp_path / "texts"))

    return mutate


# Six keys of 60 values, as a slip of the keyboard makes them: 60**6 = 46,656,000,000 runs, which
# expanding would take days; refused from the lists' lengths alone.
HUGE_GRID = {
    "learning_rate": [index / 1000 + 1.0e-5 for index in range(60)],
    "batch_size": list(range(1, 61)),
    "epochs": list(range(1, 61)),
    "max_length": list(range(8, 68)),
    "seed": list(range(60)),
    "warmup_ratio": [index / 100 for index in range(60)],
}


def without_wandb(config, tmp_path):
    """`tracking: wandb` where `import wandb` fails, as where the extra is not installed."""
    config["tracking"] = "wandb"
    (tmp_path / "no-wandb" / "wandb").mkdir(parents=True)
    (tmp_path / "no-wandb" / "wandb" / "__init__.py").write_text("raise ImportError('No module named wandb')\n")


def without_zstd(config, tmp_path):
    """`compression: zstd` where the zstd program is not on PATH: every other tool is."""
    config["dataset"]["compression"] = "zstd"
    tools = tmp_path / "no-zstd"
    tools.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        for tool in Path(folder).glob("*") if Path(folder).is_dir() else []:
            if tool.name != "zstd" and not (tools / tool.name).exists():
                (tools / tool.name).symlink_to(tool)


def png() -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("L", (8, 8)).save(buffer, format="PNG")
    return buffer.getvalue()


def split_files(columns: dict[str, tuple[str, str]], **extra):
    """A dataset of split CSV files (split -> its header); a split with no header is not written."""

    def mutate(config, tmp_path):
        splits = {}
        for name, header in columns.items():
            splits[name] = str(tmp_path / f"{name}.csv")
            if header:
                table(tmp_path, GOOD_ROWS, header)
                (tmp_path / "data.csv").rename(splits[name])
        config["dataset"] = {"name": "splits", "format": "csv", "splits": splits, **extra}

    return mutate


# case -> (mutation, texts the error must contain, environment)
CASES = {
    "unknown key": (set_key("training", epoch=3), ["training", "'epoch' was unexpected", "epochs"]),
    "unknown grid key": (set_key("grid", learnig_rate=[1.0e-4]), ["grid", "'learnig_rate' was unexpected"]),
    "wrong type": (set_key("grid", learning_rate=["1e-4"]), ["grid.learning_rate[0]", "1.0e-4"]),
    "empty grid": (lambda c, _t: c.update(grid={}), ["config key grid", "non-empty"]),
    "empty grid list": (set_key("grid", seed=[]), ["grid.seed", "should be non-empty"]),
    "a grid of 4.7 x 10^10 runs": (
        lambda c, _t: c.update(grid=HUGE_GRID),
        ["config key grid: 46,656,000,000 runs (batch_size (60) x epochs (60) x", "more than max_runs (100,000)"],
    ),
    "duplicate grid values": (set_key("grid", seed=[1, 1]), ["grid.seed", "non-unique"]),
    "zero learning rate": (set_key("training", learning_rate=0), ["training.learning_rate", "minimum of 0"]),
    "negative learning rate": (set_key("grid", learning_rate=[-1.0e-4]), ["grid.learning_rate[0]", "minimum of 0"]),
    "zero batch size": (set_key("training", batch_size=0), ["training.batch_size", "less than the minimum of 1"]),
    "zero epochs": (set_key("grid", epochs=[0]), ["grid.epochs[0]", "less than the minimum of 1"]),
    "warmup ratio of 1.5": (set_key("training", warmup_ratio=1.5), ["training.warmup_ratio", "maximum of 1"]),
    "checkpoint every 0 steps": (set_key("checkpointing", every_steps=0), ["checkpointing.every_steps"]),
    "a stop signal the trainer cannot take": (
        set_key("checkpointing", stop_signal="INT"),
        ["checkpointing.stop_signal", "USR1", "USR2", "HUP"],
    ),
    "FSDP misspelt": (set_key("training", fsdp="full_shrd"), ["training.fsdp", "'full_shrd' does not match"]),
    # The local profile asks for no GPU, and this test machine has none.
    "FSDP on a CPU-only run": (set_key("training", fsdp="full_shard"), ["training.fsdp", "this run has none"]),
    "unknown metric": (
        lambda c, _t: c.update(aggregate={"metric": "f1"}),
        ["aggregate.metric", "'f1' is not a metric", "macro_f1, accuracy"],
    ),
    "unknown format": (set_key("dataset", format="xlsx"), ["dataset.format", "'parquet'"]),
    "dataset name with a slash": (set_key("dataset", name="my/data"), ["dataset.name", "does not match"]),
    "test fraction above 1": (set_key("dataset", test_fraction=1.5), ["dataset.test_fraction", "maximum of 1"]),
    "fractions leave nothing to train": (
        set_key("dataset", test_fraction=0.6, validation_fraction=0.5),
        ["dataset.test_fraction (0.6) + dataset.validation_fraction (0.5) must be below 1"],
    ),
    "scratch root of the wrong type": (set_key("cluster", scratch_root=5), ["cluster.scratch_root", "'string'"]),
    "missing data path": (set_key("dataset", path="/no/such/data"), ["dataset.path", "/no/such/data"]),
    # Neither installed nor anywhere pip looks (here: a folder of no wheels): pip's reason, in one line.
    "a data package pip cannot fetch": (
        set_key("dataset", path="package:no_such_data_package/articles"),
        [
            "config key dataset.path: 'package:no_such_data_package/articles': no installed Python package named "
            "'no_such_data_package', and pip could not fetch its wheel (ERROR: No matching distribution found for "
            "no_such_data_package): install it where the workflow starts"
        ],
        {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": os.devnull},
    ),
    "file for a folder dataset": (set_key("dataset", format="csv"), ["dataset.path", "needs a file"]),
    "label column absent": (
        csv_dataset(GOOD_ROWS, header=("text", "topic")),
        ["dataset", "no column 'label'", "'topic'"],
    ),
    "text column with empty rows": (
        csv_dataset([*GOOD_ROWS, ("", "sport"), ("  ", "tech")]),
        ["dataset.text_column 'text': 2 example(s) (20, 21) have no text"],
    ),
    "one label only": (csv_dataset([(f"text {i}", "sport") for i in range(20)]), ["one label only (['sport'])"]),
    "missing local model": (set_key("model", source="./no-such-model"), ["model.source", "no config.json"]),
    "no model for a task that needs one": (
        lambda config, _tmp_path: config.update(model=None),
        ["config key model: task 'text-classification' needs a model (model.name and model.source)"],
    ),
    "hub model not cached, hub off": (
        set_key("model", source="no-such-org/no-such-model"),
        ["model.source", "HF_HUB_OFFLINE is set", "not in the local Hugging Face cache"],
        {"HF_HUB_OFFLINE": "1"},
    ),
    "token file inside the workflow": (token_inside_workflow, ["model.token_file", "inside the workflow's directory"]),
    # No config value reaches a shell: these are refused or stay data, never run.
    "shell in a grid value": (set_key("grid", learning_rate=["1e-4; touch pwned"]), ["grid.learning_rate[0]"]),
    "shell in the data path": (set_key("dataset", path="data-$(touch pwned)"), ["dataset.path", "'$'"]),
    "backticks in the model path": (set_key("model", source="./model-`touch pwned`"), ["model.source", "'`'"]),
    # Tasks: the task's own keys, its program, its data.
    "unknown task": (
        lambda c, _t: c.update(task="regression"),
        ["config key task", "'regression'", "command, image-classification, text-classification"],
    ),
    "a training key the task does not take": (
        set_key("training", command=["python", "train.py"]),
        ["config key training", "'command' was unexpected", "max_length"],
    ),
    "a command that is a shell string": (
        command_task(command="python train.py --lr 1"),
        ["config key training.command", "is not of type 'array'"],
    ),
    "a command whose program is not found": (command_task(command=["no-such-trainer"]), ["training.command", "PATH"]),
    "a script behind an interpreter that does not exist": (
        command_task(command=["python", "-u", "no_such_train.py"]),
        ["training.command: python would run 'no_such_train.py', which does not exist here"],
    ),
    "a typo in a command task's grid key": (
        command_task(command=["python"], learning_rate=1.0e-3, grid={"lerning_rate": [1.0e-3, 3.0e-3]}),
        ["grid.lerning_rate: not a parameter of the program", "did you mean 'learning_rate'?"],
    ),
    "a Trainer script launched that makes no Trainer": (
        launched_script("import torch\nfor step in range(10):\n    pass\n"),
        ["training.command: ", "loop.py makes no Trainer (no call of a class named *Trainer)"],
    ),
    "a parameter the launcher can give to no field and no flag of the script": (
        launched_script("from transformers import Trainer\ntrainer = Trainer()\n", dropout=0.1),
        ["training.dropout: scratchflow.trainer_script gives a parameter", "loop.py has neither"],
    ),
    "a command task without a metric to compare by": (
        lambda c, t: (command_task(command=["python"])(c, t), c.pop("aggregate")),
        ["aggregate.metric", "name the one to compare runs by"],
    ),
    "images with a text file among them": (
        image_folder({"cat/1.png": png(), "dog/1.png": png(), "dog/notes.txt": b"hello"}),
        ["dog/notes.txt", "not a PNG or JPEG"],
    ),
    "images with a broken one among them": (
        image_folder({"cat/1.png": png(), "dog/1.png": b"\x89PNG not really"}),
        ["dog/1.png", "not an image PIL can read"],
    ),
    "images of one label": (
        image_folder({f"cat/{i}.png": png() for i in range(10)}),
        ["one label only (['cat'])"],
    ),
    "an image label folder with no image in it": (
        image_folder({"cat/1.png": png(), "dog/1.png": png(), "bird/.gitkeep": b""}),
        ["images/bird: a label folder with no file in it"],
    ),
    "a text label folder with no text in it": (
        text_folder({"sport/1.txt": "a match", "tech/1.txt": "a chip", "politics/drafts/": ""}),
        ["texts/politics: a label folder with no file in it"],
    ),
    "an image folder without images": (
        image_folder({"readme.md": b"no images"}),
        ["no files inside label sub-folders"],
    ),
    "splits together with fractions": (
        split_files({"train": ("text", "label"), "test": ("text", "label")}, test_fraction=0.3),
        ["dataset.splits and dataset.test_fraction are both set"],
    ),
    "a split file missing": (
        split_files({"train": ("text", "label"), "test": ()}),
        ["dataset.splits.test", "does not exist"],
    ),
    "split files with other columns": (
        split_files({"train": ("text", "label"), "test": ("body", "label")}),
        ["dataset.splits.test", "['body', 'label'] differ from those of dataset.splits.train"],
    ),
    # Tracking: a backend that does not exist; W&B asked for where it is not installed.
    "an unknown tracking backend": (
        lambda c, _t: c.update(tracking="mlflow"),
        ["config key tracking", "'mlflow' is not one of ['tensorboard', 'wandb']"],
    ),
    "wandb asked for but not installed": (
        without_wandb,
        ["config key tracking: wandb needs the wandb package", "pip install -r requirements-wandb.txt"],
        {"PYTHONPATH": "no-wandb"},  # relative to the workflow's directory, where the mutation writes it
    ),
    # How the archive travels: a compression that does not exist, or that the machine lacks; no parts.
    "an unknown compression": (
        set_key("dataset", compression="gzip"),
        ["config key dataset.compression", "'gzip' is not one of ['none', 'zstd']"],
    ),
    "zstd asked for but not installed": (
        without_zstd,
        ["config key dataset.compression: zstd needs the zstd program", "apt-get install zstd"],
        {"PATH": f"{Path(sys.executable).parent}{os.pathsep}no-zstd"},  # relative to the workflow's directory
    ),
    "an archive in no parts": (
        set_key("dataset", archive_parts=0),
        ["config key dataset.archive_parts", "0 is less than the minimum of 1"],
    ),
    # Packing runs into cluster jobs: no runs to a job; packing where jobs run on this machine.
    "a pack of no runs": (
        set_key("cluster", pack_runs=0),
        ["config key cluster.pack_runs", "0 is less than the minimum of 1"],
    ),
    # An image of its own for a rule that runs where Snakemake runs: refused by a local run too.
    "an image for a rule that runs no job": (
        set_key("cluster", rule_image_variables={"aggregate": "SCRATCHFLOW_CPU_IMAGE"}),
        [
            "config key cluster.rule_image_variables: 'aggregate' is not a rule that runs as a job (the rules: "
            "archive_dataset, pack_predict, pack_train, predict, train, train_rung)"
        ],
    ),
    "packing with the local profile": (
        set_key("cluster", pack_runs=4),
        ["config key cluster.pack_runs: 4 packs runs into cluster jobs", "with the 'local' executor"],
    ),
    # A search instead of a grid (docs/search.md, "Searching beyond a grid"): a space that cannot be drawn.
    "a grid and a search": (a_search(keep_grid=True), ["config keys grid and search are both set"]),
    "neither a grid nor a search": (
        lambda config, _tmp_path: config.pop("grid"),
        ["config key grid: set grid: (lists of values, every combination a run) or search:"],
    ),
    "an unknown kind of search": (a_search(kind="bayesian"), ["config key search.kind", "'bayesian' is not one of"]),
    "a search of no trials": (a_search(trials=0), ["config key search.trials", "0 is less than the minimum of 1"]),
    "a log-uniform bound of 0": (
        a_search(space={"learning_rate": {"log_uniform": [0, 1.0e-3]}}),
        ["config key search.space.learning_rate: log_uniform [0, 0.001]"],
    ),
    "an empty choice": (
        a_search(space={"batch_size": {"choice": []}}),
        ["config key search.space.batch_size.choice", "should be non-empty"],
    ),
    "a space key the task does not take": (
        a_search(space={"learning_rat": {"log_uniform": [1.0e-5, 1.0e-3]}}),
        ["config key search.space.learning_rat: not a training key of this task; it takes: batch_size"],
    ),
    "the seed in the space": (
        a_search(space={"seed": {"int_uniform": [0, 9]}}),
        ["config key search.space.seed: seeds are replicates", "search.seeds"],
    ),
    "decimals drawn for an integer key": (
        a_search(space={"batch_size": {"uniform": [8, 64]}}),
        ["config key search.space.batch_size: batch_size takes integers, and uniform draws decimals"],
    ),
    "a bound the key does not take": (
        a_search(space={"warmup_ratio": {"uniform": [0.0, 1.5]}}),
        ["config key search.space.warmup_ratio: uniform [0.0, 1.5]: 1.5 is greater than or equal to the maximum"],
    ),
    "a search key of a program that does not take it": (
        lambda config, tmp_path: (
            command_task(command=["python"], lr=0.1)(config, tmp_path),
            config.pop("grid"),
            config.update(search={"kind": "random", "trials": 2, "space": {"lrr": {"uniform": [0.1, 1]}}}),
        ),
        ["search.space.lrr: not a parameter of the program", "did you mean 'lr'?"],
    ),
    # Successive halving: rungs it cannot climb, a share it cannot keep, nothing to rank on.
    "halving rungs that do not increase": (
        a_search(kind="halving", rungs=[2, 2, 4], keep=0.5),
        ["config key search.rungs: [2, 2, 4]: each rung must train to more epochs than the one before"],
    ),
    "halving that keeps every setting": (
        a_search(kind="halving", rungs=[1, 3], keep=1),
        ["config key search.keep", "1 is greater than or equal to the maximum of 1"],
    ),
    "halving without validation data": (
        lambda config, tmp_path: (
            a_search(kind="halving", rungs=[1, 3], keep=0.5)(config, tmp_path),
            config["dataset"].update(validation_fraction=0),
        ),
        ["config key dataset.validation_fraction: a halving search", "never the test split"],
    ),
    "halving over a program without epochs": (
        lambda config, tmp_path: (
            command_task(command=["python"], lr=0.1)(config, tmp_path),
            config.pop("grid"),
            config.update(
                search={
                    "kind": "halving",
                    "rungs": [1, 2],
                    "keep": 0.5,
                    "trials": 2,
                    "space": {"lr": {"choice": [0.1, 1]}},
                }
            ),
        ),
        ["config key training.epochs: a halving search", "SCRATCHFLOW_BUDGET_EPOCHS"],
    ),
    "a target column the table lacks": (
        lambda c, t: (
            command_task(command=["python", "-c", "pass"], seed=0)(c, t),
            csv_dataset(GOOD_ROWS)(c, t),
            c["dataset"].update(target_column="band_gap"),
        ),
        ["config key dataset.target_column: 'band_gap' is no column of", "data.csv; its columns: text, label"],
    ),
    "text and label in the same column": (
        lambda c, t: (csv_dataset(GOOD_ROWS)(c, t), c["dataset"].update(label_column="text")),
        ["dataset.text_column and dataset.label_column are both 'text'"],
    ),
}


# The cases run as a user runs the workflow: those that set the environment, those checked against the
# profile's resources (workflow_hooks.check_rule_resources, on Snakemake's rules), those whose value a
# shell would run, and one of the schema's and one of the task's.
RUN_AS_THE_README_SAYS = {
    *(case for case, (_mutate, _expected, *env) in CASES.items() if env),
    "FSDP on a CPU-only run",
    "an image for a rule that runs no job",
    "packing with the local profile",
    "shell in a grid value",
    "shell in the data path",
    "backticks in the model path",
    "zero batch size",
    "a training key the task does not take",
}


def refused_at_start_up(workdir: Path, monkeypatch, capsys) -> str:
    """What the workflow's start-up says of the config in `workdir`, run in this process as the
    Snakefile runs it (the config read from its file, as Snakemake reads it): it must refuse."""
    from scratchflow import workflow_hooks

    monkeypatch.chdir(workdir)
    monkeypatch.setattr(sys, "path", list(sys.path))  # a lab's task folder is added to both
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    workflow = SimpleNamespace(
        basedir=str(REPO), is_main_process=True, modifier=SimpleNamespace(resolved_rulename_modifier=None)
    )
    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    with pytest.raises(SystemExit) as refused:
        workflow_hooks.read_config(config, workflow)
    assert refused.value.code == 1
    captured = capsys.readouterr()
    return captured.out + captured.err


@pytest.mark.parametrize("case", CASES)
def test_invalid_config_fails_before_anything_runs(case, tmp_path, bbc_subset, tiny_model, monkeypatch, capsys):
    mutate, expected, *env = CASES[case]
    config = copy.deepcopy(workflow_config(bbc_subset, tiny_model, tmp_path / "scratch"))
    mutate(config, tmp_path)
    write_config(tmp_path, config, prefetched=False)
    if case in RUN_AS_THE_README_SAYS:
        result = run_workflow(tmp_path, check=False, env=env[0] if env else None)
        output = result.stdout
        assert result.returncode != 0
    else:
        output = refused_at_start_up(tmp_path, monkeypatch, capsys)
    assert "ConfigError" in output
    assert 'File "' not in output, "the mistake's line, without Python's frames after it"
    for text in expected:
        assert text in output
    assert not any((tmp_path / folder).exists() for folder in ("archives", "models", "results", "logs"))
    assert not list(tmp_path.rglob("pwned")), "a config value was run by a shell"


@pytest.mark.parametrize(
    ("stop_signal", "slurm_extra", "refused"),
    [
        ("USR1", "--signal=USR1@600", False),
        ("USR2", "--signal=USR2@600 --ntasks-per-node=1", False),
        ("HUP", "'--signal=SIGHUP@600 --container-image=x'", False),
        ("USR2", "--signal=12@600", False),  # by number
        ("USR1", None, False),  # no warning asked for (only SIGTERM at the limit): nothing to mismatch
        ("USR2", "--signal=USR1@600", True),
        ("USR1", "--signal=B:USR2@300", True),
        ("HUP", "--signal=10@600", True),
    ],
)
def test_the_profiles_wall_time_signal_must_be_the_one_the_trainer_listens_for(stop_signal, slurm_extra, refused):
    from scratchflow.config import ConfigError, check_stop_signal

    if not refused:
        check_stop_signal(stop_signal, slurm_extra)
        return
    with pytest.raises(ConfigError, match=rf"checkpointing.stop_signal: the trainer listens for SIG{stop_signal}"):
        check_stop_signal(stop_signal, slurm_extra)


def test_a_large_grid_is_announced_with_its_planning_cost_and_one_above_max_runs_refused():
    from scratchflow.config import ConfigError, check_run_count

    config = {"grid": {"learning_rate": list(range(100)), "seed": list(range(200))}, "max_runs": 100_000}
    assert check_run_count(config) == (
        "scratchflow: a grid of 20,000 runs (learning_rate (100) x seed (200)); planning it takes about "
        "66 s and 1.0 GB of memory on 2 cores"
    )
    assert check_run_count({**config, "grid": {"seed": list(range(9_999))}}) is None
    with pytest.raises(ConfigError, match=r"20,000 runs \(learning_rate \(100\) x seed \(200\)\), more than max_runs"):
        check_run_count({**config, "max_runs": 19_999})
    # Counted, never expanded: 60**6 points would take days to list.
    with pytest.raises(ConfigError, match=r"46,656,000,000 runs .* about 1,782 days and 2,332,800.0 GB"):
        check_run_count({"grid": HUGE_GRID, "max_runs": 100_000})


@pytest.mark.parametrize("model", [None, "absent"])
def test_a_task_without_a_model_plans_with_model_null_or_absent(model, tmp_path, bbc_subset, tiny_model):
    """`model: null`, which the schema allows, is no model, as an absent `model:` is."""
    config = copy.deepcopy(workflow_config(bbc_subset, tiny_model, tmp_path / "scratch"))
    command_task(seed=0)(config, tmp_path)
    if model is None:
        config["model"] = None
    else:
        del config["model"]
    write_config(tmp_path, config)
    (tmp_path / "train.py").write_text("")  # planned, not run
    planned = run_workflow(tmp_path, "--dry-run", check=False)
    assert planned.returncode == 0, planned.stdout[-3000:]
    assert "prefetch_model" not in planned.stdout and "train" in planned.stdout
