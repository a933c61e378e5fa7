"""Our lab's own task: a small MLP on a CSV of numbers, in plain PyTorch (no Hugging Face), written
from docs/tasks.md, "Adding a task". The CSV has number columns and a label column
(dataset.label_column) holding each row's class, 0, 1, 2, ...

Its batches depend on (seed, epoch) alone and a checkpoint holds the weights, the optimizer and the
step, so a resumed run trains as an uninterrupted one would. A learning rate can be given by hand
to a piece while it trains: a number in the file `learning-rate` of its scratch folder, read at each
step (how we nudge a run we watch; scratchflow's tests give one to a piece that must write nothing).
"""

from __future__ import annotations

import csv
import json
import math
import random
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from scratchflow.dataset import DatasetError
from scratchflow.tasks import PredictContext, Predicted, TrainContext, Trained

METRICS = {"accuracy": "max", "loss": "min"}
WRITES_PREDICTIONS = True
LEARNING_RATE_BY_HAND = "learning-rate"


def check_settings(config: dict[str, Any]) -> None:
    if config["dataset"]["format"] != "csv":
        raise ValueError("config key dataset.format: ourlab.mlp reads csv")


def read_table(path: Path, label_column: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The features and labels of a CSV file; DatasetError for anything else."""
    if not path.is_file():
        raise DatasetError(f"{path}: not a CSV file of numbers (dataset.path)")
    with path.open(newline="") as table:
        rows = list(csv.DictReader(table))
    if not rows:
        raise DatasetError(f"{path}: no rows")
    if label_column not in rows[0]:
        raise DatasetError(f"dataset.label_column {label_column!r}: {path} has no such column")
    try:
        features = [[float(value) for key, value in row.items() if key != label_column] for row in rows]
        labels = [int(row[label_column]) for row in rows]
    except ValueError as error:
        raise DatasetError(f"{path}: {error}") from None
    return torch.tensor(features), torch.tensor(labels)


def splits(data: dict[str, Path], dataset: dict[str, Any]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """train, validation and test: the dataset's own split files, or its one file split here by its
    fractions and split_seed (context.data is never split for us)."""
    if "all" not in data:
        return {name: read_table(path, dataset["label_column"]) for name, path in data.items()}
    features, labels = read_table(data["all"], dataset["label_column"])
    order = list(range(len(labels)))
    random.Random(dataset["split_seed"]).shuffle(order)
    tests = round(len(order) * dataset["test_fraction"])
    validations = round(len(order) * dataset["validation_fraction"])
    parts = {
        "test": order[:tests],
        "validation": order[tests : tests + validations],
        "train": order[tests + validations :],
    }
    return {name: (features[rows], labels[rows]) for name, rows in parts.items() if rows}


def check_data(dataset: dict[str, Any], sources: dict[str, Path]) -> None:
    found = splits(sources, dataset)
    if "train" not in found or "test" not in found:
        raise DatasetError("dataset: too few rows for a train and a test split")


def mlp(inputs: int, hidden: int, classes: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(inputs, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, classes))


def evaluate(model: torch.nn.Module, features: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    with torch.no_grad():
        logits = model(features)
    return {
        "accuracy": float((logits.argmax(dim=1) == labels).float().mean()),
        "loss": float(torch.nn.functional.cross_entropy(logits, labels)),
    }


def save_checkpoint(context: TrainContext, step: int, model: torch.nn.Module, optimizer: Any) -> None:
    folder = context.checkpoint_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, folder / "state.pt")
    (folder / "COMPLETE").touch()  # last: the checkpoint is complete
    context.checkpoint_saved(folder)


def train(context: TrainContext) -> Trained | None:
    params = context.params
    torch.manual_seed(params["seed"])
    torch.set_num_threads(context.threads)
    data = splits(context.data, context.dataset)
    features, labels = data["train"]
    classes = 1 + max(int(split_labels.max()) for _, split_labels in data.values())
    model = mlp(features.shape[1], params["hidden"], classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=params["learning_rate"])
    steps_per_epoch = math.ceil(len(labels) / params["batch_size"])
    end = steps_per_epoch * (context.budget_epochs or params["epochs"])
    step = 0
    if context.resume_from:
        state = torch.load(context.resume_from / "state.pt")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    by_hand = context.work_dir / LEARNING_RATE_BY_HAND
    while step < end:
        if by_hand.is_file():
            for group in optimizer.param_groups:
                group["lr"] = float(by_hand.read_text())
        epoch, batch = divmod(step, steps_per_epoch)
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(params["seed"] * 1000 + epoch))
        rows = order[batch * params["batch_size"] : (batch + 1) * params["batch_size"]]
        loss = torch.nn.functional.cross_entropy(model(features[rows]), labels[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        stop = context.stop_requested()
        due = context.checkpoint_due(step)  # asked at every step, as stop_requested: processes agree
        if stop or due or step == end:
            save_checkpoint(context, step, model, optimizer)
        if stop:
            return None
        context.report_progress(step, end, loss.item())
    validation = evaluate(model, *data["validation"]) if "validation" in data else {}
    if context.budget_epochs:
        return Trained(output=context.work_dir, metrics={"validation": validation})
    output = context.work_dir / "model"
    output.mkdir()
    torch.save(model.state_dict(), output / "model.pt")
    (output / "shape.json").write_text(json.dumps({"inputs": features.shape[1], "classes": classes}))
    return Trained(output=output, metrics={"validation": validation, "train_examples": len(labels)})


def predict(context: PredictContext) -> Predicted:
    """The test split's metrics with its confusion matrix (the report draws the best run's), and one
    row per test example: its label, the predicted class and the model's confidence in it
    (predictions.csv)."""
    shape = json.loads((context.trained / "shape.json").read_text())
    classes = shape["classes"]
    model = mlp(shape["inputs"], context.params["hidden"], classes)
    model.load_state_dict(torch.load(context.trained / "model.pt"))
    features, labels = splits(context.data, context.dataset)["test"]
    with torch.no_grad():
        best = model(features).softmax(dim=1).max(dim=1)
    confusion = torch.bincount(labels * classes + best.indices, minlength=classes * classes).reshape(classes, -1)
    metrics = {
        **evaluate(model, features, labels),
        "confusion_matrix": {
            "labels": [str(label) for label in range(classes)],
            "rows_true_columns_predicted": confusion.tolist(),
        },
    }
    predictions = pd.DataFrame(
        {"label": labels.tolist(), "predicted": best.indices.tolist(), "confidence": best.values.tolist()}
    )
    return Predicted(metrics=metrics, predictions=predictions)
