"""Training curves: one TensorBoard log directory per run on shared storage, continuous across the
pieces of an interrupted run; W&B offline runs beside it when asked for; the progress lines of a
training log, and the figures of the curves.

A piece's task writes its curves on node-local scratch (every event a small append, which on a
shared filesystem is an open and a write each time); the piece publishes them to the run's folder
with each checkpoint and when it ends (`publish_curves`): a piece killed outright loses only what
came after its newest checkpoint, which the next piece trains, and logs, again."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shlex
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from scratchflow.figures import pyplot, save_png
from scratchflow.plan import TENSORBOARD_FOLDER

if TYPE_CHECKING:
    from scratchflow.lease import Publication

# results/runs/<run_id>/wandb/offline-run-*: W&B's offline runs of `tracking: wandb`.
WANDB_FOLDER = "wandb"
WANDB_EXTRA = "requirements-wandb.txt"
# Scalars logged once per piece or about speed, not about learning: left out of the figures.
NOT_CURVES = ("runtime", "per_second", "epoch", "total_flos", "train_loss")
MOST_PANELS = 4
# The grid figure draws the curves of the best runs; more lines than this are unreadable.
MOST_RUNS_DRAWN = 12

Curves = dict[str, list[tuple[int, float]]]  # tag -> [(step, value)], steps ascending

# Lines for the console as well as the job's log: a job's context (jobs.job_context) gives it a
# handler on the console; outside a job its lines go nowhere.
console_log = logging.getLogger("scratchflow.console")
console_log.propagate = False


# In each run's TensorBoard folder: its session of TensorBoard's HParams view, which the aggregate
# writes (a folder of its own, so that the run's curves stay the trainer's alone).
HPARAMS_FOLDER = "hparams"


def write_hparams_sessions(sessions: dict[Path, tuple[dict[str, Any], dict[str, float]]]) -> None:
    """One HParams session per run (`sessions`: its TensorBoard folder -> its parameters and its
    metrics), so that `tensorboard --logdir results/runs` shows the grid as a sortable table and
    parallel coordinates beside the curves. Each session replaces the one an earlier aggregate
    wrote. TensorBoard takes the view's columns from one session: a name missing (None or NaN) in
    any run is left out of every session. Written with TensorBoard's own records (importing torch's
    writer costs the aggregate 2 s)."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    if not sessions:
        return

    def present(values: dict[str, Any]) -> set[str]:
        return {name for name, value in values.items() if value is not None and value == value}  # NaN != NaN

    parameter_names, metric_names = (
        sorted(set.intersection(*(present(values[part]) for values in sessions.values()))) for part in (0, 1)
    )
    kinds = {bool: ("bool_value", api_pb2.DATA_TYPE_BOOL), str: ("string_value", api_pb2.DATA_TYPE_STRING)}
    first = next(iter(sessions.values()))[0]
    field = {
        name: kinds.get(type(first[name]), ("number_value", api_pb2.DATA_TYPE_FLOAT64)) for name in parameter_names
    }
    infos = []
    for name in parameter_names:
        info = api_pb2.HParamInfo(name=name, type=field[name][1])
        if field[name][1] == api_pb2.DATA_TYPE_STRING:  # the view offers a string's values as one filter
            info.domain_discrete.extend(sorted({str(values[0][name]) for values in sessions.values()}))
        infos.append(info)
    experiment = api_pb2.Experiment(
        hparam_infos=infos, metric_infos=[api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag)) for tag in metric_names]
    )

    def summary(tag: str, **data: Any) -> Summary:
        plugin_data = plugin_data_pb2.HParamsPluginData(version=metadata.PLUGIN_DATA_VERSION, **data)
        return Summary(value=[Summary.Value(tag=tag, metadata=metadata.create_summary_metadata(plugin_data))])

    for folder, (parameters, metrics) in sessions.items():
        session = folder / HPARAMS_FOLDER
        shutil.rmtree(session, ignore_errors=True)
        start = plugin_data_pb2.SessionStartInfo()
        for name in parameter_names:
            value = parameters[name]
            setattr(start.hparams[name], field[name][0], value if field[name][0] != "number_value" else float(value))
        summaries = [
            summary(metadata.EXPERIMENT_TAG, experiment=experiment),
            summary(metadata.SESSION_START_INFO_TAG, session_start_info=start),
            summary(
                metadata.SESSION_END_INFO_TAG,
                session_end_info=plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS),
            ),
            *(Summary(value=[Summary.Value(tag=tag, simple_value=float(metrics[tag]))]) for tag in metric_names),
        ]
        writer = EventFileWriter(str(session))
        for written in summaries:
            writer.add_event(Event(wall_time=time.time(), step=0, summary=written))
        writer.close()


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


class MissingPackage(ImportError):
    """A tracking backend's package is not installed."""


def require_wandb() -> Any:
    """The wandb module, or an error saying how to install it: wandb is an optional extra (about
    100 MB with its dependencies), installed only for `tracking: wandb`."""
    try:
        import wandb
    except ImportError:
        raise MissingPackage(
            f"config key tracking: wandb needs the wandb package, which is not installed here; install "
            f"scratchflow's optional extra with `.venv/bin/pip install -r {WANDB_EXTRA}` (and the same "
            "line in the jobs' environment, e.g. the pip list of envs/scratchflow.yaml), or set "
            "tracking: tensorboard"
        ) from None
    return wandb


