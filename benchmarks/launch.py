"""Launch overhead of several training processes: the same tiny training (a tiny BERT, 300 BBC
articles) as one train job, with 1 process (in the job's own process, no torchrun) and with
torchrun and 2 processes on this node (DDP over gloo on CPU), through the README's local command
(`scripts/run_local.sh --until train --set-resources train:processes_per_node=N`). With
`--cluster`, on the test Slurm cluster of the tests (tests/local_slurm.py; root, about a minute to
start) with the OSCER profile: 1 process (one fake GPU), 1 node x 2 (two), and the profile's own
2 nodes x 2 (one launcher per node, each staging into its own scratch, then torchrun).

Per shape: the job's wall time; the time from the job's first log line to the end of its first
training step (what launching costs: torchrun, each process's imports, the process group, the
model loaded per process); and the training speed after the first step, from the job's log. On
this 2-core machine, 2 processes share 2 cores: DDP cannot be faster than one process here, and
the figure shows what the gradient exchange costs, not GPU scaling; the test cluster's two nodes
share the same 2 cores.

    .venv/bin/python benchmarks/launch.py [--repeats 3] [--epochs 10] [--cluster]
"""

from __future__ import annotations

import re
import shutil
import signal
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import yaml
from lifecycle import prepare, text_config
from measure import REPO, arguments, print_table, run_timed, save, snakemake, snakemake_env

sys.path.insert(0, str(REPO / "tests"))
from local_slurm import LocalSlurm

# shape -> the train job's resources on this machine (run_local.sh), and on the test cluster
# (`--set-resources` replaces the OSCER profile's train entry; none keeps its 2 nodes x 2 GPUs).
SHAPES = {
    "1 process": (["train:processes_per_node=1"], ["train:slurm_partition='gpu'", "train:gres='gpu:1'"]),
    "torchrun 1x2": (["train:processes_per_node=2"], ["train:slurm_partition='gpu'", "train:gres='gpu:2'"]),
    "2 nodes x 2": (None, []),
}
TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def logged_at(line: str) -> datetime:
    return datetime.strptime(TIMESTAMP.match(line).group(1), "%Y-%m-%d %H:%M:%S,%f")


def one_job(work: Path, resources: list[str], slurm: LocalSlurm | None) -> dict[str, float]:
    for produced in ("results", "checkpoints", "logs"):
        shutil.rmtree(work / produced, ignore_errors=True)
    set_resources = ["--set-resources", *resources] if resources else []
    if slurm is None:
        command = [str(REPO / "scripts" / "run_local.sh"), "--until", "train", *set_resources]
        wall = run_timed(command, work, snakemake_env())
    else:
        profiles = ["--profile", str(REPO / "profiles" / "oscer"), "--profile", str(REPO / "tests" / "slurm_overlay")]
        command = [snakemake(), "--snakefile", str(REPO / "Snakefile"), *profiles, "--until", "train", *set_resources]
        wall = run_timed(slurm.inside(*command), work, {**snakemake_env(), "SLURM_CONF": str(slurm.conf)})
    (log,) = (work / "logs" / "train").glob("*.log")
    lines = [line for line in log.read_text().splitlines() if TIMESTAMP.match(line)]
    started = logged_at(lines[0])
    (first_step,) = [logged_at(line) for line in lines if "first training step of this piece done" in line]
    (speed,) = [float(re.search(r": ([\d.]+) samples/s", line).group(1)) for line in lines if "samples/s (" in line]
    return {
        "wall_s": wall.seconds,
        "job_s": (logged_at(lines[-1]) - started).total_seconds(),
        "to_first_step_s": (first_step - started).total_seconds(),
        "samples_per_s": speed,
    }


def measure_shapes(work: Path, repeats: int, slurm: LocalSlurm | None) -> dict[str, list[dict[str, float]]]:
    runs: dict[str, list[dict[str, float]]] = {}
    for _ in range(repeats):
        for name, (local, cluster) in SHAPES.items():
            resources = cluster if slurm else local
            if resources is not None:
                runs.setdefault(name, []).append(one_job(work, resources, slurm))
    return runs


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--cluster", action="store_true", help="on the test Slurm cluster, three shapes")
    options = parser.parse_args()
    # A benchmark stopped with SIGTERM still stops its cluster (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    with tempfile.TemporaryDirectory(prefix="scratchflow-launch-") as temporary:
        work = prepare(Path(temporary), text_config)
        config_file = work / "config" / "config.yaml"
        config = yaml.safe_load(config_file.read_text())
        config["training"]["epochs"] = options.epochs
        config_file.write_text(yaml.safe_dump(config))
        slurm = LocalSlurm(Path(temporary) / "slurm").start() if options.cluster else None
        try:
            runs = measure_shapes(work, options.repeats, slurm)
        finally:
            if slurm:
                slurm.stop()
    best = {
        name: {
            "wall_s": min(run["wall_s"] for run in measured),
            "job_s": min(run["job_s"] for run in measured),
            "to_first_step_s": min(run["to_first_step_s"] for run in measured),
            "samples_per_s": max(run["samples_per_s"] for run in measured),
        }
        for name, measured in runs.items()
    }
    one = best["1 process"]
    for figures in best.values():
        for figure in ("wall_s", "job_s", "to_first_step_s", "samples_per_s"):
            figures[f"{figure}_ratio"] = figures[figure] / one[figure]
    where = "the test Slurm cluster, OSCER profile" if options.cluster else "this machine"
    print_table(
        f"one train job on {where}, tiny BERT, {options.epochs} epochs, fastest of {options.repeats}",
        ["shape", "wall s", "x 1", "job s", "x 1", "to first step s", "x 1", "samples/s", "x 1"],
        [
            [
                name,
                *(f["wall_s"], f["wall_s_ratio"], f["job_s"], f["job_s_ratio"]),
                *(f["to_first_step_s"], f["to_first_step_s_ratio"], f["samples_per_s"], f["samples_per_s_ratio"]),
            ]
            for name, f in best.items()
        ],
    )
    save(options.json, "launch", {"epochs": options.epochs, "where": where, "shapes": best})


if __name__ == "__main__":
    main()
