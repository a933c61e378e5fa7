"""One function per workflow job: the lifecycle stage -> work -> sync back -> clean up.

Each takes plain values (the rule's entry script unpacks the `snakemake` object into them), so tests
run a whole job without Snakemake.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scratchflow import aggregation, checkpoints
from scratchflow.dataset import Example, label_names, load_examples, resolve_location, split_examples
from scratchflow.models import prefetch, switch_hub_off
from scratchflow.record import PhaseTimer, environment_record, output_to_log, stop_cleanly_on_sigterm
from scratchflow.staging import (
    archive_dataset,
    read_json,
    scratch_directory,
    stage_in,
    sync_back,
    write_json_atomically,
    written_whole,
)

log = logging.getLogger("scratchflow")


@contextlib.contextmanager
def job_context(log_path: str, threads: int = 1) -> Iterator[None]:
    """What every job needs: its output in the rule's log, SIGTERM that still cleans up, a fixed
    number of CPU threads, and a failure message in the log, not only in Snakemake's output."""
    stop_cleanly_on_sigterm()
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(threads)
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # progress bars make unreadable log files
    with output_to_log(log_path):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
        try:
            yield
        except BaseException as error:
            log.error("job failed: %s: %s", type(error).__name__, error)
            raise


def archive_job(*, dataset: dict[str, Any], archive: Path, manifest: Path) -> None:
    record = archive_dataset(resolve_location(dataset["path"]), archive, manifest, dataset)
    log.info("archived %(files)d files (%(bytes)d bytes) into one tar, sha256 %(sha256)s", record)


def prefetch_job(*, source: str, destination: Path, token_file: str | None) -> None:
    prefetch(source, destination, token_file)
    log.info("model %s cached in %s for offline loading", source, destination)


def _staged_splits(archive: Path, manifest: Path, scratch: Path, dataset: dict[str, Any]) -> dict[str, Any]:
    """Stage the dataset archive into scratch and split it as every job of this dataset does."""
    data_root = stage_in(archive, manifest, scratch)
    examples = load_examples(data_root, dataset["format"], dataset["text_column"], dataset["label_column"])
    return {
        "labels": label_names(examples),
        "splits": split_examples(
            examples, dataset["test_fraction"], dataset["validation_fraction"], dataset["split_seed"]
        ),
    }


def train_job(
    *,
    run_id: str,
    identity: dict[str, Any],
    resolved_config: dict[str, Any],
    archive: Path,
    manifest: Path,
    base_model: Path,
    scratch_root: str | None,
    checkpoint_folder: Path,
    checkpointing: dict[str, Any],
    threads: int,
    workflow_dir: Path,
    model_out: Path,
    params_out: Path,
    record_out: Path,
) -> None:
    """Stage the data in, fine-tune (resuming from shared checkpoints), sync the model back, clean up.

    One call is one piece of the run: a piece stopped by a signal saves its progress and fails, and
    the next attempt resumes. `record_out` is written last: its presence means the outputs are complete.
    """
    import torch

    from scratchflow.training import fine_tune

    torch.set_num_threads(threads)
    switch_hub_off()
    timer = PhaseTimer()
    params = identity["training"]
    data_record = read_json(manifest)
    checkpoints.claim(checkpoint_folder, {"run_id": run_id, **identity, "data_sha256": data_record["sha256"]})
    with (
        checkpoints.held(checkpoint_folder),
        _piece_of(checkpoint_folder) as piece,
        scratch_directory(scratch_root, f"train-{run_id}", timer) as scratch,
    ):
        log.info("run %s, piece %d: scratch %s", run_id, piece["piece"], scratch)
        with timer.phase("stage"):
            data = _staged_splits(archive, manifest, scratch, identity["dataset"])
        with timer.phase("train"):
            trained, metrics = fine_tune(
                splits=data["splits"],
                labels=data["labels"],
                model_dir=base_model,
                params=params,
                work_dir=scratch,
                shared_checkpoints=checkpoint_folder,
                save_every_steps=checkpointing["every_steps"],
                keep_checkpoints=checkpointing["keep"],
            )
        piece.update(resumed_from_step=metrics["resumed_from_step"], reached_step=metrics["global_steps"])
        with timer.phase("sync"):
            sync_back(trained, model_out)
            write_json_atomically(params, params_out)
    write_json_atomically(
        {
            "run_id": run_id,
            "run": identity,
            "config": resolved_config,
            "data": data_record,
            "training": metrics,
            "pieces": checkpoints.pieces(checkpoint_folder),
            "seed": params["seed"],
            "threads": threads,
            "timings_seconds": timer.seconds,
            "environment": environment_record(workflow_dir),
        },
        record_out,
    )
    log.info("run %s trained; phases (s): %s", run_id, timer.seconds)


@contextlib.contextmanager
def _piece_of(checkpoint_folder: Path) -> Iterator[dict[str, Any]]:
    """List this job in the run's pieces (the jobs that trained it, in order) with how it ended."""
    piece = {
        "piece": len(checkpoints.pieces(checkpoint_folder)) + 1,
        **checkpoints.this_process(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "outcome": "running",
    }
    checkpoints.record_piece(checkpoint_folder, piece)
    try:
        yield piece
    except BaseException as error:
        piece["outcome"] = f"{type(error).__name__}: {error}"
        raise
    else:
        piece["outcome"] = "finished"
    finally:
        piece["ended_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        checkpoints.record_piece(checkpoint_folder, piece)


def predict_job(
    *,
    run_id: str,
    identity: dict[str, Any],
    archive: Path,
    manifest: Path,
    model: Path,
    scratch_root: str | None,
    threads: int,
    workflow_dir: Path,
    predictions_out: Path,
    metrics_out: Path,
    record_out: Path,
) -> None:
    """Stage the test split and the trained model in, predict, sync predictions and metrics back."""
    import torch

    from scratchflow.prediction import classification_metrics, predict

    torch.set_num_threads(threads)
    switch_hub_off()
    timer = PhaseTimer()
    params = identity["training"]
    with scratch_directory(scratch_root, f"predict-{run_id}", timer) as scratch:
        with timer.phase("stage"):
            data = _staged_splits(archive, manifest, scratch, identity["dataset"])
            local_model = scratch / "model"
            sync_back(model, local_model)
        with timer.phase("predict"):
            test: list[Example] = data["splits"]["test"]
            table = predict(local_model, test, params["max_length"], params["batch_size"] * 2)
            metrics = classification_metrics(list(table["label"]), list(table["predicted"]), data["labels"])
            table.to_csv(scratch / predictions_out.name, index=False)
        with timer.phase("sync"):
            sync_back(scratch / predictions_out.name, predictions_out)
            write_json_atomically(metrics, metrics_out)
    write_json_atomically(
        {"run_id": run_id, "timings_seconds": timer.seconds, "environment": environment_record(workflow_dir)},
        record_out,
    )
    log.info("run %s: test accuracy %.4f, macro-F1 %.4f", run_id, metrics["accuracy"], metrics["macro_f1"])


def aggregate_job(
    *,
    runs: dict[str, dict[str, Path]],
    metric: str,
    summary_out: Path,
    best_out: Path,
    plot_out: Path,
) -> None:
    summary = aggregation.summarize(runs)
    best = aggregation.best_run(summary, metric)
    with written_whole(summary_out) as partial:
        summary.sort_values(metric, ascending=False).to_csv(partial, sep="\t", index=False)
    write_json_atomically(best, best_out)
    aggregation.plot_comparison(summary, metric, plot_out)
    log.info("best of %d runs by %s: %s (%.4f)", len(summary), metric, best["run_id"], best["value"])
