"""Training chosen runs of a grid again from zero, and nothing else (`scripts/retrain.py`, which
`make retrain RUNS=…` runs; `make status` prints the line for the runs trained by other code or
packages).

A run's id is its identity (settings, data settings, model, task), not the code that trained it, so
the workflow never retrains a run by itself. Releasing runs removes, in this order: the grid's
comparison (and, with packed runs, their packs' files), which the workflow makes again from the
runs (while it is there, Snakemake takes a missing run result for an intermediate file it need not
make); each run's checkpoints (else it would resume from its final one and train nothing); then
each run's results folder (record, model, predictions, metrics, curves). The workflow's own command
then trains those runs from zero, predicts them and compares the grid again, as for runs never
trained; every other run stays as it is. Each folder goes whole (renamed, then deleted). Stopped at
any point, a run is as it was, or finished as after the workflow's success (its checkpoints
released), or not trained at all, and the next run of the grid's command, whichever, goes on from
there: never a record beside a final checkpoint that a rerun would take for its training, nor a
comparison that hides a run still to train.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from scratchflow import SCRATCHFLOW_DIR
from scratchflow.checkpoints import CheckpointStore
from scratchflow.files import read_json, remove_whole
from scratchflow.lease import ACTIVE_SLURM_STATES, HOLDER_FILE, RunFolder, holder_is_alive
from scratchflow.plan import BEST_CONFUSION_MATRIX, COMPARISON_OUTPUTS, PACK_OUTPUT, PACK_STAGES, Plan
from scratchflow.status import slurm_jobs

LOCAL_RUNNER = SCRATCHFLOW_DIR / "scripts" / "run_local.sh"
# The lock scripts/run_local.sh holds while a run of it is active in a directory.
LOCAL_RUN_LOCK = Path(".snakemake/run_local.flock")


@dataclass(frozen=True)
class RunsAndCommand:
    """What retrain.py and verify.py are given: `RUN [RUN ...] [--dir DIR] [-- COMMAND]`."""

    runs: list[str]  # in the order given, each once
    workdir: Path  # where the grid runs
    submit: list[str]  # the command that submits the grid (none: the grid ran here, or not given)


def runs_and_command(arguments: list[str], description: str) -> RunsAndCommand:
    """The run ids, the grid's folder (--dir) and the command after `--` of a command line."""
    split = arguments.index("--") if "--" in arguments else len(arguments)
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("runs", nargs="*", help="the run ids (make status names them)")
    parser.add_argument("--dir", default=".", type=Path, help="where the grid runs (default: here)")
    given = parser.parse_args(arguments[:split])
    return RunsAndCommand(list(dict.fromkeys(given.runs)), given.dir, arguments[split + 1 :])


class RetrainRefused(RuntimeError):
    """The runs cannot be retrained as asked: said in one line, nothing released."""


def rerun_command(plan: Plan, submit: list[str]) -> list[str] | None:
    """What trains the released runs: scratchflow's local runner for a grid that ran here, or `submit`
    (the command that submits the grid to its cluster) for one whose jobs went to Slurm; None for
    that without `submit` (the user submits the grid as before)."""
    command = submit if plan.executor == "slurm" else [str(LOCAL_RUNNER)]
    if not command:
        return None
    # The grid that ran, not config/config.yaml's alone: else the released runs would not train.
    command = [*command, *(option for path in plan.configfiles for option in ("--configfile", path))]
    if plan.executor != "slurm" and shutil.which("snakemake", path=runner_environment()["PATH"]) is None:
        raise RetrainRefused(
            f"{Path(sys.executable).parent} has no snakemake: run this with the Python of the environment that "
            "holds requirements.txt; nothing was released"
        )
    program = shutil.which(command[0])
    if program is None:
        raise RetrainRefused(f"{command[0]} is not found: nothing was released")
    return [str(Path(program).absolute()), *command[1:]]  # run in the grid's directory, not here


def runner_environment(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment the rerun runs in: this Python's environment first on PATH, where the local
    runner takes its snakemake (as `make run` puts it there), whatever the caller's PATH holds."""
    return {**environ, "PATH": os.pathsep.join(filter(None, [str(Path(sys.executable).parent), environ.get("PATH")]))}


def check(workdir: Path, plan: Plan, run_ids: list[str]) -> None:
    """Refuse, naming why, unless every run is one of the grid's and none is being trained or
    predicted now (a run's holder alive, or on Slurm a job of it queued or running)."""
    if not run_ids:
        raise RetrainRefused('give the runs to train again: make retrain RUNS="<run id> …" (make status names them)')
    unknown = [run_id for run_id in run_ids if run_id not in plan.runs]
    if unknown:
        raise RetrainRefused(
            f"no run {', '.join(unknown)} in the grid in {workdir.resolve()} (make status lists its runs); "
            "nothing was released"
        )
    if plan.halving:
        raise RetrainRefused(
            "this directory holds a halving search, whose rungs decide among its runs together: its runs are not "
            "trained again one by one; run the search again in a new directory. Nothing was released"
        )
    jobs = slurm_jobs(workdir) if plan.executor == "slurm" else {}
    active = None if jobs is None else {job.job_id for job in jobs.values() if job.state in ACTIVE_SLURM_STATES}
    for run_id in run_ids:
        queued = [job.describe() for rule in ("train", "predict") if (job := (jobs or {}).get((rule, run_id)))]
        holder_file = workdir / plan.paths(run_id).checkpoints / HOLDER_FILE
        with contextlib.suppress(FileNotFoundError, ValueError):
            holder = read_json(holder_file)
            if holder_is_alive(holder, active):
                queued.append(f"a job holds it: {holder}")
        if queued:
            raise RetrainRefused(
                f"run {run_id} is being trained or predicted now ({'; '.join(queued)}): wait for it to end, or cancel "
                "it, then retrain. Nothing was released"
            )


@contextlib.contextmanager
def no_local_run(workdir: Path) -> Iterator[None]:
    """Hold the lock of scripts/run_local.sh in `workdir` while the block runs, or refuse where a
    run of it is active there: its Snakemake would not see the runs released under it."""
    lock_path = workdir / LOCAL_RUN_LOCK
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RetrainRefused(
                f"a run of the grid is active in {workdir.resolve()}: wait for it to end (or stop it), then retrain. "
                "Nothing was released"
            ) from None
        yield  # released when the file closes, or when this process becomes the runner (it is not inherited)


def release(workdir: Path, plan: Plan, run_ids: list[str]) -> None:
    """Remove the grid's comparison and the runs' packs' files, then each run's checkpoints, then its
    results folder (the module's docstring says why in this order)."""
    packs = [index for index, pack in enumerate(plan.packs) if plan.packed and set(pack) & set(run_ids)]
    packs_files = [PACK_OUTPUT.format(stage=stage, pack=index) for index in packs for stage in PACK_STAGES]
    for derived in [*COMPARISON_OUTPUTS.values(), BEST_CONFUSION_MATRIX, *packs_files]:
        (workdir / derived).unlink(missing_ok=True)
    for run_id in run_ids:
        paths = plan.paths(run_id)
        CheckpointStore(RunFolder(workdir / paths.checkpoints), plan.checkpoint_marker).remove_all()
        results = (workdir / paths.record).parent
        if results.is_dir():
            remove_whole(results)
