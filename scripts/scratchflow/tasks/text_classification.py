"""text-classification: fine-tune a Hugging Face transformer (AutoModelForSequenceClassification) on
labelled texts: a table with a text and a label column, or a folder per label of text files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scratchflow.classification import (
    TRAINER_CHECKPOINT_MARKER,
    check_no_target_column,
    predict_test_split,
    splits_and_labels,
)
from scratchflow.dataset import DatasetError, Example, check_labelled, describe, load_examples
from scratchflow.tasks import PredictContext, Predicted, TrainContext, Trained

CHECKPOINT_MARKER = TRAINER_CHECKPOINT_MARKER
NEEDS_MODEL = True
METRICS = {"macro_f1": "max", "accuracy": "max"}
WRITES_PREDICTIONS = True


def read(dataset: dict[str, Any]):
    def read_texts(path: Path) -> list[Example]:
        return load_examples(path, dataset["format"], dataset["text_column"], dataset["label_column"])

    return read_texts


def check_settings(config: dict[str, Any]) -> None:
    dataset = config["dataset"]
    check_no_target_column(config)
    if dataset["format"] != "folder" and dataset["text_column"] == dataset["label_column"]:
        raise DatasetError(
            f"dataset.text_column and dataset.label_column are both {dataset['text_column']!r}: "
            "the label would be part of the text the model learns from"
        )


def check_data(dataset: dict[str, Any], sources: dict[str, Path]) -> None:
    """Texts present, labels present, two labels or more, splits that leave something to train on."""
    found = {name: read(dataset)(path) for name, path in sources.items()}
    without_text = [example for examples in found.values() for example in examples if not example.text.strip()]
    if without_text:
        raise DatasetError(
            f"dataset.text_column {dataset['text_column']!r}: {describe(without_text)} have no text; "
            "remove them or fill them in"
        )
    check_labelled(found, sources, dataset)


def check_model(model_dir: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    AutoConfig.from_pretrained(model_dir, local_files_only=True)
    AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


class EncodedExamples:
    """Tokenized examples (a torch map-style dataset); padding happens per batch in the collator."""

    def __init__(self, examples: list[Example], tokenizer: Any, max_length: int, label_ids: dict[str, int]):
        self.encodings = tokenizer([example.text for example in examples], truncation=True, max_length=max_length)
        self.labels = [label_ids[example.label] for example in examples]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = {key: values[index] for key, values in self.encodings.items()}
        item["labels"] = self.labels[index]
        return item


def train(context: TrainContext) -> Trained | None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, set_seed

    from scratchflow import hf_trainer

    params = context.params
    splits, labels = splits_and_labels(context, read(context.dataset))
    label_ids = {label: index for index, label in enumerate(labels)}
    set_seed(params["seed"])  # before the model is built: the new classifier head is random
    tokenizer = AutoTokenizer.from_pretrained(context.model, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(
        context.model,
        local_files_only=True,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id=label_ids,
    )
    trainer, figures = hf_trainer.train(
        context,
        model=model,
        args=hf_trainer.training_arguments(context, has_validation=bool(splits["validation"])),
        train_dataset=EncodedExamples(splits["train"], tokenizer, params["max_length"], label_ids),
        # No validation split (dataset.splits without one): nothing to evaluate, and a tokenizer
        # called on no texts at all fails.
        eval_dataset=EncodedExamples(splits["validation"], tokenizer, params["max_length"], label_ids)
        if splits["validation"]
        else None,
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
    )
    if figures is None:
        return None  # stopped on request, its checkpoint saved
    trained = context.work_dir / "model"
    trainer.save_model(str(trained))
    return Trained(output=trained, metrics=figures)


def predict(context: PredictContext) -> Predicted:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(context.trained, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(context.trained, local_files_only=True)

    def encode(batch: list[Example]) -> Any:
        texts = [example.text for example in batch]
        max_length = context.params["max_length"]
        return tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt")

    return predict_test_split(model, context, read(context.dataset), encode)
