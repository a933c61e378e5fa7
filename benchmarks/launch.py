"""Launch overhead of several training processes: the same tiny training (a tiny BERT, 300 BBC
articles) as one train job, with 1 process (in the job's own process, no torchrun) and with
torchrun and 2 processes on this node (DDP over gloo on CPU), through the README's local command
(`scripts/run_local.sh --until train --set-resources train:processes_per_node=N`).

Per shape: the job's wall time; the time from the job's first log line to the end of its first
training step (what launching costs: torchrun, each process's imports, the process group, the
model loaded per process); and the training speed after the first step, from the job's log. On
this 2-core machine, 2 processes share 2 cores: DDP cannot be faster than one process here, and
the figure shows what the gradient exchange costs, not GPU scaling. Several nodes: not built yet.

    .venv/bin/python benchmarks/launch.py [--repeats 3] [--epochs 10]
"""

from __future__ import annotations

import re
import shutil
import tempfile
from datetime import datetime
from pathlib import Path

import yaml
from lifecycle import prepare, text_config
from measure import REPO, arguments, print_table, run_timed, save, snakemake_env

SHAPES = (1, 2)
TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def logged_at(line: str) -> datetime:
    return datetime.strptime(TIMESTAMP.match(line).group(1), "%Y-%m-%d %H:%M:%S,%f")


def one_job(work: Path, processes: int) -> dict[str, float]:
    for produced in ("results", "checkpoints", "logs"):
        shutil.rmtree(work / produced, ignore_errors=True)
    command = [str(REPO / "scripts" / "run_local.sh"), "--until", "train"]
    wall = run_timed([*command, "--set-resources", f"train:processes_per_node={processes}"], work, snakemake_env())
    (log,) = (work / "logs" / "train").glob("*.log")
    lines = [line for line in log.read_text().splitlines() if TIMESTAMP.match(line)]
    started = logged_at(lines[0])
    (first_step,) = [logged_at(line) for line in lines if "first training step of this piece done" in line]
    (speed,) = [float(re.search(r": ([\d.]+) samples/s", line).group(1)) for line in lines if "samples/s (" in line]
    return {
        "wall_s": wall.seconds,
        "to_first_step_s": (first_step - started).total_seconds(),
        "samples_per_s": speed,
    }


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--epochs", type=int, default=10)
    options = parser.parse_args()
    runs: dict[int, list[dict[str, float]]] = {processes: [] for processes in SHAPES}
    with tempfile.TemporaryDirectory(prefix="scratchflow-launch-") as temporary:
        work = prepare(Path(temporary), text_config)
        config_file = work / "config" / "config.yaml"
        config = yaml.safe_load(config_file.read_text())
        config["training"]["epochs"] = options.epochs
        config_file.write_text(yaml.safe_dump(config))
        for _ in range(options.repeats):
            for processes in SHAPES:
                runs[processes].append(one_job(work, processes))
    best = {
        processes: {
            "wall_s": min(run["wall_s"] for run in measured),
            "to_first_step_s": min(run["to_first_step_s"] for run in measured),
            "samples_per_s": max(run["samples_per_s"] for run in measured),
        }
        for processes, measured in runs.items()
    }
    one = best[1]
    for figures in best.values():
        figures["wall_ratio"] = figures["wall_s"] / one["wall_s"]
        figures["to_first_step_ratio"] = figures["to_first_step_s"] / one["to_first_step_s"]
        figures["samples_per_s_ratio"] = figures["samples_per_s"] / one["samples_per_s"]
    print_table(
        f"one train job, tiny BERT, {options.epochs} epochs, fastest of {options.repeats}",
        ["shape", "wall s", "x 1", "to first step s", "x 1", "samples/s", "x 1"],
        [
            [
                "1 process" if processes == 1 else f"torchrun 1x{processes}",
                f["wall_s"],
                f["wall_ratio"],
                f["to_first_step_s"],
                f["to_first_step_ratio"],
                f["samples_per_s"],
                f["samples_per_s_ratio"],
            ]
            for processes, f in best.items()
        ],
    )
    save(options.json, "launch", {"epochs": options.epochs, "shapes": {str(k): v for k, v in best.items()}})


if __name__ == "__main__":
    main()
