"""Grid status: how long `scripts/status.py` takes to answer for a grid of 1,000 (and 10,000) runs.

The grid is written as the workflow leaves it midway: 40 % of the runs finished, 10 % training
(holder, pieces, progress), 10 % paused between pieces, the rest not started. Baseline, run in the
same script in alternation: a bare Python process that reads the same kinds of files (every
metrics.json, pieces.json, running.json and progress.json, and the grid) and prints nothing, the
floor of any status read from shared storage. Both are whole processes, interpreter start included,
as a user runs them. The goal: under 2 s for 1,000 runs.

    .venv/bin/python benchmarks/status.py [--runs 1000 10000] [--repeats 3]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from measure import REPO, arguments, fastest, print_table, run_timed, save
from scratchflow.classification import TRAINER_CHECKPOINT_MARKER
from scratchflow.plan import Plan

MARKER = TRAINER_CHECKPOINT_MARKER

FLOOR = """\
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
for run_id in json.loads((root / "results/plan.json").read_text())["runs"]:
    for path in (root / "results/runs" / run_id / "metrics.json", *(root / "checkpoints" / run_id / name
                 for name in ("pieces.json", "running.json", "progress.json"))):
        try:
            json.loads(path.read_text())
        except FileNotFoundError:
            pass
"""


def write_json(path: Path, content: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content))


def grid_midway(root: Path, runs: int) -> None:
    """`runs` runs as a grid leaves them midway (see the module's docstring)."""
    run_ids = [f"{index:010x}" for index in range(runs)]
    plan = Plan({run_id: {} for run_id in run_ids}, {}, None, "text-classification", "macro_f1", "max", MARKER)
    plan.started("local").write(root)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    holder = {"host": os.uname().nodename, "pid": os.getpid(), "slurm_job_id": None}
    for index, run_id in enumerate(run_ids):
        share = index % 10
        if share < 4:
            write_json(root / "results" / "runs" / run_id / "metrics.json", {"macro_f1": 0.9, "accuracy": 0.9})
            (root / "results" / "runs" / run_id / "record.json").write_text("{}")
        elif share == 4:
            folder = root / "checkpoints" / run_id
            write_json(folder / "pieces.json", [{"piece": 1, "outcome": "running", "started_at": started}])
            write_json(folder / "running.json", holder)
            progress = {
                "step": 50,
                "max_steps": 280,
                "samples_per_second": 150.0,
                "seconds_left": 80,
                "at": time.time(),
            }
            write_json(folder / "progress.json", progress)
            write_json(folder / "checkpoint-40" / MARKER, {})
        elif share == 5:
            folder = root / "checkpoints" / run_id
            stopped = {"outcome": "paused", "signal": "SIGUSR1", "phase": "training", "reached_step": 40}
            write_json(folder / "pieces.json", [{"piece": 1, **stopped, "started_at": started}])
            write_json(folder / "checkpoint-40" / MARKER, {})


def main() -> None:
    parser = arguments(__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[1000, 10000])
    options = parser.parse_args()
    rows, figures = [], {}
    for runs in options.runs:
        with tempfile.TemporaryDirectory() as directory:
            root = Path(directory)
            grid_midway(root, runs)
            status, floor = fastest(
                lambda root=root: run_timed([sys.executable, str(REPO / "scripts" / "status.py"), str(root)]),
                lambda root=root: run_timed([sys.executable, "-c", FLOOR, str(root)]),
                options.repeats,
            )
        rows.append([runs, status.seconds, floor.seconds, status.seconds / floor.seconds, status.peak_mb])
        figures[str(runs)] = {"status_s": status.seconds, "floor_s": floor.seconds, "peak_mb": status.peak_mb}
    print_table(
        "scripts/status.py against reading the same files in a bare Python process (fastest of each)",
        ["runs", "status (s)", "floor (s)", "ratio", "peak MB"],
        rows,
    )
    save(options.json, "status", figures)


if __name__ == "__main__":
    main()