def wandb_environment(run_folder: Path, run_id: str, piece: int | None) -> dict[str, str]:
    """The variables `wandb.init()` reads, for one job of a run: offline (the cluster profiles unset
    WANDB_API_KEY in every job), its files in `run_folder` (a training piece's on scratch, which the
    piece publishes to the run's folder as it ends; the predict job's the run's folder), grouped by the run
    id. W&B cannot resume an offline run, so each training piece is a W&B run of its own,
    `<run_id>-piece<k>`; the predict job (`piece` None) writes `<run_id>`: the whole run, its curves
    read from TensorBoard's files (joined across pieces, nothing lost to a kill)."""
    wandb_id = run_id if piece is None else f"{run_id}-piece{piece}"
    return {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(run_folder),  # wandb adds the wandb/ folder itself
        "WANDB_PROJECT": os.environ.get("WANDB_PROJECT", "scratchflow"),
        "WANDB_RUN_ID": wandb_id,
        "WANDB_NAME": wandb_id,
        "WANDB_RUN_GROUP": run_id,
        "WANDB_JOB_TYPE": "run" if piece is None else "train-piece",
        "WANDB_CONSOLE": "off",  # the job's log already holds its output; wrapping stdout would copy it
    }


@contextlib.contextmanager
def wandb_run(environment: dict[str, str], config: dict[str, Any]) -> Iterator[Any]:
    """A W&B offline run for this job (environment: `wandb_environment`), finished when the block
    ends, as failed if it raises."""
    wandb = require_wandb()
    os.environ.update(environment)
    run = wandb.init(config=config)
    exit_code = 0
    try:
        yield run
    except BaseException:
        exit_code = 1
        raise
    finally:
        try:
            run.finish(exit_code=exit_code)
        except Exception as error:  # tracking must never fail a job whose training went well
            logging.getLogger(__name__).warning("W&B run %s not finished cleanly: %s", run.id, error)


def publish_curves(
    local: Path, shared: Path, published: dict[str, int], publication: Publication, wandb_too: bool = False
) -> None:
    """This piece's curves, in its run folder `local` on scratch, copied whole into the run's folder
    `shared`, in `publication` (the run's gate, scratchflow.lease): each TensorBoard events file that
    grew since it was last published (`published`: its size then, by name), and with `wandb_too`
    (when the piece ends) its W&B offline runs."""
    events = local / TENSORBOARD_FOLDER
    for written in sorted(events.iterdir()) if events.is_dir() else ():
        size = written.stat().st_size
        if written.is_file() and published.get(written.name) != size:
            publication.copy_file(written, shared / TENSORBOARD_FOLDER / written.name)
            published[written.name] = size
    runs = local / WANDB_FOLDER
    for offline_run in sorted(runs.glob("offline-run-*")) if wandb_too and runs.is_dir() else ():
        publication.copy_tree(offline_run, shared / WANDB_FOLDER / offline_run.name)


def remove_wandb_runs(run_folder: Path, wandb_id: str) -> None:
    """Delete the local offline runs of this W&B id (the `wandb sync` command would upload each)."""
    for earlier in (run_folder / WANDB_FOLDER).glob(f"offline-run-*-{wandb_id}"):
        shutil.rmtree(earlier)


def log_curves(run: Any, curves: Curves) -> None:
    """Every scalar of `curves` into a W&B run, one row per step, steps ascending."""
    by_step: dict[int, dict[str, float]] = {}
    for tag, points in curves.items():
        for step, value in points:
            by_step.setdefault(step, {})[tag] = value
    for step in sorted(by_step):
        run.log(by_step[step], step=step)


def wandb_sync_command(runs_folder: Path) -> str:
    """The one command that uploads every W&B offline run of the grid, from a login node."""
    return f"wandb sync {shlex.quote(str(runs_folder))}/*/{WANDB_FOLDER}/offline-run-*"


def learning_curves(curves: Curves) -> list[str]:
    """The tags worth a panel: losses first (training, then evaluation), then the other metrics."""
    tags = [tag for tag in curves if not any(part in tag.rsplit("/", 1)[-1] for part in NOT_CURVES)]

    def order(tag: str) -> tuple[bool, bool, str]:
        is_loss = "loss" in tag
        return not is_loss, not tag.startswith("train" if is_loss else "eval"), tag

    return sorted(tags, key=order)[:MOST_PANELS]


@contextlib.contextmanager
def lines_on(console: TextIO) -> Iterator[None]:
    """Show `console_log`'s lines on `console` while the block runs, prefixed as scratchflow's."""
    handler = logging.StreamHandler(console)
    handler.setFormatter(logging.Formatter("scratchflow: %(message)s"))
    console_log.addHandler(handler)
    console_log.setLevel(logging.INFO)
    try:
        yield
    finally:
        console_log.removeHandler(handler)


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
