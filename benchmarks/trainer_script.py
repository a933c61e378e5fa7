"""What scratchflow.trainer_script costs a lab's Hugging Face Trainer script: the seconds of its
`trainer.train()` (the training loop, the script's own evaluations and saves each epoch included)
run by hand, and run through the launcher as a piece runs it (the Trainer patched, the callbacks
asking each step whether to stop or save), in turn. Then what checkpoints by time cost: the script
saving nothing of its own (`save_strategy="no"`, by hand; through the launcher as the run's
parameter), by hand and launched at the smallest interval (`every_minutes: 0.01`: the 1 % bound
alone decides when the next is due). The script is tests/trainer_script_lab/train.py, unchanged but
for its epochs; its data the BBC articles (60 a topic) as one CSV, its model a tiny BERT. Each
variant runs in a process of its own.

    .venv/bin/python benchmarks/trainer_script.py [--repeats 3] [--epochs 12]
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import REPO, arguments, bbc_articles, print_table, save

SCRIPT = REPO / "tests" / "trainer_script_lab" / "train.py"
# variant -> (seconds between checkpoints by time, None: by hand; whether the script saves each epoch)
VARIANTS = {
    "by hand": (None, True),
    "launched (every_minutes: 10)": (600.0, True),
    "by hand, no saves": (None, False),
    "launched, no saves of its own, every_minutes: 0.01": (0.6, False),
}


def one_run(
    work: Path, script: Path, data: Path, model: Path, save_every_seconds: float | None, saves: bool
) -> dict[str, float]:
    """The script's train() seconds, and the checkpoints it left, in a process of its own."""
    piece = work / f"piece-{time.monotonic_ns()}"
    (piece / "checkpoints").mkdir(parents=True)
    (piece / "output").mkdir()
    (piece / "params.json").write_text("{}" if saves else '{"save_strategy": "no"}')
    if save_every_seconds is None and not saves:
        script = script.with_name("train-no-saves.py")
    environment = {**os.environ, "PYTHONPATH": str(REPO / "scripts"), "OMP_NUM_THREADS": "1"}
    if save_every_seconds is not None:  # as the command task sets it for a piece
        environment |= {
            "SCRATCHFLOW_RUN_ID": "bench00000",
            "SCRATCHFLOW_CHECKPOINT_DIR": str(piece / "checkpoints"),
            "SCRATCHFLOW_OUTPUT_DIR": str(piece / "output"),
            "SCRATCHFLOW_PARAMS": str(piece / "params.json"),
            "SCRATCHFLOW_STOP_FILE": str(piece / "stop-requested"),
            "SCRATCHFLOW_SAVE_EVERY_SECONDS": str(save_every_seconds),
        }
    timing = piece / "train-seconds"
    driver = (
        "import runpy, sys, time\n"
        "from transformers import Trainer\n"
        "train = Trainer.train\n"
        "def timed(self, *a, **k):\n"
        "    started = time.perf_counter()\n"
        "    try:\n"
        "        return train(self, *a, **k)\n"
        "    finally:\n"
        f"        open({str(timing)!r}, 'w').write(str(time.perf_counter() - started))\n"
        "Trainer.train = timed\n"
        "from scratchflow import trainer_script\n"
        "trainer_script.launch(sys.argv[1:])\n"
    )
    subprocess.run(
        [sys.executable, "-c", driver, str(script), "--data", str(data), "--model", str(model)],
        cwd=piece,
        env=environment,
        check=True,
        capture_output=True,
    )
    folder = piece / "checkpoints" if save_every_seconds is not None else piece / "out"
    return {"seconds": float(timing.read_text()), "checkpoints": len(list(folder.glob("checkpoint-*")))}


def main() -> None:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    options = parser.parse_args()
    from scratchflow.tiny_model import build_tiny_bert

    with tempfile.TemporaryDirectory(prefix="trainer-script-") as folder:
        work = Path(folder)
        articles = bbc_articles(work / "articles", per_topic=60)
        texts = []
        with open(work / "news.csv", "w", newline="") as file:
            rows = csv.writer(file)
            rows.writerow(["text", "label"])
            for topic in sorted(articles.iterdir()):
                for article in sorted(topic.iterdir()):
                    texts.append(article.read_text(errors="replace"))
                    rows.writerow([texts[-1], topic.name])
        model = work / "tiny-bert"
        build_tiny_bert(texts, model)
        script = work / "train.py"
        text = SCRIPT.read_text().replace("num_train_epochs=4", f"num_train_epochs={options.epochs}")
        script.write_text(text)
        script.with_name("train-no-saves.py").write_text(text.replace('save_strategy="epoch"', 'save_strategy="no"'))
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
        for _ in range(options.repeats):  # in turn: noise only ever adds time, the fastest counts
            for name, (every, saves) in VARIANTS.items():
                runs[name].append(one_run(work, script, work / "news.csv", model, every, saves))
    fastest = {name: min(measured, key=lambda run: run["seconds"]) for name, measured in runs.items()}
    baseline = {name: "by hand" if saves else "by hand, no saves" for name, (_, saves) in VARIANTS.items()}
    figures = {
        name: {**run, "ratio_to_by_hand": round(run["seconds"] / fastest[baseline[name]]["seconds"], 4)}
        for name, run in fastest.items()
    }
    print_table(
        f"trainer.train() of the lab's script, {options.epochs} epochs (fastest of {options.repeats})",
        ["variant", "seconds", "x by hand (its kind)", "checkpoints"],
        [[name, run["seconds"], run["ratio_to_by_hand"], run["checkpoints"]] for name, run in figures.items()],
    )
    save(options.json, "trainer_script", {"epochs": options.epochs, "repeats": options.repeats, "variants": figures})
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
