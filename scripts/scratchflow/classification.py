"""What the classification tasks share at prediction time: batched predictions and their metrics."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from scratchflow.dataset import label_names, load_splits
from scratchflow.tasks import Predicted

if TYPE_CHECKING:
    import pandas as pd

# What the Hugging Face Trainer writes last into a checkpoint: the text and image tasks' marker of a
# complete one (here, not in hf_trainer: the workflow loads the tasks when it plans, and hf_trainer
# imports torch).
TRAINER_CHECKPOINT_MARKER = "trainer_state.json"


def check_no_target_column(config: dict[str, Any]) -> None:
    """A classification task predicts a label: a number to predict (a regression's) is not its data."""
    if config["dataset"].get("target_column"):
        raise ValueError(
            f"dataset.target_column: task {config['task']} predicts a label (dataset.label_column), not a "
            "number; remove target_column, which is for a task of your own that predicts one"
        )


def splits_and_labels(context: Any, read: Callable[[Path], list[Any]]) -> tuple[dict[str, list[Any]], list[str]]:
    """The staged data of a train or predict context as train/validation/test, and the labels of
    all of them in a fixed order (which fixes the model's label ids)."""
    splits = load_splits(context.data, context.dataset, read)
    return splits, label_names([item for split in splits.values() for item in split])


def predict_test_split(
    model: Any, context: Any, read: Callable[[Path], list[Any]], encode: Callable[[list[Any]], Any]
) -> Predicted:
    """Predict the test split with `model` (batches of twice the training batch size), and score it."""
    splits, labels = splits_and_labels(context, read)
    batch_size = context.params["batch_size"] * 2
    table = predict_in_batches(model, splits["test"], encode, batch_size, context.threads)
    return Predicted(
        metrics=classification_metrics(list(table["label"]), list(table["predicted"]), labels), predictions=table
    )


def predict_in_batches(
    model: Any, items: list[Any], encode: Callable[[list[Any]], Any], batch_size: int, threads: int
) -> pd.DataFrame:
    """One row per item (which has .id and .label): id, true label, predicted label, and the
    model's confidence in it. `encode` turns a batch of items into the model's keyword inputs."""
    import pandas as pd  # here: every training process imports this module, and trains without pandas
    import torch

    torch.set_num_threads(threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(device).eval()
    predicted: list[int] = []
    confidence: list[float] = []
    with torch.inference_mode():
        for start in range(0, len(items), batch_size):
            inputs = encode(items[start : start + batch_size]).to(device)
            probabilities = model(**inputs).logits.softmax(dim=-1)
            best = probabilities.max(dim=-1)
            predicted += best.indices.tolist()
            confidence += best.values.tolist()
    names = model.config.id2label
    return pd.DataFrame(
        {
            "id": [item.id for item in items],
            "label": [item.label for item in items],
            "predicted": [names[index] for index in predicted],
            "confidence": np.round(confidence, 6),
        }
    )


def classification_metrics(
    truth: Sequence[Hashable], predicted: Sequence[Hashable], labels: Sequence[Hashable]
) -> dict[str, Any]:
    """Accuracy, macro-F1, per-class precision/recall/F1 and the confusion matrix (rows: truth). The
    labels are a task's class names, or a classification head's indices while it trains."""
    index = {label: position for position, label in enumerate(labels)}
    confusion = np.zeros((len(labels), len(labels)), dtype=int)
    for true_label, predicted_label in zip(truth, predicted, strict=True):
        confusion[index[true_label], index[predicted_label]] += 1
    hits = np.diag(confusion)
    support = confusion.sum(axis=1)
    claimed = confusion.sum(axis=0)
    precision = np.divide(hits, claimed, out=np.zeros(len(labels)), where=claimed > 0)
    recall = np.divide(hits, support, out=np.zeros(len(labels)), where=support > 0)
    both = precision + recall
    f1 = np.divide(2 * precision * recall, both, out=np.zeros(len(labels)), where=both > 0)
    return {
        "accuracy": float(hits.sum() / max(confusion.sum(), 1)),
        "macro_f1": float(f1.mean()),
        "examples": int(confusion.sum()),
        "per_class": {
            label: {
                "precision": float(precision[i]),
                "recall": float(recall[i]),
                "f1": float(f1[i]),
                "support": int(support[i]),
            }
            for i, label in enumerate(labels)
        },
        "confusion_matrix": {"labels": labels, "rows_true_columns_predicted": confusion.tolist()},
    }
