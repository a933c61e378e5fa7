"""How long after a Slurm job ends its next job goes out: a run's train job after another's, `--jobs 1`.

On the test Slurm cluster of the tests (tests/local_slurm.py; root, about a minute to start), two
grid points of the `command` task whose program only waits `--seconds` (train jobs of that
length, with no CPU to share), one Slurm job at a time, with the Edinburgh profile as written (its
first status check 10 s after a submission, then 10 s later each time no job has finished, up to the
plugin's fixed 180 s). (A run's predict job no longer follows its train job on Slurm: the train job
predicts, scratchflow.prediction.) Measured from Slurm's accounting: the second train job's
submission time minus the first one's end (1 s resolution), and the `squeue` calls the submitting
Snakemake made per minute while it waited.
Baseline, in the same run: the same workflow with `--no-hooks`, without which scratchflow notices a
job's end (scripts/scratchflow/snakemake_adapter.py) as the plugin alone does.

    .venv/bin/python benchmarks/job_end_lag.py [--seconds 150] [--repeats 1]
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import yaml
from measure import REPO, arguments, print_table, save

sys.path.insert(0, str(REPO / "tests"))
from local_slurm import LocalSlurm

WAITING_PROGRAM = """
import json, os, pathlib, time
time.sleep(json.loads(pathlib.Path(os.environ["SCRATCHFLOW_PARAMS"]).read_text())["seconds"])
pathlib.Path(os.environ["SCRATCHFLOW_OUTPUT_DIR"], "metrics.json").write_text('{"waited": 1}')
"""
USER = os.environ.get("USER") or "root"  # unset in some sandboxes; the profile's scratch names it
VARIANTS = {"the plugin alone (--no-hooks)": ["--no-hooks"], "scratchflow": []}


def grid(work: Path, seconds: int) -> None:
    for label in ("a", "b"):
        (work / "data" / label).mkdir(parents=True)
        (work / "data" / label / "1.txt").write_text(label)
    (work / "wait.py").write_text(WAITING_PROGRAM)
    config = {
        "task": "command",
        "dataset": {"name": "tiny", "path": str(work / "data"), "format": "folder"},
        "training": {"command": ["python", str(work / "wait.py")], "seconds": seconds},
        "grid": {"seconds": [seconds, seconds + 1]},
        "aggregate": {"metric": "waited"},
    }
    (work / "config").mkdir()
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config))


def one_run(slurm: LocalSlurm, work: Path, extra: list[str]) -> dict[str, float]:
    command = slurm.inside(
        str(Path(sys.executable).parent / "snakemake"),
        *("--snakefile", str(REPO / "Snakefile"), "--profile", str(REPO / "profiles" / "edinburgh")),
        *("--profile", str(REPO / "tests" / "slurm_overlay"), "--slurm-init-seconds-before-status-checks", "10"),
        *("--verbose", "--jobs", "1", *extra),
    )
    env = {**slurm.env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "USER": USER}
    started = datetime.now()
    output = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    if output.returncode != 0:
        raise RuntimeError(f"the workflow failed:\n{output.stdout[-3000:]}{output.stderr[-3000:]}")
    minutes = (datetime.now() - started).total_seconds() / 60
    log = output.stdout + output.stderr
    trains = [
        job_id for job_id, rule in re.findall(r"SLURM jobid (\d+) \(log: \S*?rule_(\w+?)/", log) if rule == "train"
    ]
    accounting = slurm.run("sacct", "-X", "-n", "-P", "--format=JobID,Submit,End", "-j", ",".join(trains))
    times = {
        job_id: (datetime.fromisoformat(submit), datetime.fromisoformat(end))
        for job_id, submit, end in (line.split("|") for line in accounting.stdout.split())
    }
    first, second = sorted(trains, key=int)
    lag = (times[second][0] - times[first][1]).total_seconds()
    status_checks = int(re.search(r"Status query timing summary at shutdown: calls=(\d+)", log).group(1))
    return {"lag_s": lag, "status_checks_per_minute": status_checks / minutes, "workflow_minutes": minutes}


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--seconds", type=int, default=150, help="how long the train job runs")
    parser.set_defaults(repeats=1)
    options = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a stopped benchmark still stops its cluster
    Path(f"/disk/scratch/{USER}").mkdir(parents=True, exist_ok=True)  # the profile's scratch
    measured: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="scratchflow-lag-") as temporary:
        slurm = LocalSlurm(Path(temporary) / "slurm").start()
        try:
            for repeat in range(options.repeats):
                for name, extra in VARIANTS.items():
                    work = Path(temporary) / f"run-{repeat}-{'baseline' if extra else 'scratchflow'}"
                    work.mkdir()
                    grid(work, options.seconds)
                    measured[name].append(one_run(slurm, work, extra))
        finally:
            slurm.stop()
    best = {name: min(runs, key=lambda run: run["lag_s"]) for name, runs in measured.items()}
    baseline = best[next(iter(VARIANTS))]["lag_s"]
    print_table(
        f"a {options.seconds} s train job's end to the next one's submission (--jobs 1), on the test Slurm cluster",
        ["variant", "lag s", "x plugin alone", "squeue calls / min"],
        [
            [name, run["lag_s"], run["lag_s"] / baseline if baseline else float("nan"), run["status_checks_per_minute"]]
            for name, run in best.items()
        ],
    )
    save(options.json, "job_end_lag", {"seconds": options.seconds, "variants": best})


if __name__ == "__main__":
    main()
