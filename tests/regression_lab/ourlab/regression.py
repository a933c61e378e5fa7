"""Our lab's regression: an MLP in plain PyTorch that predicts a material's band gap (a number) from
the numeric columns of a CSV, judged by RMSE and MAE, lower is better. Written from docs/tasks.md,
"Adding a task": its data, its model and its figure; the piece prunes, times and reports the rest.
Batches depend on (seed, epoch) alone and a checkpoint holds all else: a resumed run trains alike."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from matplotlib.figure import Figure
from scratchflow.dataset import DatasetError, load_splits
from scratchflow.tasks import PredictContext, Predicted, TrainContext, Trained

METRICS = {"rmse": "min", "mae": "min"}  # the first ranks the runs
WRITES_PREDICTIONS = True
TRAINS_RUNGS = False  # no halving search: it trains its epochs, never a rung of them


@dataclass(frozen=True)
class Material:
    id: str
    features: list[float]
    target: float


def reader(dataset: dict[str, Any]):
    def read(path: Path) -> list[Material]:
        if not path.is_file():
            raise DatasetError(f"{path}: not a CSV file of numbers (dataset.path)")
        with path.open(newline="") as table:
            rows = list(csv.DictReader(table))
        target = dataset["target_column"]
        if not rows or target not in rows[0]:
            raise DatasetError(f"dataset.target_column {target!r}: {path} has no rows or no such column")
        try:
            return [
                Material(str(number), [float(value) for key, value in row.items() if key != target], float(row[target]))
                for number, row in enumerate(rows)
            ]
        except ValueError as error:
            raise DatasetError(f"{path}: {error}") from None

    return read


def splits(data: dict[str, Path], dataset: dict[str, Any]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """train, validation and test as (features, targets), split at random by dataset.target_column."""
    found = load_splits(data, dataset, reader(dataset))
    return {
        name: (torch.tensor([row.features for row in rows]), torch.tensor([row.target for row in rows]))
        for name, rows in found.items()
        if rows
    }


def check_data(dataset: dict[str, Any], sources: dict[str, Path]) -> None:
    splits(sources, dataset)


def mlp(inputs: int, hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(inputs, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))


def errors(model: torch.nn.Module, features: torch.Tensor, targets: torch.Tensor) -> tuple[dict, torch.Tensor]:
    with torch.no_grad():
        predicted = model(features).squeeze(1)
    rmse = float(((predicted - targets) ** 2).mean().sqrt())
    return {"rmse": rmse, "mae": float((predicted - targets).abs().mean())}, predicted


def train(context: TrainContext) -> Trained | None:
    params, batch_size = context.params, context.params["batch_size"]
    torch.manual_seed(params["seed"])
    data = splits(context.data, context.dataset)
    features, targets = data["train"]
    model = mlp(features.shape[1], params["hidden"])
    optimizer = torch.optim.Adam(model.parameters(), lr=params["learning_rate"])
    steps_per_epoch = -(-len(targets) // batch_size)
    end, step = steps_per_epoch * params["epochs"], 0
    if context.resume_from:
        state = torch.load(context.resume_from / "state.pt")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    while step < end:
        epoch, batch = divmod(step, steps_per_epoch)
        order = torch.randperm(len(targets), generator=torch.Generator().manual_seed(params["seed"] * 1000 + epoch))
        rows = order[batch * batch_size : (batch + 1) * batch_size]
        loss = torch.nn.functional.mse_loss(model(features[rows]).squeeze(1), targets[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        context.report_progress(step, end, loss.item())
        stop = context.stop_requested()
        due = context.checkpoint_due(step)  # asked at every step's end, as stop_requested
        if stop or due or step == end:
            folder = context.checkpoint_dir / f"checkpoint-{step}"
            folder.mkdir(exist_ok=True)
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            torch.save(state, folder / "state.pt")
            (folder / "COMPLETE").touch()  # last: the checkpoint is complete
            context.checkpoint_saved(folder)
        if stop:
            return None
    output = context.work_dir / "model"
    output.mkdir()
    torch.save(model.state_dict(), output / "model.pt")
    validation = errors(model, *data["validation"])[0] if "validation" in data else {}
    return Trained(output=output, metrics={"validation": validation, "train_examples": len(targets)})


def predict(context: PredictContext) -> Predicted:
    """The test split's RMSE and MAE, a row per material, and the predictions against the truth."""
    features, targets = splits(context.data, context.dataset)["test"]
    model = mlp(features.shape[1], context.params["hidden"])
    model.load_state_dict(torch.load(context.trained / "model.pt"))
    metrics, predicted = errors(model, features, targets)
    axes = (figure := Figure(figsize=(4, 4))).subplots()
    axes.scatter(targets, predicted, s=10)
    ends = [float(min(targets.min(), predicted.min())), float(max(targets.max(), predicted.max()))]
    axes.plot(ends, ends, color="grey", linewidth=1)
    axes.set(xlabel="true band gap (eV)", ylabel="predicted band gap (eV)", title=f"RMSE {metrics['rmse']:.3f}")
    table = pd.DataFrame({"band_gap": targets.tolist(), "predicted": predicted.tolist()})
    return Predicted(metrics=metrics, predictions=table, figures={"predicted_vs_true": figure})
