"""Helpers for a lab's own program run by `task: command` (docs/tasks.md, "Your own training code"):
one call per concern, each giving back what it is given when the program runs by hand, outside
scratchflow (no SCRATCHFLOW_RUN_ID), so that the same script serves both.

    from scratchflow import program as scratchflow
    args = parser.parse_args(scratchflow.arguments(parser))       # the run's parameters as its flags
    frame = pd.read_csv(scratchflow.data_file(args.data))         # the data on node-local scratch
    state = torch.load(scratchflow.resume_from(args.resume, "checkpoint.pt"))  # if not None
    if scratchflow.checkpoint_due(step, steps, by_hand=step % args.save_every == 0):  # each step's end
        scratchflow.save({"model": ..., "step": step}, step, by_hand=args.checkpoint)
    torch.save(model.state_dict(), scratchflow.output_file(args.out))
    scratchflow.write_metrics({"test_loss": ...})
    scratchflow.end_if_diverged(loss.item(), step)                # each step's end, before its checkpoint

`save` writes the checkpoint on scratch with COMPLETE last and, after a stop, ends the program as a
pause. scratchflow.trainer_script builds on these for the Hugging Face Trainer."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scratchflow.schedule import CheckpointInterval, CheckpointSchedule
from scratchflow.signals import stop_signals

log = logging.getLogger("scratchflow.program")

CHECKPOINT_MARKER = "COMPLETE"  # the command task's: the last file of a checkpoint
# In $SCRATCHFLOW_OUTPUT_DIR, of a program whose training diverged: {"step", "detail"} (end_as_diverged).
DIVERGED_FILE = "diverged.json"
# An evaluation's figures that time it, not the model (the Hugging Face Trainer's): never the same twice.
TIMINGS = ("runtime", "samples_per_second", "steps_per_second", "model_preparation_time")


def under_scratchflow(environ: Mapping[str, str] = os.environ) -> bool:
    return bool(environ.get("SCRATCHFLOW_RUN_ID"))


def params() -> dict[str, Any]:
    """The run's parameters (its `training:` keys but `command`); {} by hand."""
    path = os.environ.get("SCRATCHFLOW_PARAMS")
    return json.loads(Path(path).read_text()) if path else {}


