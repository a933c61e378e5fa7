#!/usr/bin/env python3
"""Train chosen runs of a grid again from zero, and nothing else:
python scripts/retrain.py RUN [RUN ...] [--dir DIR] [-- COMMAND THAT SUBMITS THE GRID]

Releases the runs' checkpoints and results, and the grid's comparison (scratchflow.retrain), then
runs the grid again: with scratchflow's local runner where it ran here, or with the command after
`--` where its jobs went to Slurm (without one, says to submit the grid as before: whatever runs
the grid next trains the released runs). Only the released runs train, then their predictions and
the comparison. Refuses, releasing nothing, a run not in the grid or one that is being trained now.
Exits 2 on a refusal; else with the runner's exit status."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scratchflow import retrain
from scratchflow.plan import NoPlan, Plan


def main() -> int:
    given = retrain.runs_and_command(sys.argv[1:], __doc__.split("\n\n")[0])
    runs, workdir, submit = given.runs, given.workdir, given.submit
    try:
        plan = Plan.read(workdir)
        command = retrain.rerun_command(plan, submit)
        with retrain.no_local_run(workdir):
            retrain.check(workdir, plan, runs)
            retrain.release(workdir, plan, runs)
            released = f"scratchflow retrain: {', '.join(runs)} released (checkpoints and results)"
            if command is None:
                print(
                    f"{released}. The grid's jobs go to Slurm: submit it as before (its snakemake --profile … "
                    "command, in tmux on the login node); it trains these runs from zero, and nothing else."
                )
                return 0
            print(f"{released}; training them from zero: {' '.join(command)}", flush=True)
            os.chdir(workdir)
            # The runner takes the lock over (this process's copy closes), with this environment's snakemake.
            os.execve(command[0], command, retrain.runner_environment())
    except (NoPlan, retrain.RetrainRefused) as error:
        print(f"scratchflow retrain: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
