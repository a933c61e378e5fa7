"""Training curves: one TensorBoard log directory per run on shared storage, continuous across the
pieces of an interrupted run, the progress lines of a training log, and the figures of the curves."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from scratchflow.figures import pyplot, save_png

# results/runs/<run_id>/tensorboard: `tensorboard --logdir results/runs` shows the whole grid.
TENSORBOARD_FOLDER = "tensorboard"
# Scalars logged once per piece or about speed, not about learning: left out of the figures.
NOT_CURVES = ("runtime", "per_second", "epoch", "total_flos", "train_loss")
MOST_PANELS = 4
# The grid figure draws the curves of the best runs; more lines than this are unreadable.
MOST_RUNS_DRAWN = 12

Curves = dict[str, list[tuple[int, float]]]  # tag -> [(step, value)], steps ascending


def open_writer(directory: Path, resumed_from_step: int | None) -> Any:
    """A TensorBoard writer that continues the run's curves. TensorBoard drops what earlier pieces
    logged from `purge_step` on: the steps after the checkpoint this piece resumes from (they are
    trained and logged again), or everything when the run starts from scratch."""
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(directory), purge_step=(resumed_from_step or 0) + 1)


def read_curves(directory: Path) -> Curves:
    """Every scalar the run's event files hold, as TensorBoard shows them (purged steps dropped)."""
    if not directory.is_dir():
        return {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logging.getLogger("tensorboard").setLevel(logging.ERROR)  # it warns of each purge it applies
    events = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def learning_curves(curves: Curves) -> list[str]:
    """The tags worth a panel: losses first (training, then evaluation), then the other metrics."""
    tags = [tag for tag in curves if not any(part in tag.rsplit("/", 1)[-1] for part in NOT_CURVES)]

    def order(tag: str) -> tuple[bool, bool, str]:
        is_loss = "loss" in tag
        return not is_loss, not tag.startswith("train" if is_loss else "eval"), tag

    return sorted(tags, key=order)[:MOST_PANELS]


def progress_line(step: int, total: int, loss: float | None, samples_per_second: float, seconds_left: float) -> str:
    """One line of a training log: where training is, how it goes, and how long it has left."""
    loss_part = f", loss {loss:.4f}" if loss is not None else ""
    return (
        f"step {step}/{total} ({100 * step / total:.0f}%){loss_part}, {samples_per_second:.1f} samples/s, "
        f"{duration(seconds_left)} left"
    )


def duration(seconds: float) -> str:
    """'1 h 05 min', '3 min 20 s', '12 s': a time left or taken, as a person reads it."""
    if not math.isfinite(seconds):
        return "unknown"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {seconds:02d} s" if minutes else f"{seconds} s"


def plot_curves(curves_by_run: dict[str, Curves], path: Path, title: str, highlight: str | None = None) -> None:
    """One panel per learning curve (losses first), one line per run; `highlight` drawn in orange."""
    plt = pyplot()

    tags = learning_curves({tag: points for curves in curves_by_run.values() for tag, points in curves.items()})
    others = [f"C{index}" for index in range(10) if index != 1]  # C1 is orange, kept for `highlight`
    colours = {run_id: others[index % len(others)] for index, run_id in enumerate(sorted(curves_by_run))}
    figure, panels = plt.subplots(1, max(len(tags), 1), figsize=(4.2 * max(len(tags), 1), 3.4), squeeze=False)
    for panel, tag in zip(panels[0], tags, strict=False):
        for run_id, curves in curves_by_run.items():
            points = curves.get(tag, [])
            if not points:
                continue
            steps, values = zip(*points, strict=True)
            best = run_id == highlight
            panel.plot(
                steps,
                values,
                marker="o" if len(points) < 3 else None,
                color="tab:orange" if best else colours[run_id],
                linewidth=2 if best else 1,
                zorder=3 if best else 2,
                label=run_id,
            )
        panel.set_title(tag)
        panel.set_xlabel("step")
    if not tags:
        panels[0][0].text(0.5, 0.5, "no curves were logged", ha="center", va="center")
        panels[0][0].set_axis_off()
    elif 1 < len(curves_by_run) <= MOST_RUNS_DRAWN:
        panels[0][-1].legend(fontsize="small")
    figure.suptitle(title)
    figure.tight_layout()
    save_png(figure, path, dpi=100)
