"""The preflight's cost: how long the checks against the live cluster take, and their share of the
workflow's start-up (from `snakemake` to its first `sbatch`).

On the test Slurm cluster of the tests (tests/local_slurm.py; root, about a minute to start), a
one-run grid with OSCER's profile: the time from starting Snakemake to its first `sbatch call`,
with the preflight (the default) and without it (`--config preflight=False`), the baseline, in
alternation in the same script; each workflow is stopped at its first submission. Besides, the
preflight's own queries and checks alone, in this process (`scontrol` twice and `sacctmgr`).

    .venv/bin/python benchmarks/preflight.py [--repeats 3]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from measure import REPO, arguments, print_table, save

sys.path.insert(0, str(REPO / "tests"))
from local_slurm import LocalSlurm
from scratchflow.preflight import Request, problems, read_cluster

USER = os.environ.get("USER") or "root"
VARIANTS = {"without preflight (--config preflight=False)": ["--config", "preflight=False"], "with preflight": []}


def grid(work: Path) -> None:
    for label in ("a", "b"):
        (work / "data" / label).mkdir(parents=True)
        (work / "data" / label / "1.txt").write_text(label)
    config = {
        "task": "command",
        "dataset": {"name": "tiny", "path": str(work / "data"), "format": "folder"},
        "training": {"command": ["python", "-c", "pass"], "seed": 0},
        "grid": {"seed": [0]},
        "aggregate": {"metric": "accuracy"},
    }
    (work / "config").mkdir()
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config))


def seconds_to_first_sbatch(slurm: LocalSlurm, work: Path, extra: list[str]) -> float:
    """Start the workflow, read its output until its first sbatch, stop it (it cancels its job)."""
    command = slurm.inside(
        str(Path(sys.executable).parent / "snakemake"),
        *("--snakefile", str(REPO / "Snakefile"), "--profile", str(REPO / "profiles" / "oscer")),
        *("--profile", str(REPO / "tests" / "slurm_overlay"), "--verbose", *extra),
    )
    env = {**slurm.env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "USER": USER}
    started = time.perf_counter()
    workflow = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in workflow.stdout:
        seen.append(line)
        if line.startswith("sbatch call:"):
            seconds = time.perf_counter() - started
            break
    else:
        raise RuntimeError("the workflow ended before submitting a job:\n" + "".join(seen[-40:]))
    workflow.send_signal(signal.SIGTERM)
    workflow.communicate(timeout=120)
    slurm.run("scancel", "--user", USER, check=False)
    return seconds


def main() -> None:
    parser = arguments(__doc__.split("\n\n")[0])
    options = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a stopped benchmark still stops its cluster
    startups: dict[str, list[float]] = {name: [] for name in VARIANTS}
    checks = []
    with tempfile.TemporaryDirectory(prefix="scratchflow-preflight-") as temporary:
        slurm = LocalSlurm(Path(temporary) / "slurm").start()
        try:
            for repeat in range(options.repeats):
                for name, extra in VARIANTS.items():
                    work = Path(temporary) / f"run-{repeat}-{len(extra)}"
                    work.mkdir()
                    grid(work)
                    startups[name].append(seconds_to_first_sbatch(slurm, work, extra))
                checks.append(one_preflight(slurm))
        finally:
            slurm.stop()
    baseline, with_preflight = (min(startups[name]) for name in VARIANTS)
    preflight = min(checks)
    print_table(
        "from starting snakemake to its first sbatch, OSCER's profile on the test cluster (fastest of each)",
        ["variant", "s", "x without"],
        [[name, min(times), min(times) / baseline] for name, times in startups.items()],
    )
    share = preflight / with_preflight
    print(f"\nthe preflight's queries and checks alone: {preflight:.3f} s, {share:.1%} of the start-up with it")
    save(
        options.json,
        "preflight",
        {"startup_without_s": baseline, "startup_with_s": with_preflight, "preflight_s": preflight},
    )


def one_preflight(slurm: LocalSlurm) -> float:
    """The preflight's queries and checks, in this process, as the workflow runs them."""
    os.environ["SLURM_CONF"] = str(slurm.conf)
    requests = [Request("archive_dataset", "normal", None, [60]), Request("train", "gpu", None, [720, 1440, 2160])]
    started = time.perf_counter()
    problems(requests, read_cluster(USER, run=lambda command: run_inside(slurm, command)))
    return time.perf_counter() - started


def run_inside(slurm: LocalSlurm, command: list[str]) -> str:
    return slurm.run(*command).stdout


if __name__ == "__main__":
    main()
