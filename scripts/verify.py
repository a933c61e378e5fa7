#!/usr/bin/env python3
"""Show that what changed since runs were trained (a task's code, scratchflow's release, a package)
changes none of their results, at the cost of one run:
python scripts/verify.py RUN [RUN ...] [--dir DIR] [-- COMMAND THAT SUBMITS THE GRID]

Trains the cheapest of the runs again from zero, with today's code and packages, in a working folder
of its own (scratchflow.verify), with scratchflow's local runner where the grid ran here, or with the
command after `--` where its jobs went to Slurm; then compares its weights, metrics and predictions
with the recorded run's, byte for byte. Identical: records that what changed reproduces the runs'
results (results/verified.json), so that the status, the comparison and the report say "verified"
instead of asking to retrain them. Different: says what differs, and the runs stay flagged. The
grid's own runs and results are never touched. Exits 0 when identical, 1 when not (or the training
failed), 2 on a refusal."""

import datetime
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scratchflow import verify
from scratchflow.files import read_json, remove_whole
from scratchflow.plan import NoPlan, Plan
from scratchflow.retrain import runs_and_command


def main() -> int:
    given = runs_and_command(sys.argv[1:], __doc__.split("\n\n")[0])
    workdir = given.workdir.resolve()
    try:
        plan = Plan.read(workdir)
        run_id = verify.chosen_run(workdir, plan, given.runs)
        command = verify.training_command(workdir, plan, given.submit, run_id)
    except (NoPlan, verify.VerifyRefused) as error:
        print(f"scratchflow verify: {error}", file=sys.stderr)
        return 2
    folder = verify.working_folder(workdir, run_id)
    print(f"scratchflow verify: training run {run_id} again from zero in {folder}: {' '.join(command)}", flush=True)
    if subprocess.run(command, cwd=folder, env=verify.runner_environment()).returncode != 0:
        print(f"scratchflow verify: run {run_id} did not train again (above); its working folder: {folder}")
        return 1
    recorded, again = (base / plan.paths(run_id).record for base in (workdir, folder))
    differing = verify.what_differs(recorded.parent, again.parent)
    changes = verify.changes(read_json(recorded), read_json(again), workdir)
    changed = "; ".join(f"{change['what']} {change['was'][:12]} → {change['now'][:12]}" for change in changes)
    trained_again = f"run {run_id}, trained again with today's code and packages ({changed or 'no change recorded'})"
    verify.record_verification(workdir, run_id, changes, differing, datetime.date.today())
    if differing:
        print(
            f"scratchflow verify: {trained_again}, differs in {', '.join(differing)}: what changed changes results, "
            f"and the runs stay flagged (make status). The run trained again: {again.parent}"
        )
        return 1
    remove_whole(folder)
    print(
        f"scratchflow verify: {trained_again}, has the same weights, metrics and predictions, byte for byte: "
        f"recorded in {workdir / verify.VERIFIED_FILE}; make status says the runs it flagged are verified, and the "
        "comparison and the report do once the workflow runs again"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
