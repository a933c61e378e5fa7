"""A run's prediction of its test split, made by its train job as the run ends, or by its predict job.

A train job that ends its run has what predicting needs on its node already: the data staged, the
trained model on scratch (rank 0's, of a run of several processes or nodes), and, for a run trained
in this process, the task's code imported. It predicts there, in the job's own process
(`predict_at_end`), and publishes the prediction beside the run through the run's gate, in
`results/runs/<run_id>/predicted-in-training/` (`MADE` last: the folder is whole), tied to the
piece that trained the model. The run's predict job, finding it for the model the run's record
names (`made_for`), runs in the workflow's own Snakemake, not as a cluster job, and moves it into
place (`place`): one GPU job and its wait in the queue less per run. Where it finds none (a stop or a
failure while predicting, `--forcerun predict`, a changed predict), it predicts in a job of its
own, as before.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scratchflow import signals, slurm_job
from scratchflow.figures import save_png
from scratchflow.files import read_json, remove_whole, write_json_atomically
from scratchflow.lease import RunFolder
from scratchflow.ledger import PieceRecord
from scratchflow.record import environment_record
from scratchflow.tasks import PredictContext, check_predicted, load_task, numbers
from scratchflow.timing import PhaseTimer

log = logging.getLogger(__name__)

METRICS = "metrics.json"
PREDICTIONS = "predictions.csv"
FIGURES = "figures"
MADE = "made.json"  # by which piece, in how many threads, how long it took, where it ran
# The train job predicts only with at least this long left before Slurm's warning of the time
# limit: a prediction is no checkpoint, and one cut short costs the job (the predict job predicts).
MARGIN_BEFORE_THE_WARNING_SECONDS = 600


class PredictionCut(Exception):
    """A stop signal came while the train job predicted."""


def predict_into(task: str, context: PredictContext, folder: Path) -> dict[str, Any]:
    """The task's prediction of the test split, written into `folder`: metrics.json, predictions.csv
    (for a task that writes predictions), figures/<name>.png. Returns the metrics."""
    predicted = check_predicted(task, load_task(task).predict(context))
    folder.mkdir(parents=True, exist_ok=True)
    if predicted.predictions is not None:
        predicted.predictions.to_csv(folder / PREDICTIONS, index=False)
    write_json_atomically(predicted.metrics, folder / METRICS, durable=False)
    write_figures(predicted.figures, folder / FIGURES)
    return predicted.metrics


def write_figures(figures: dict[str, Any], folder: Path) -> None:
    """A run's figures as `folder/<name>.png`, each closed once saved; `folder` holds these alone
    (one an earlier prediction of the run drew goes), and none is no folder."""
    if folder.exists():
        remove_whole(folder)
    for name, figure in figures.items():
        save_png(figure, folder / f"{name}.png", dpi=100)


def predict_at_end(
    context: PredictContext,
    task: str,
    entry: PieceRecord,
    run_folder: RunFolder,
    destination: Path,
    workflow_dir: Path,
    warning_lead_seconds: int | None,
) -> None:
    """The train job's prediction, published whole at `destination` beside the run, tied to its piece
    (`entry`). None where a stop was asked, too little time is left, or the task's predict failed (the
    predict job then predicts, and reports that failure): the run's training is done, and stays so.
    A stop signal while it predicts cuts it short, and is left in the stop file as before."""
    stop_file = context.work_dir / signals.STOP_FILE_NAME
    if stop_file.exists():
        return
    left = slurm_job.seconds_before_the_warning(warning_lead_seconds)
    if left is not None and left < MARGIN_BEFORE_THE_WARNING_SECONDS:
        log.info("run %s: %.0f s left before the time limit's warning: the predict job predicts", context.run_id, left)
        return
    folder = context.work_dir / "predicted-in-training"
    timer = PhaseTimer()
    gc.collect()  # the trainer's objects, before a second model is loaded beside them
    _free_accelerator_memory()
    try:
        with timer.phase("predict"), _cut_by_a_stop(stop_file):
            metrics = predict_into(task, context, folder)
    except PredictionCut as stop:
        log.info("run %s: %s while predicting at the end of training: the predict job predicts", context.run_id, stop)
        return
    except Exception as error:  # the lab's predict: its own job says it again, with its traceback
        log.warning(
            "run %s: predicting at the end of training failed (the predict job predicts): %s: %s",
            *(context.run_id, type(error).__name__, error),
        )
        return
    made = {
        "files": sorted(path.name for path in folder.iterdir()),
        "piece": entry.piece,
        "piece_started_at": entry.started_at,
        "threads": context.threads,
        "timings_seconds": timer.seconds,
        "environment": environment_record(workflow_dir),
    }
    write_json_atomically(made, folder / MADE, durable=False)
    run_folder.publish_copy(folder, destination)
    log.info("run %s: predicted at the end of training, test metrics %s", context.run_id, numbers(metrics))


def made_for(folder: Path, train_record: dict[str, Any], predictions: bool = False) -> dict[str, Any] | None:
    """What `folder` (the train job's prediction) says of itself, where it holds every file it names
    (`predictions`: predictions.csv among them) and was made by the piece that finished the run its
    record describes; None otherwise."""
    made_file = folder / MADE
    if not made_file.is_file():
        return None
    made = read_json(made_file)
    last = (train_record.get("pieces") or [{}])[-1]
    if (made.get("piece"), made.get("piece_started_at")) != (last.get("piece"), last.get("started_at")):
        return None
    files = made.get("files", [])
    if METRICS not in files or (predictions and PREDICTIONS not in files):
        return None
    return made if all((folder / name).exists() for name in files) else None


def place(folder: Path, metrics_out: Path, predictions_out: Path | None, figures_out: Path) -> dict[str, Any]:
    """The train job's prediction in `folder` moved into the run's outputs (renames on the same
    filesystem; its MADE removed first, so that a move cut short is never taken for whole). Returns
    the metrics."""
    (folder / MADE).unlink()
    metrics = read_json(folder / METRICS)
    if predictions_out is not None:
        os.replace(folder / PREDICTIONS, predictions_out)
    if figures_out.exists():
        remove_whole(figures_out)
    if (folder / FIGURES).is_dir():
        os.rename(folder / FIGURES, figures_out)
    os.replace(folder / METRICS, metrics_out)
    return metrics


@contextlib.contextmanager
def _cut_by_a_stop(stop_file: Path) -> Iterator[None]:
    def cut(number: int, _frame: Any) -> None:
        name = signal.Signals(number).name
        signals.write_stop_file(stop_file, name)
        raise PredictionCut(name)

    with signals.listening(cut):
        yield


def _free_accelerator_memory() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
