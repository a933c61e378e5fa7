"""The demo against its floor, on this machine in one run:
- the demo: `make demo`'s grid (config/config.yaml: 4 runs of all-MiniLM-L6-v2 on BBC News through
  the whole lifecycle with the local profile, `scripts/run_local.sh`), then its report;
- the floor: a hand-written script, one Python process, that trains and predicts the same 4 runs
  (same splits, model and settings, one after another with every core) and nothing else: no
  archive, staging, checkpoints, logs, figures or Snakemake.
The ratio is what the lifecycle costs on top of the work itself. Both report the test accuracy of
each setting (the mean of its seeds).

--busy-core keeps one core busy throughout (a loop pinned to the last core): a machine about half
as fast as this one, where `make demo` must still finish in 5 minutes.

    .venv/bin/python benchmarks/demo.py [--busy-core] [--repeats 1]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import yaml
from measure import REPO, Timing, arguments, print_table, run_timed, save, snakemake_env

DEMO_CONFIG = REPO / "config" / "config.yaml"


def demo(work: Path) -> tuple[Timing, Timing, dict[str, float]]:
    """The demo's grid and its report in a fresh folder: their times, and the test accuracy of each
    learning rate."""
    (work / "config").mkdir(parents=True)
    shutil.copy(DEMO_CONFIG, work / "config" / "config.yaml")
    local = str(REPO / "scripts" / "run_local.sh")
    grid = run_timed([local], cwd=work, env=snakemake_env())
    report = run_timed([local, "--report", "results/report.html"], cwd=work, env=snakemake_env())
    summary = pd.read_csv(work / "results" / "summary.tsv", sep="\t")
    accuracy = dict(zip(summary["learning_rate"].map(float), summary["accuracy_mean"], strict=True))
    return grid, report, accuracy


def floor(config_file: Path, accuracy_out: Path) -> None:
    """The hand-written script: load the data once, then train and predict each run in turn."""
    import numpy as np
    from scratchflow.dataset import label_names, load_examples, resolve_location, split_examples
    from scratchflow.tasks.text_classification import EncodedExamples
    from throughput import bare_arguments  # the benchmarks' hand-written Trainer settings
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        set_seed,
    )

    config = yaml.safe_load(config_file.read_text())
    dataset, training = config["dataset"], config["training"]
    examples = load_examples(resolve_location(dataset["path"]), "folder", "text", "label")
    splits = split_examples(
        examples, dataset["test_fraction"], dataset["validation_fraction"], seed=dataset["split_seed"]
    )
    labels = label_names(examples)
    label_ids = {label: index for index, label in enumerate(labels)}
    model_dir = resolve_location(config["model"]["source"])
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    encoded = {
        name: EncodedExamples(split, tokenizer, training["max_length"], label_ids) for name, split in splits.items()
    }
    accuracy: dict[float, list[float]] = {}
    with tempfile.TemporaryDirectory() as work:
        for learning_rate, seed in itertools.product(config["grid"]["learning_rate"], config["grid"]["seed"]):
            set_seed(seed)
            model = AutoModelForSequenceClassification.from_pretrained(
                model_dir, local_files_only=True, num_labels=len(labels)
            )
            params = {**training, "learning_rate": learning_rate, "seed": seed}
            arguments = bare_arguments(params, Path(work), workers=0)
            trainer = Trainer(
                model=model,
                args=arguments,
                train_dataset=encoded["train"],
                eval_dataset=encoded["validation"],
                data_collator=DataCollatorWithPadding(tokenizer),
            )
            trainer.train()
            predicted = trainer.predict(encoded["test"])
            hits = np.argmax(predicted.predictions, axis=-1) == predicted.label_ids
            accuracy.setdefault(float(learning_rate), []).append(float(hits.mean()))
    accuracy_out.write_text(json.dumps({rate: float(np.mean(values)) for rate, values in accuracy.items()}))


def timed_floor(work: Path) -> tuple[Timing, dict[str, float]]:
    """The floor as its own process (Python's start and the imports count, as for each job)."""
    accuracy = work / "floor-accuracy.json"
    timing = run_timed([sys.executable, __file__, "--floor", str(DEMO_CONFIG), str(accuracy)], env=snakemake_env())
    return timing, {float(rate): value for rate, value in json.loads(accuracy.read_text()).items()}


@contextlib.contextmanager
def busy_core(wanted: bool) -> Iterator[None]:
    """A loop pinned to the last core for as long as the block runs (if wanted)."""
    if not wanted:
        yield
        return
    core = max(os.sched_getaffinity(0))
    loop = subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        loop.kill()
        loop.wait()


def main() -> None:
    parser = arguments(__doc__.split("\n")[0])
    parser.set_defaults(repeats=1)
    parser.add_argument("--busy-core", action="store_true", help="keep one core busy throughout")
    parser.add_argument("--floor", nargs=2, type=Path, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.floor:
        floor(*options.floor)
        return
    demos, floors = [], []
    with busy_core(options.busy_core):
        for _ in range(options.repeats):
            with tempfile.TemporaryDirectory() as folder:
                demos.append(demo(Path(folder) / "demo"))
                floors.append(timed_floor(Path(folder)))
    grid, report, demo_accuracy = min(demos, key=lambda measured: measured[0].seconds + measured[1].seconds)
    floor_timing, floor_accuracy = min(floors, key=lambda measured: measured[0].seconds)
    demo_seconds = grid.seconds + report.seconds
    rows = [
        ["the demo's grid (make demo)", grid.seconds, grid.seconds / floor_timing.seconds],
        ["its report", report.seconds, report.seconds / floor_timing.seconds],
        ["the demo in all", demo_seconds, demo_seconds / floor_timing.seconds],
        ["the floor: one hand-written process", floor_timing.seconds, 1.0],
    ]
    print_table(
        f"The demo's 4 runs against the floor{' with one core kept busy' if options.busy_core else ''} (wall time)",
        ["", "seconds", "x floor"],
        rows,
    )
    print_table(
        "Test accuracy per learning rate (mean of its seeds)",
        ["learning rate", "demo", "floor"],
        [[f"{rate:g}", demo_accuracy[rate], floor_accuracy[rate]] for rate in sorted(demo_accuracy)],
    )
    save(
        options.json,
        "demo",
        {
            "busy_core": options.busy_core,
            "grid_seconds": grid.seconds,
            "report_seconds": report.seconds,
            "floor_seconds": floor_timing.seconds,
            "demo_to_floor": demo_seconds / floor_timing.seconds,
            "accuracy": {"demo": demo_accuracy, "floor": floor_accuracy},
        },
    )


if __name__ == "__main__":
    main()
