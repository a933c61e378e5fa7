"""One function per kind of workflow job (archive, prefetch, train, predict, pack, aggregate): the
lifecycle stage -> work -> sync back -> clean up, inside `job_context` (the rule's log, SIGTERM that
still cleans up, a failure told where people look).

Each takes plain values (the rule's entry script unpacks the `snakemake` object into them), so tests
run a whole job without Snakemake.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

# aggregation and report (and with them pandas) are imported by the jobs that use them: every train
# job imports this module, and trains without them.
from scratchflow import accounting, halving, prediction, signals, slurm_job, tracking
from scratchflow.checkpoints import CheckpointStore
from scratchflow.dataset import staged_sources
from scratchflow.failures import DIVERGED, FAILED, FinalFailure, unfinished_line, unfinished_runs
from scratchflow.files import read_json, remove_whole, write_json_atomically, written_whole
from scratchflow.lease import RunFolder, Superseded
from scratchflow.ledger import FINISHED, PieceRecord
from scratchflow.models import prefetch, switch_hub_off
from scratchflow.piece import TrainingStopped, finished, run_piece
from scratchflow.piece_spec import Paused, PieceSpec, PredictionAtEnd, Shape, Staging
from scratchflow.plan import BEST_CONFUSION_MATRIX, FAILURE_NOTE, RUN_PATHS, Plan, best_run_figures
from scratchflow.provenance import code_record, verified_runs
from scratchflow.record import environment_record, output_to_log, plain
from scratchflow.schedule import CheckpointInterval
from scratchflow.snakemake_adapter import mark_job_end
from scratchflow.software import describe_failure
from scratchflow.staging import archive_dataset, copy_whole, scratch_directory, stage_in
from scratchflow.tasks import PredictContext, load_task, loaded_file, numbers
from scratchflow.timing import PhaseTimer

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger("scratchflow")


@contextlib.contextmanager
def job_context(log_path: str, threads: int = 1, ends_its_slurm_job: bool = True) -> Iterator[int]:
    """What every job needs: its output in the rule's log (first, the Python that runs it and, in a
    container, its image), SIGTERM that still cleans up, the CPUs it was given (yielded: on Slurm its
    --cpus-per-task, else `threads`) and every library's threads set to them, its Slurm job's end
    marked where it ends it (not a packed run's, whose pack job goes on: snakemake_adapter), and a
    failure told where people look. The rule's log gets the failure
    with its traceback (users read it first); the console (Snakemake's output, on a cluster the
    plugin's Slurm log) gets the failure in one line and where its log is, with no traceback first."""
    signals.exit_on_sigterm()
    cpus, why = slurm_job.job_cpus(threads)
    for variable in slurm_job.THREAD_VARIABLES:
        os.environ[variable] = str(cpus)
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # progress bars make unreadable log files
    failure: BaseException | None = None
    with output_to_log(log_path) as console, tracking.lines_on(console):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
        image = os.environ.get("PYXIS_CONTAINER_IMAGE")
        log.info("python %s%s", sys.executable, f" in the image {image}" if image else "")
        log.info("CPUs: %d (%s)", cpus, why)
        try:
            yield cpus
        except TrainingStopped as stopped:  # planned: no traceback, and not an error
            log.info("%s", paused_line(stopped.paused))
            failure = stopped
        except Superseded as superseded:  # not an error of this job's: a newer piece trains the run
            log.warning("superseded, not failed: %s", superseded)
            failure = superseded
        except RunFailed as failed:  # recorded: the job succeeds, so that Snakemake retries nothing
            log.error("%s", failed)
            failure = failed
        except BaseException as error:
            # A lab program's failure is told by its own output; scratchflow's frames would only hide it.
            log.error("job failed: %s", describe_failure(error), exc_info=not told_by_itself(error))
            failure = error
        finally:
            with contextlib.suppress(OSError):  # only a speed-up: never a job's failure
                # A superseded piece's Slurm job id is the newer piece's now: its end is not this one's.
                if (ends_its_slurm_job or failure is not None) and not isinstance(failure, Superseded):
                    mark_job_end()  # the submitting Snakemake notices at once (snakemake_adapter)
    if isinstance(failure, RunFailed):
        print(f"scratchflow: {failure}", file=sys.stderr, flush=True)
        return
    if isinstance(failure, Superseded):
        print(f"scratchflow: superseded, not failed: {failure}", file=sys.stderr, flush=True)
        # Seeing its script fail, the job's own Snakemake would remove the rule's outputs: the newer piece's.
        slurm_job.end_the_jobs_own_snakemakes()
    elif isinstance(failure, TrainingStopped):
        # A failed job for Snakemake, whose retry resumes, unless the job requeues itself (preempted,
        # its wall time): said first, with the log that stays.
        paused = failure.paused
        kept_log = paused.log or Path(log_path).resolve()
        print(f"scratchflow: {paused_line(paused)}; this piece's log: {kept_log}", file=sys.stderr, flush=True)
        if paused.requeue:
            slurm_job.requeue_this_job(paused.requeue)
    elif failure is not None:
        said = describe_failure(failure)
        if told_by_itself(failure):  # its first line, ending in the program's own last line
            said = said.splitlines()[0].removesuffix("; its last lines:")
        print(
            f"scratchflow: job failed: {said}\n"
            f"  its log, with the {'output' if told_by_itself(failure) else 'traceback'}: {Path(log_path).resolve()}",
            file=sys.stderr,
            flush=True,
        )
    if failure is not None:
        raise SystemExit(exit_status(failure))


def told_by_itself(error: BaseException) -> bool:
    """Whether `error` is a failure its message tells whole (a lab program's: CommandFailed)."""
    return getattr(error, "traceback_says_nothing", False)


def paused_line(paused: Paused) -> str:
    requeued = f"; its Slurm job requeues itself ({paused.requeue})" if paused.requeue else ""
    return f"paused, not failed: {paused.line()}{requeued}"


def exit_status(failure: BaseException) -> int:
    """A job's exit status for its failure: a signal's (128 + its number) stays, anything else is 1."""
    if isinstance(failure, SystemExit) and isinstance(failure.code, int) and failure.code:
        return failure.code
    return 1


def archive_job(*, dataset: dict[str, Any], archive: Path, manifest: Path) -> None:
    record = archive_dataset(dataset, archive, manifest)
    log.info(
        "archived %(files)d files (%(bytes)d bytes) into %(part_count)d part(s), %(archive_bytes)d bytes in all "
        "(compression: %(compression)s), sha256 %(sha256)s",
        {**record, "part_count": len(record["parts"])},
    )


def pack_job(*, written: list[Path], output: Path) -> None:
    """Say which runs a packed Slurm job held (cluster.pack_runs), from what its jobs wrote."""
    runs = sorted(path.parent.name for path in written)
    write_json_atomically({"runs": runs, "slurm_job_id": os.environ.get("SLURM_JOB_ID")}, output)
    log.info("pack of %d runs done: %s", len(runs), ", ".join(runs))


def prefetch_job(*, task: str, source: str, destination: Path, token_file: str | None) -> None:
    prefetch(source, destination, token_file, check_loadable=load_task(task).check_model)
    log.info("model %s cached in %s for offline loading", source, destination)


@dataclass(frozen=True)
class RunOutputs:
    """A run's trained model, its parameters and its record (written last: the outputs are complete)."""

    model: Path
    params: Path
    record: Path


@dataclass(frozen=True)
class TrainJob:
    """Everything one train job needs, as plain values (the rule's entry script unpacks them)."""

    run_id: str
    task: str
    identity: dict[str, Any]  # what determines the run's result: dataset settings, model, parameters
    resolved_config: dict[str, Any]
    archive: Path
    manifest: Path
    base_model: Path | None
    scratch_root: str | None
    shared_folder: Path  # checkpoints/<run_id>/: the run's checkpoints, lease and ledger on shared storage
    checkpointing: dict[str, Any]
    threads: int
    workflow_dir: Path
    tracking_dir: Path  # results/runs/<run_id>/tensorboard: kept across pieces, so not an output
    tracking: str  # config key tracking
    log: Path  # the rule's log, which this job writes to
    # What the job ends with: the run's outputs, or a halving search's rung (trained to its epochs,
    # the checkpoint kept for the next rung, the rung's record written).
    ends_with: RunOutputs | halving.Rung
    shape: Shape = field(default_factory=Shape)
    # How long before the time limit the job's --signal asks Slurm to warn it (its slurm_extra).
    warning_lead_seconds: int | None = None
    # Where the run's prediction goes, made as the run ends (scratchflow.prediction);
    # None: its predict job predicts.
    prediction_at_end: Path | None = None


def train_job(job: TrainJob) -> None:
    """One piece of the run (scratchflow.piece.run_piece: stage in, train from the newest checkpoint,
    sync back, clean up), then its record. A piece stopped by a signal has saved its progress and
    ends the job as a failure, paused: the next attempt resumes. The run's record is written last:
    its presence means the outputs are complete. A rung's job trains to the rung's epochs and records
    the validation metrics there; its checkpoint on shared storage is where the next rung, or the
    run's last job, resumes."""
    task = load_task(job.task)
    code = code_record(job.task, loaded_file(job.task), job.identity["training"])  # the code as loaded, hashed once
    signals.use_stop_signal(job.checkpointing["stop_signal"])
    switch_hub_off()
    data = read_json(job.manifest)
    store = CheckpointStore(RunFolder(job.shared_folder), task.CHECKPOINT_MARKER, job.checkpointing["keep"])
    spec = piece_spec(job, store, data["sha256"])
    outcome, run_folder = run_piece(spec)
    if isinstance(outcome, FinalFailure):
        ended, at = spec.ledger.pieces(), f" (at {outcome.where})" if outcome.where else ""
        if isinstance(job.ends_with, halving.Rung):
            if outcome.outcome != DIVERGED:  # a search's rungs know no failed runs: retried
                raise RuntimeError(f"{outcome.cause}{at}")
            rung = halving.diverged_rung_record(job.run_id, job.identity["training"], job.ends_with, outcome, ended)
            run_folder.write_json(plain(rung), job.ends_with.record_out)
            raise RunFailed(f"run {job.run_id} {outcome.cause} in rung {job.ends_with.index}: the rung's worst")
        record_unfinished_run(job, outcome, ended, data, code, run_folder, job.ends_with)
        if outcome.outcome == DIVERGED:
            raise RunFailed(
                f"run {job.run_id} {outcome.cause}: a result (that setting diverges), ranked last in the "
                f"comparison; not retried. Its log: {job.log.resolve()}"
            )
        raise RunFailed(
            f"run {job.run_id} failed, and a retry cannot fix it: {outcome.cause}{at}; not retried, the rest "
            "of the grid goes on. "
            f"After a fix, the same command trains it again. Its log: {job.log.resolve()}"
        )
    trained = finished(outcome)
    pieces = spec.ledger.pieces()
    if isinstance(job.ends_with, halving.Rung):
        rung = halving.rung_record(job.run_id, job.identity["training"], job.ends_with, trained.metrics, pieces)
        run_folder.write_json(plain(rung), job.ends_with.record_out)
        return
    record = run_record(job, data, code, trained.metrics, pieces)
    # One look for both: they too are the newer piece's, where one holds the run now.
    with run_folder.publishing() as publication:
        publication.write_json(job.identity["training"], job.ends_with.params)
        publication.write_json(plain(record), job.ends_with.record)
    log.info("run %s trained; phases (s): %s", job.run_id, pieces[-1].timings_seconds)


class RunFailed(Exception):
    """A run (a rung) that failed in a way a retry cannot fix, or diverged, its outputs written to
    say so: its job ends with this, which `job_context` tells on the console, and succeeds
    (Snakemake retries nothing)."""


# In the model folder of a run that failed or diverged: why there is no model.
NO_MODEL_NOTE = "NO_MODEL.txt"


def record_unfinished_run(
    job: TrainJob,
    ended: FinalFailure,
    pieces: list[PieceRecord],
    data: dict[str, Any],
    code: dict[str, Any],
    run_folder: RunFolder,
    outputs: RunOutputs,
) -> None:
    """The outputs of a run that failed in a way a retry cannot fix, or diverged: its record says
    so (`outcome`; `failure` or `divergence`: the cause, where, the piece and the step), its model
    folder holds a note, and the job succeeds (no retry, no further job for the run; the comparison
    names it). A failure is also noted beside them (scratchflow.plan, FAILURE_NOTE), which stays:
    the next run of the workflow trains it again. A divergence is a result: it stays."""
    last = pieces[-1]
    step = ended.step if ended.outcome == DIVERGED else last.reached_step
    said = {"cause": ended.cause, "where": ended.where, "piece": last.piece, "step": step}
    record = run_record(
        job,
        data,
        code,
        {},
        pieces,
        outcome=ended.outcome,
        failure=said if ended.outcome == FAILED else None,
        divergence=said if ended.outcome == DIVERGED else None,
    )
    with run_folder.publishing() as publication:
        publication.write_text(f"no model: the run {ended.outcome}: {ended.cause}\n", outputs.model / NO_MODEL_NOTE)
        if ended.outcome == FAILED:
            note = FAILURE_NOTE.format(run_id=job.run_id, number=len(Plan.failure_notes(job.run_id)) + 1)
            publication.write_json({**said, "at": time.time()}, Path(note))
        publication.write_json(job.identity["training"], outputs.params)
        publication.write_json(plain(record), outputs.record)


def run_record(
    job: TrainJob,
    data: dict[str, Any],
    code: dict[str, Any],
    training: dict[str, Any],
    pieces: list[PieceRecord],
    **ended: Any,
) -> RunRecord:
    """The run's record.json: `training` what the task returned; `ended`, how a run that did not
    finish ended (RunRecord's outcome, failure, divergence)."""
    return RunRecord(
        *(job.run_id, job.task, job.identity, job.resolved_config, data, training, pieces),
        seed=job.identity["training"].get("seed"),
        threads=job.threads,
        timings_seconds=phases_of_all_pieces(pieces),
        environment=environment_record(job.workflow_dir),
        code=code,
        **ended,
    )


def piece_spec(job: TrainJob, store: CheckpointStore, data_sha256: str) -> PieceSpec:
    """The train job's piece, as the piece and each of its processes see it."""
    rung = job.ends_with if isinstance(job.ends_with, halving.Rung) else None
    outputs = job.ends_with if isinstance(job.ends_with, RunOutputs) else None
    return PieceSpec(
        task=job.task,
        run_id=job.run_id,
        identity=job.identity,
        model=job.base_model,
        store=store,
        tracking_dir=job.tracking_dir,
        tracking=job.tracking,
        checkpoint_every=CheckpointInterval.of(job.checkpointing),
        stop_grace_seconds=job.checkpointing["stop_grace_seconds"],
        threads=job.threads,
        shape=job.shape,
        max_pieces=job.resolved_config.get("cluster", {}).get("max_pieces"),
        warning_lead_seconds=job.warning_lead_seconds,
        budget_epochs=rung.budget_epochs if rung else None,
        rung=rung.index if rung else None,
        staging=Staging(job.archive, job.manifest, job.scratch_root),
        data_sha256=data_sha256,
        model_out=outputs.model if outputs else None,
        prediction_at_end=PredictionAtEnd(job.prediction_at_end, job.workflow_dir)
        if outputs and job.prediction_at_end
        else None,
        log=job.log,
    )


@dataclass(frozen=True)
class RunRecord:
    """record.json: what trained the run, on what, how, and what each piece of it cost."""

    run_id: str
    task: str
    run: dict[str, Any]  # the run's identity
    config: dict[str, Any]  # the whole config, resolved
    data: dict[str, Any]  # the archive's manifest
    training: dict[str, Any]  # what the task returned, with the piece's step figures
    pieces: list[PieceRecord]
    seed: int | None
    threads: int
    timings_seconds: dict[str, float]  # each phase summed over the pieces
    environment: dict[str, Any]
    code: dict[str, Any]
    outcome: str = FINISHED  # or FAILED (a failure a retry cannot fix), DIVERGED (scratchflow.failures)
    failure: dict[str, Any] | None = None  # failed: cause, where (file:line), piece, step
    divergence: dict[str, Any] | None = None  # diverged: the same, `step` the step it diverged at


def write_hparams_view(runs: pd.DataFrame, parameters: list[str], metrics: list[str]) -> None:
    """The grid in TensorBoard's HParams view: each run's parameters, test metrics (as test/<name>)
    and cost (cost/<column>), beside its curves under results/runs."""
    from scratchflow import aggregation

    sessions = {}
    for row in runs.to_dict("records"):
        values = {name: aggregation.plain(row[name]) for name in row}
        sessions[Path(RUN_PATHS.of(row["run_id"]).tensorboard)] = (
            {name: values[name] for name in parameters if name in values},
            {
                **{f"test/{name}": values[name] for name in metrics},
                **{f"cost/{name}": values[name] for name in accounting.COLUMNS if name in values},
            },
        )
    tracking.write_hparams_sessions(sessions)


def grid_cost_of(
    runs: dict[str, dict[str, Path]],
    records: dict[str, dict[str, Any]],
    rung_records: list[Path],
    last_rung: int | None,
) -> accounting.GridCost:
    """What the grid's runs cost: the pieces of each run's record, and of a run a halving search
    stopped early, those of its last rung record; and each run's predict job."""
    pieces = {}
    for rung_record in sorted((read_json(path) for path in rung_records), key=lambda record: record["rung"]):
        pieces[rung_record["run_id"]] = rung_record["pieces"]  # the later rung's list holds the earlier's
    pieces.update({run_id: record["pieces"] for run_id, record in records.items()})
    predictions = {}
    for run_id, files in runs.items():
        predicted = read_json(files["predict_record"])
        predictions[run_id] = (predicted, predicted.get("threads") or records[run_id].get("threads") or 1)
    return accounting.grid_cost(pieces, predictions, last_rung)


def phases_of_all_pieces(pieces: list[PieceRecord]) -> dict[str, float]:
    """Each phase's seconds summed over the run's pieces (a killed piece could not say its own)."""
    summed: dict[str, float] = {}
    for piece in pieces:
        for phase, seconds in piece.timings_seconds.items():
            summed[phase] = round(summed.get(phase, 0.0) + seconds, 3)
    return summed


@dataclass(frozen=True)
class PredictJob:
    run_id: str
    task: str
    identity: dict[str, Any]
    archive: Path
    manifest: Path
    trained: Path
    scratch_root: str | None
    threads: int
    workflow_dir: Path
    metrics_out: Path
    record_out: Path
    curves_out: Path  # beside the run's tensorboard folder
    predictions_out: Path | None  # for tasks that write predictions
    tracking: str  # config key tracking
    train_record: Path  # the run's record.json: a run that failed or diverged has no model to predict with
    # The folder of the task's own figures (Predicted.figures), <name>.png: no declared output, their
    # names are the task's.
    figures_out: Path
    predicted_in_training: Path  # where the run's train job leaves its prediction (scratchflow.prediction)


def predict_job(job: PredictJob) -> None:
    """The run's prediction: its train job's, moved into place where it made one for the run's model
    (scratchflow.prediction); otherwise the data and the trained model staged in, predicted, and the
    predictions and metrics synced back. A run that failed or diverged has no model: its outputs say
    so, at once (`no_prediction`)."""
    trained = read_json(job.train_record)
    if trained.get("outcome", FINISHED) != FINISHED:
        no_prediction(job, trained["outcome"])
        return
    timer = PhaseTimer()
    made = prediction.made_for(job.predicted_in_training, trained, predictions=job.predictions_out is not None)
    if made is not None:
        with timer.phase("place"):
            metrics = prediction.place(job.predicted_in_training, job.metrics_out, job.predictions_out, job.figures_out)
        log.info("run %s: the prediction its train job made (piece %d) moved into place", job.run_id, made["piece"])
    else:
        metrics = predict_in_this_job(job, timer)
    if job.predicted_in_training.exists():  # what was moved out of it, or one made for another model
        remove_whole(job.predicted_in_training)
    with timer.phase("curves"):
        curves = tracking.read_curves(Path(RUN_PATHS.of(job.run_id).tensorboard))
        tracking.plot_curves({job.run_id: curves}, job.curves_out, f"run {job.run_id}")
        if job.tracking == "wandb":
            log_whole_run_to_wandb(job, job.curves_out.parent, curves, metrics)
    # This job's own time and place; a prediction the train job made is in that job's (its piece's) time.
    write_json_atomically(
        {
            "run_id": job.run_id,
            "threads": job.threads,
            "timings_seconds": timer.seconds,
            "environment": environment_record(job.workflow_dir),
            **({"predicted_in_training": made} if made is not None else {}),
        },
        job.record_out,
    )
    log.info("run %s: test metrics %s", job.run_id, numbers(metrics))


def predict_in_this_job(job: PredictJob, timer: PhaseTimer) -> dict[str, Any]:
    """Stage the data and the trained model in, predict, sync the prediction back. Returns the metrics."""
    switch_hub_off()
    with scratch_directory(job.scratch_root, f"predict-{job.run_id}", timer) as scratch:
        log.info("run %s: predicting in scratch %s", job.run_id, scratch)
        with timer.phase("stage"):
            data = staged_sources(stage_in(job.archive, job.manifest, scratch), job.identity["dataset"])
            local_model = scratch / "model"
            copy_whole(job.trained, local_model)
        with timer.phase("predict"):
            context = PredictContext(
                run_id=job.run_id,
                data=data,
                dataset=job.identity["dataset"],
                params=job.identity["training"],
                trained=local_model,
                work_dir=scratch,
                threads=job.threads,
            )
            predicted = scratch / "prediction"
            metrics = prediction.predict_into(job.task, context, predicted)
        with timer.phase("sync"):
            if job.predictions_out is not None:
                copy_whole(predicted / prediction.PREDICTIONS, job.predictions_out)
            write_json_atomically(metrics, job.metrics_out)
            if job.figures_out.exists():  # one an earlier prediction drew
                remove_whole(job.figures_out)
            if (predicted / prediction.FIGURES).is_dir():
                copy_whole(predicted / prediction.FIGURES, job.figures_out)
    return metrics


def no_prediction(job: PredictJob, outcome: str) -> None:
    """The predict outputs of a run that failed or diverged: no metrics, no predictions (an empty
    file), the curves it trained, and a record that says why."""
    write_json_atomically({}, job.metrics_out)
    prediction.write_figures({}, job.figures_out)
    if job.predictions_out is not None:
        with written_whole(job.predictions_out) as partial:
            partial.write_text("")
    curves = tracking.read_curves(Path(RUN_PATHS.of(job.run_id).tensorboard))
    tracking.plot_curves({job.run_id: curves}, job.curves_out, f"run {job.run_id} ({outcome})")
    write_json_atomically(
        {
            "run_id": job.run_id,
            "outcome": outcome,
            "threads": job.threads,
            "timings_seconds": {},
            "environment": environment_record(job.workflow_dir),
        },
        job.record_out,
    )
    log.info("run %s %s: no model to predict with", job.run_id, outcome)


def log_whole_run_to_wandb(job: PredictJob, run_folder: Path, curves: tracking.Curves, metrics: dict) -> None:
    """The W&B offline run `<run_id>`: the run's parameters, its curves as TensorBoard holds them
    (joined across pieces, repeated steps dropped) and its test metrics as the run's summary."""
    environment = tracking.wandb_environment(run_folder, job.run_id, piece=None)
    tracking.remove_wandb_runs(run_folder, job.run_id)  # a rerun of predict replaces the whole run
    with tracking.wandb_run(environment, {"run_id": job.run_id, **job.identity["training"]}) as run:
        tracking.log_curves(run, curves)
        run.summary.update({f"test_{name}": value for name, value in numbers(metrics).items()})


@dataclass(frozen=True)
class HalvingComparison:
    """A halving search's part of the comparison: its decisions and the rung records of every run it
    trained in; its rungs' table and figure out."""

    decisions: list[Path]
    rung_records: list[Path]
    rungs_out: Path
    rung_plot_out: Path


def aggregate_job(
    *,
    runs: dict[str, dict[str, Path]],
    metric: str,
    goal: str,
    summary_out: Path,
    runs_out: Path,
    best_out: Path,
    plot_out: Path,
    curves_out: Path,
    page_out: Path,
    halving_search: HalvingComparison | None = None,
) -> None:
    """The grid's tables (per setting, per run; as TSV, and as one sortable page with the runs'
    provenance), with what each run and setting cost (scratchflow.accounting), its best setting and
    run, and its figures (the best run's confusion matrix only where its metrics hold one). A halving
    search's: the runs of its last rung, and also every run's validation metric and cost at each
    rung, in a table and a figure, and in runs.tsv. The comparison is of the runs that finished;
    those that diverged (ranked last) or failed are named, in runs.tsv (outcome, detail) and on the
    page, and counted in the cost."""
    from scratchflow import aggregation, report

    records = {run_id: read_json(files["record"]) for run_id, files in runs.items()}
    unfinished = unfinished_runs(records)
    if len(unfinished) == len(runs):
        raise aggregation.NothingToCompare(unfinished)
    table = aggregation.summarize({run_id: files for run_id, files in runs.items() if run_id not in unfinished})
    aggregation.check_metric(table, metric)
    table = aggregation.ranked_first(table, metric)
    settings = aggregation.by_setting(table)
    chosen = aggregation.best(table, settings, metric, goal)
    ascending = goal == "min"  # the tables list the best first
    settings = settings.sort_values(f"{metric}_mean", ascending=ascending)
    table = table.sort_values(metric, ascending=ascending)
    search = halving_search
    cost = grid_cost_of(runs, records, search.rung_records if search else [], len(search.decisions) if search else None)
    verified = verified_runs(records, Path())  # what `make verify` found, where it has run
    trained_by = aggregation.trained_by_table(records, verified)  # columns only where the runs differ
    settings_written = settings.merge(aggregation.setting_costs(settings, cost.by_run), on="run_ids")
    settings_written = settings_written.merge(aggregation.setting_trained_by(settings, trained_by), on="run_ids")
    runs_written = aggregation.with_unfinished_runs(
        table, unfinished, {run_id: read_json(runs[run_id]["params"]) for run_id in unfinished}
    )
    runs_written = runs_written.merge(aggregation.run_costs(cost.by_run), on="run_id", how="left")
    runs_written = runs_written.merge(trained_by, on="run_id", how="left")
    if search:
        runs_written = with_rungs(search, runs_written, table, records, cost, metric, goal)
    parameters = aggregation.parameter_columns(table)
    finished = runs_written[runs_written["outcome"] == FINISHED]
    write_hparams_view(finished, parameters, table.attrs["metrics"])
    constant = aggregation.constant_parameters(runs_written, parameters)
    settings_written = settings_written.drop(columns=constant, errors="ignore")  # it has no seed column
    runs_written = runs_written.drop(columns=constant)
    with written_whole(summary_out) as partial:
        settings_written.to_csv(partial, sep="\t", index=False)
    with written_whole(runs_out) as partial:
        runs_written.to_csv(partial, sep="\t", index=False)
    log.info("the grid cost %s", cost.line())
    write_json_atomically(chosen, best_out)
    aggregation.plot_comparison(table, settings, metric, goal, plot_out)
    plot_best_curves(table, metric, chosen["run"]["run_id"], curves_out)
    best_run_id = chosen["run"]["run_id"]
    report.plot_confusion_matrix(read_json(runs[best_run_id]["metrics"]), best_run_id, Path(BEST_CONFUSION_MATRIX))
    report.write_summary_page(
        settings_written, runs_written, chosen, records, cost, page_out, figures=best_run_figures(best_run_id)
    )
    setting = chosen["setting"]
    log.info(
        "%d runs in %d settings; best setting by mean %s (%s): %.4f ± %s over %d run(s): %s; best run %s (%.4f)",
        *(len(table), len(settings), metric, goal, setting["mean"], setting["std"], setting["runs"]),
        *(setting["parameters"], chosen["run"]["run_id"], chosen["run"]["value"]),
    )
    for run_id, (outcome, said) in unfinished.items():
        log.warning("not compared: %s", unfinished_line(run_id, outcome, said))


def with_rungs(
    search: HalvingComparison,
    runs_written: pd.DataFrame,
    table: pd.DataFrame,
    records: dict[str, dict[str, Any]],
    cost: accounting.GridCost,
    metric: str,
    goal: str,
) -> pd.DataFrame:
    """runs.tsv's rows with each run's validation metrics by rung; the rungs' table and figure written."""
    from scratchflow import aggregation

    last_values = {run_id: halving.last_validation(record, metric) for run_id, record in records.items()}
    rungs = halving.rung_table(
        [read_json(path) for path in search.decisions],
        int(table["epochs"].iloc[0]),
        {run_id: value for run_id, value in last_values.items() if value is not None},
    )
    validations = ["run_id", "rung", *(column for column in rungs.columns if column.startswith("validation_"))]
    runs_written = runs_written.merge(rungs[validations], on="run_id", how="left")
    rungs = rungs.merge(aggregation.run_costs(cost.by_run), on="run_id", how="left")
    with written_whole(search.rungs_out) as partial:
        rungs.to_csv(partial, sep="\t", index=False)
    halving.plot_rungs(rungs, metric, goal, search.rung_plot_out)
    for rung, spent in cost.by_rung.items():
        log.info("rung %d cost %s", rung, accounting.described(spent, cost.site))
    return runs_written


def plot_best_curves(table: pd.DataFrame, metric: str, best_run_id: str, curves_out: Path) -> None:
    """The training curves of the best runs (at most tracking.MOST_RUNS_DRAWN), the best in orange."""
    drawn = list(table["run_id"].head(tracking.MOST_RUNS_DRAWN))
    tracking.plot_curves(
        {run_id: tracking.read_curves(Path(RUN_PATHS.of(run_id).tensorboard)) for run_id in drawn},
        curves_out,
        (f"the best {len(drawn)} of {len(table)} runs" if len(drawn) < len(table) else f"{len(table)} runs")
        + f" by test {metric}; the best run in orange",
        highlight=best_run_id,
    )