def arguments(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> list[str]:
    """The program's command-line words (`argv`, else its own), then the run's parameters that are
    flags of `parser` (`max_length` → `--max-length 128`; true → the bare flag, false → nothing):
    for `parser.parse_args(...)`, where the last of a flag wins."""
    declared = {option for action in parser._actions for option in action.option_strings}
    return [*(sys.argv[1:] if argv is None else argv), *flag_words(params(), declared)]


def flag_of(key: str, options: set[str]) -> str | None:
    """The option of `options` that a parameter `key` names: `--max-length` or `--max_length`."""
    return next((flag for flag in (f"--{key.replace('_', '-')}", f"--{key}") if flag in options), None)


def flag_words(run: Mapping[str, Any], options: set[str]) -> list[str]:
    """The parameters of `run` that name one of `options`, as command-line words."""
    words: list[str] = []
    for key, value in sorted(run.items()):
        flag = flag_of(key, options)
        if flag is not None and value is not False:
            words += [flag] if value is True else [flag, str(value)]
    return words


def data_file(by_hand: str | Path) -> str:
    """The run's one-file dataset on node-local scratch; `by_hand` outside scratchflow."""
    return os.environ.get("SCRATCHFLOW_DATA_FILE") or str(by_hand)


def data_dir(by_hand: str | Path) -> str:
    """The run's data folder on node-local scratch; `by_hand` outside scratchflow."""
    return os.environ.get("SCRATCHFLOW_DATA_DIR") or str(by_hand)


def model_dir(by_hand: str) -> str:
    """The config's prefetched model (`model:`); `by_hand` (a hub id, a folder) outside scratchflow."""
    return os.environ.get("SCRATCHFLOW_MODEL_DIR") or by_hand


def output_dir(by_hand: str | Path) -> str:
    """Where the trained model goes: the run's output folder, synced back to results/runs/<run_id>/model/."""
    return os.environ.get("SCRATCHFLOW_OUTPUT_DIR") or str(by_hand)


def output_file(by_hand: str | Path) -> str:
    """A file of the trained model: of its name, in the run's output folder; `by_hand` outside scratchflow."""
    folder = os.environ.get("SCRATCHFLOW_OUTPUT_DIR")
    return str(Path(folder) / Path(by_hand).name) if folder else str(by_hand)


def resume_from(by_hand: Any = None, file: str | None = None) -> Any:
    """The piece's newest complete checkpoint (its `file`, where given), None on a first start;
    `by_hand` outside scratchflow."""
    if not under_scratchflow():
        return by_hand
    folder = os.environ.get("SCRATCHFLOW_RESUME_FROM")
    return None if not folder else str(Path(folder) / file) if file else folder


class StopRequest:
    """The stop signal and SIGTERM, heard as a flag (Slurm may send one twice: a flag, never a second
    save at once); the stop file too, for a stop that came before the handlers were set."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self.stop_file = Path(os.environ.get("SCRATCHFLOW_STOP_FILE", "")) if under_scratchflow() else None
        for number in stop_signals():
            signal.signal(number, self._receive)

    def _receive(self, number: int, _frame: Any) -> None:
        if self.signal is None:
            log.warning("%s received: saving a checkpoint after this step, then pausing", signal.Signals(number).name)
        self.signal = signal.Signals(number).name

    @property
    def asked(self) -> bool:
        if self.signal is None and self.stop_file is not None and self.stop_file.is_file():
            self.signal = self.stop_file.read_text() or "a stop request"
        return self.signal is not None

    def tell_the_piece(self) -> None:
        """A stop this program heard alone (a signal to its own process, not to the job's) left in
        the stop file (on scratch), so that the piece records a pause, not a program that ended
        without its metrics."""
        if self.signal is not None and self.stop_file is not None and not self.stop_file.exists():
            self.stop_file.write_text(self.signal)


class ProgramPiece:
    """The piece, as its program sees it: whether to stop (the signals), whether a checkpoint is due
    (SCRATCHFLOW_SAVE_EVERY_SECONDS and _STEPS, by the program's own clock)."""

    budget_epochs = None  # a halving search's rungs are not driven by these helpers

    def __init__(self, environ: Mapping[str, str] = os.environ) -> None:
        steps = environ.get("SCRATCHFLOW_SAVE_EVERY_STEPS")
        minutes = float(environ.get("SCRATCHFLOW_SAVE_EVERY_SECONDS", "600")) / 60
        self.schedule = CheckpointSchedule(CheckpointInterval(minutes, int(steps) if steps else None))
        self.stop = StopRequest()

    def stop_requested(self) -> bool:
        return self.stop.asked

    def checkpoint_due(self, step: int) -> bool:
        return self.schedule.due(step)

    def saved(self, step: int) -> None:
        self.schedule.published(step, time.monotonic())


_piece: ProgramPiece | None = None


def piece() -> ProgramPiece:
    """This program's one ProgramPiece: its signal handlers are set once, at the first call."""
    global _piece
    if _piece is None:
        _piece = ProgramPiece()
    return _piece


def stopped() -> bool:
    """Whether the piece was asked to stop (by hand: never)."""
    return under_scratchflow() and piece().stop.asked


def end_if_stopped() -> None:
    """A stopped piece ends here (exit 0, no metrics.json: paused), its checkpoint saved."""
    if stopped():
        piece().stop.tell_the_piece()
        log.warning("paused at the checkpoint just saved: the next piece resumes from it")
        raise SystemExit(0)


def end_if_diverged(loss: float, step: int) -> None:
    """At the end of `step`, before its checkpoint: a `loss` that is NaN or infinite ends the program
    here, its run diverged (a result, ranked last; the checkpoints before it stay); by hand, exit 1
    saying so."""
    if not math.isfinite(loss):
        end_as_diverged(step, f"the loss became {loss}")


def end_as_diverged(step: int, detail: str) -> None:
    """End the program (exit 0, no metrics.json): its training diverged at `step` (`detail`: what
    did), said to the piece in DIVERGED_FILE; by hand, exit 1 saying so."""
    if not under_scratchflow():
        raise SystemExit(f"diverged at step {step}: {detail}")
    Path(os.environ["SCRATCHFLOW_OUTPUT_DIR"], DIVERGED_FILE).write_text(json.dumps({"step": step, "detail": detail}))
    log.warning("diverged at step %d: %s; the run ends diverged", step, detail)
    raise SystemExit(0)


def checkpoint_due(step: int, last_step: int | None = None, by_hand: bool = False) -> bool:
    """At the end of `step`: whether to save a checkpoint now: by the piece's interval, at a stop, or
    at `last_step` (a run whose job dies after training then resumes from its end); `by_hand`
    outside scratchflow (the program's own rule)."""
    if not under_scratchflow():
        return by_hand
    due = piece().checkpoint_due(step)  # asked at every step: it keeps the interval's clock
    return due or piece().stop.asked or (last_step is not None and step >= last_step)


def save(state: Any, step: int, by_hand: str | Path | None = None, file: str = "checkpoint.pt") -> None:
    """`torch.save(state, ...)`: into `checkpoint-<step>/<file>` on the piece's scratch, COMPLETE
    written last; after a stop, the program ends here as a pause. By hand, to `by_hand`."""
    import torch

    if not under_scratchflow():
        if by_hand is not None:
            torch.save(state, by_hand)
        return
    folder = Path(os.environ["SCRATCHFLOW_CHECKPOINT_DIR"]) / f"checkpoint-{step}"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / file)
    (folder / CHECKPOINT_MARKER).touch()
    piece().saved(step)
    end_if_stopped()


def figures(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numbers among `metrics` that describe the model: no timings (`eval_runtime`, …), no
    `epoch`, nothing that is not a finite number."""
    return {
        name: float(value)
        for name, value in metrics.items()
        if isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and name.split("_", 1)[-1] not in TIMINGS
        and name != "epoch"
    }


def write_metrics(*evaluations: Mapping[str, Any], detail: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """The run's metrics.json: the figures of the evaluations given (later ones win) added to what it
    holds, and `detail`, nested (a `confusion_matrix` of `{"labels": [...],
    "rows_true_columns_predicted": [[...], ...]}` is drawn for the best run); nothing by hand.
    Returns the last evaluation, so that it wraps a call: `print(write_metrics(trainer.evaluate()))`."""
    folder = os.environ.get("SCRATCHFLOW_OUTPUT_DIR")
    if folder:
        path = Path(folder) / "metrics.json"
        merged: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
        for evaluation in evaluations:
            merged.update(figures(evaluation))
        path.write_text(json.dumps({**merged, **(detail or {})}, indent=2, sort_keys=True))
    return evaluations[-1] if evaluations else {}
