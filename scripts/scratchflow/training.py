"""Fine-tuning a transformer for text classification, resumable from shared checkpoints."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)
from transformers.utils import is_torch_tf32_available

from scratchflow import checkpoints
from scratchflow.dataset import Example
from scratchflow.staging import sync_back

log = logging.getLogger(__name__)


class EncodedExamples(torch.utils.data.Dataset):
    """Tokenized examples; padding happens per batch in the collator."""

    def __init__(self, examples: list[Example], tokenizer: Any, max_length: int, label_ids: dict[str, int]):
        self.encodings = tokenizer([example.text for example in examples], truncation=True, max_length=max_length)
        self.labels = [label_ids[example.label] for example in examples]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = {key: values[index] for key, values in self.encodings.items()}
        item["labels"] = self.labels[index]
        return item


class MirrorCheckpointsToShared(TrainerCallback):
    """After the trainer saves a checkpoint on scratch, copy it whole to shared storage."""

    def __init__(self, shared_folder: Path, keep: int):
        self.shared_folder = shared_folder
        self.keep = keep

    def on_save(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            newest = checkpoints.newest_complete_checkpoint(Path(args.output_dir))
            if newest is not None:
                checkpoints.mirror(newest, self.shared_folder, self.keep)
                log.info("checkpoint %s saved to %s", newest.name, self.shared_folder)


class TrainingStopped(RuntimeError):
    """Training stopped early on request (time limit near, job cancelled); its progress is saved."""


# USR1: Slurm's warning before the wall time (--signal=USR1@<seconds>). TERM: scancel, preemption,
# the time limit itself. Either way: save a checkpoint at the end of the current step, then stop.
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class StopOnSignal(TrainerCallback):
    """Turns a stop signal into "save a checkpoint now and stop"; also saves one after the last step,
    so that a run whose job dies after training resumes from its end instead of from zero."""

    def __init__(self) -> None:
        self.received: str | None = None

    @contextmanager
    def listening(self) -> Iterator[None]:
        previous = {number: signal.getsignal(number) for number in STOP_SIGNALS}
        for number in STOP_SIGNALS:
            signal.signal(number, self._receive)
        try:
            yield
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    def _receive(self, number: int, _frame: Any) -> None:
        self.received = signal.Signals(number).name
        log.warning("%s received: saving a checkpoint after the current step, then stopping", self.received)

    def on_step_end(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        if self.received or state.global_step >= state.max_steps:
            control.should_save = True
        if self.received:
            control.should_training_stop = True


def dataloader_workers(on_gpu: bool) -> int:
    """Batch-preparing processes, from the CPUs this job may use (Slurm's --cpus-per-task).

    On a GPU node, one CPU drives the GPU and the others prepare batches (at most 8: batches are
    tokenized up front, so more only cost memory). On CPU, every CPU computes the model: a worker
    process would take a CPU from it (benchmarks/throughput.py measures it)."""
    if not on_gpu:
        return 0
    return min(8, len(os.sched_getaffinity(0)) - 1)


def accuracy(evaluation: Any) -> dict[str, float]:
    logits, labels = evaluation
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


def fine_tune(
    *,
    splits: dict[str, list[Example]],
    labels: list[str],
    model_dir: Path,
    params: dict[str, Any],
    work_dir: Path,
    shared_checkpoints: Path,
    save_every_steps: int,
    keep_checkpoints: int,
) -> tuple[Path, dict[str, Any]]:
    """Fine-tune the model in `model_dir` on `splits['train']`, evaluating on `splits['validation']`.

    Works under `work_dir` (node-local scratch) and mirrors each checkpoint to `shared_checkpoints`
    (claimed for this run by the caller); training resumes from the newest complete one there.
    SIGUSR1 or SIGTERM stop it after saving a checkpoint (TrainingStopped).
    Returns the directory of the trained model (on scratch) and the training metrics.
    """
    label_ids = {label: index for index, label in enumerate(labels)}
    set_seed(params["seed"])  # before the model is built: the new classifier head is random
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir,
        local_files_only=True,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id=label_ids,
    )
    stop = StopOnSignal()
    on_gpu = torch.cuda.is_available()
    workers = dataloader_workers(on_gpu)
    arguments = TrainingArguments(
        output_dir=str(work_dir / "checkpoints"),
        learning_rate=params["learning_rate"],
        per_device_train_batch_size=params["batch_size"],
        per_device_eval_batch_size=params["batch_size"] * 2,
        num_train_epochs=params["epochs"],
        weight_decay=params["weight_decay"],
        warmup_steps=params["warmup_ratio"],  # a float below 1 is a ratio of all steps
        seed=params["seed"],
        bf16=params["bf16"],
        tf32=params["tf32"] and on_gpu and is_torch_tf32_available(),
        use_cpu=not on_gpu,
        dataloader_num_workers=workers,
        dataloader_persistent_workers=workers > 0,
        dataloader_pin_memory=on_gpu,
        eval_strategy="epoch" if splits["validation"] else "no",
        save_strategy="steps",
        save_steps=save_every_steps,
        save_total_limit=keep_checkpoints,
        logging_steps=10,
        disable_tqdm=True,
        report_to="none",
    )
    trainer = Trainer(
        model=model,
        args=arguments,
        train_dataset=EncodedExamples(splits["train"], tokenizer, params["max_length"], label_ids),
        eval_dataset=EncodedExamples(splits["validation"], tokenizer, params["max_length"], label_ids),
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        compute_metrics=accuracy,
        # Mirroring comes after StopOnSignal has asked for the checkpoint it then copies.
        callbacks=[stop, MirrorCheckpointsToShared(shared_checkpoints, keep_checkpoints)],
    )
    resume_from = _bring_newest_checkpoint(shared_checkpoints, work_dir / "checkpoints")
    with stop.listening():
        result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    if result.global_step < trainer.state.max_steps:
        raise TrainingStopped(
            f"stopped on {stop.received} at step {result.global_step} of {trainer.state.max_steps}; "
            f"checkpoint-{result.global_step} is saved in {shared_checkpoints} and the next attempt resumes from it"
        )
    logged_losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    metrics: dict[str, Any] = {
        # Over all pieces of a resumed run (the trainer's own figure covers only the last piece).
        "train_loss": float(np.mean(logged_losses)) if logged_losses else result.training_loss,
        "global_steps": result.global_step,
        "resumed_from_step": int(resume_from.name.split("-")[1]) if resume_from else None,
        "train_examples": len(splits["train"]),
        "validation_examples": len(splits["validation"]),
    }
    evaluations = [entry for entry in trainer.state.log_history if "eval_accuracy" in entry]
    if evaluations:
        metrics["validation_accuracy"] = evaluations[-1]["eval_accuracy"]
        metrics["validation_loss"] = evaluations[-1]["eval_loss"]
    trained = work_dir / "model"
    trainer.save_model(str(trained))
    return trained, metrics


def _bring_newest_checkpoint(shared_folder: Path, local_folder: Path) -> Path | None:
    """Copy the newest complete shared checkpoint to scratch, where the trainer resumes from it."""
    newest = checkpoints.newest_complete_checkpoint(shared_folder)
    if newest is None:
        return None
    local = local_folder / newest.name
    sync_back(newest, local)
    log.info("resuming from %s", newest)
    return local
