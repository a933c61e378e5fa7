"""Proving that what changed since runs were trained changes none of their results (`scripts/verify.py`,
which `make verify RUNS=…` runs; `make status` prints the line for the runs trained by other code or
packages, scratchflow.provenance).

A mechanical edit of a task, a new release of scratchflow or of a package flags every run it trained,
and retraining them all costs the grid's GPU-hours. Instead the cheapest of the flagged runs trains
again from zero, with today's code and packages, in a working folder of its own (the grid's folder
as it is, its outputs left out: `.snakemake/scratchflow/verify/<run>`), with the command that trains
the grid (locally, or on the cluster where its jobs went). Its weights, metrics and predictions are
then compared with the recorded run's, byte for byte. What changed between the two (each code file's
sha256, scratchflow's release, Python, torch, transformers) is recorded with the date, the run and
what differed in `results/verified.json`. Identical: every run that change flagged is told as
verified rather than to be retrained. Different: what differs is said, the flag stays (saying so,
and no longer offering to verify), and the working folder stays for a look. The grid's own runs and results are never
touched.
"""

from __future__ import annotations

import datetime
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from scratchflow import SCRATCHFLOW_DIR
from scratchflow.contract import different_files
from scratchflow.files import file_sha256, read_json, remove_whole, write_json_atomically
from scratchflow.ledger import FINISHED
from scratchflow.plan import Plan
from scratchflow.provenance import TRAINED_BY, VERIFIED_FILE, code_file_now, trained_by

WORKING_FOLDERS = Path(".snakemake") / "scratchflow" / "verify"
# What the workflow writes into the folder it runs in: not the verification's to read or write.
WORKFLOW_OUTPUTS = frozenset({".snakemake", "archives", "models", "checkpoints", "results", "logs", "benchmarks"})
LOCAL_RUNNER = SCRATCHFLOW_DIR / "scripts" / "run_local.sh"


class VerifyRefused(RuntimeError):
    """The runs cannot be verified as asked: said in one line, nothing trained."""


def chosen_run(workdir: Path, plan: Plan, run_ids: list[str]) -> str:
    """The run to train again: the cheapest (the shortest recorded training) of `run_ids`, every one
    of them a finished run of the grid."""
    if not run_ids:
        raise VerifyRefused('give the runs to verify: make verify RUNS="<run id> …" (make status names them)')
    unknown = [run_id for run_id in run_ids if run_id not in plan.runs]
    if unknown:
        grid = workdir.resolve()
        raise VerifyRefused(f"no run {', '.join(unknown)} in the grid in {grid} (make status lists its runs)")
    records = {run_id: workdir / plan.paths(run_id).record for run_id in run_ids}
    untrained = [
        run_id
        for run_id, record in records.items()
        if not record.is_file() or read_json(record).get("outcome", FINISHED) != FINISHED
    ]
    if untrained:
        raise VerifyRefused(f"run {', '.join(untrained)} has not finished training: there is nothing to compare")
    if plan.halving:
        raise VerifyRefused("a halving search's runs are trained in rungs together, not one by one: nothing to verify")

    def cost(run_id: str) -> float:
        return sum((read_json(records[run_id]).get("timings_seconds") or {}).values())

    return min(run_ids, key=cost)


def working_folder(workdir: Path, run_id: str) -> Path:
    """A fresh folder that runs the grid as `workdir` does (each of its entries linked there but the
    workflow's outputs), to train `run_id` in from zero."""
    folder = workdir / WORKING_FOLDERS / run_id
    if folder.exists():
        remove_whole(folder)
    folder.mkdir(parents=True)
    for entry in workdir.iterdir():
        if entry.name not in WORKFLOW_OUTPUTS:
            (folder / entry.name).symlink_to(entry.resolve())
    return folder


def training_command(workdir: Path, plan: Plan, submit: list[str], run_id: str) -> list[str]:
    """What trains and predicts `run_id` alone in a working folder: scratchflow's local runner for a
    grid that ran here, else `submit` (the command that submits the grid to its cluster), with the
    grid's config files and the run's metrics as the target."""
    if plan.executor == "slurm" and not submit:
        raise VerifyRefused(
            "the grid's jobs went to Slurm: give the command that submits it after -- (make verify does), so that "
            "the run trains where its jobs did"
        )
    command = submit if plan.executor == "slurm" else [str(LOCAL_RUNNER)]
    program = shutil.which(command[0])
    if program is None:
        raise VerifyRefused(f"{command[0]} is not found")
    configfiles = [option for path in plan.configfiles for option in ("--configfile", str(workdir / path))]
    return [str(Path(program).absolute()), *command[1:], *configfiles, plan.paths(run_id).metrics]


def runner_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """This Python's environment first on PATH, where the local runner takes its snakemake."""
    environ = dict(os.environ if environ is None else environ)
    return {**environ, "PATH": os.pathsep.join(filter(None, [str(Path(sys.executable).parent), environ.get("PATH")]))}


def what_differs(recorded: Path, again: Path) -> list[str]:
    """What of a run's results (`recorded`, its results folder) the same run trained again (`again`)
    holds otherwise, byte for byte: its weights' files, its metrics, its predictions; none: identical."""
    differing = [f"model/{name}" for name in different_files(recorded / "model", again / "model")]
    for name in ("metrics.json", "predictions.csv"):
        mine, theirs = recorded / name, again / name
        if mine.is_file() != theirs.is_file() or (mine.is_file() and mine.read_bytes() != theirs.read_bytes()):
            differing.append(name)
    return differing


def changes(record: dict[str, Any], again: dict[str, Any], workdir: Path) -> list[dict[str, str]]:
    """What trained the run then (`record`) and what trained it again (`again`) differ in: each code
    file it records, against that file now (in `workdir`, else where the run found it), and each of
    scratchflow's release, Python, torch and transformers: {"what", "was", "now"}."""
    found = []
    code = record.get("code") or {}
    for name, was in code.get("files", {}).items():
        path = code_file_now(code, name, workdir)
        now = file_sha256(path) if path.is_file() else None
        if now is not None and now != was:
            found.append({"what": name, "was": was, "now": now})
    then, now_facts = trained_by(record) or {}, trained_by(again) or {}
    for name in TRAINED_BY:
        if then.get(name) != now_facts.get(name):
            found.append({"what": name, "was": str(then.get(name)), "now": str(now_facts.get(name))})
    return found


def record_verification(
    workdir: Path, run_id: str, found: list[dict[str, str]], differs: list[str], today: datetime.date
) -> None:
    """Add to the grid's results/verified.json what training `run_id` again found: the changes
    (`changes`) reproduce its results where nothing `differs` (`what_differs`), else not."""
    path = workdir / VERIFIED_FILE
    verified = read_json(path) if path.is_file() else []
    verified.append({"run": run_id, "on": today.isoformat(), "changes": found, "differs": differs})
    write_json_atomically(verified, path)
