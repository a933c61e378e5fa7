"""The scheduler and the login node under a grid of 200 runs, on the real Slurm cluster of the tests
(tests/local_slurm.py; root, about a minute to start): scratchflow's own workflow with the Edinburgh
profile as a lab runs it (its status checks every 10 s and backing off, not the test overlay's 2 s),
a grid of 200 runs of the command task whose program waits `--run-seconds` (as a training would,
without its CPU), one Slurm job per run and packed (`cluster.pack_runs`).

Counted, for `--minutes` of the grid: every call of squeue, sacct, scontrol, sinfo, sbatch and scancel
(a counter in front of each), from the login node (the workflow's Snakemake), from inside the jobs,
and from `make status` run once a minute (scripts/status.py); and how many of the calls name one
job (a call per run) rather than the whole grid. Sampled every 5 s: the main Snakemake process's CPU
seconds (its own, and its children's: the Slurm clients it runs) and its resident memory. Then
the workflow is stopped as a user stops it (Ctrl-C: Snakemake cancels its jobs).

    .venv/bin/python benchmarks/scheduler_load.py [--runs 200] [--minutes 6] [--run-seconds 60]
"""

from __future__ import annotations

import contextlib
import json
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

CLIENTS = ("squeue", "sacct", "scontrol", "sinfo", "sbatch", "scancel")
# In front of each client: one line a call, who called (login node, a job, the status), its argv.
COUNTING_CLIENT = """\
#!/usr/bin/env bash
caller="${{SCHEDULER_CALLER:-${{SLURM_JOB_ID:+job}}}}"
printf '%s\\t%s\\t%s\\n' "$(date +%s.%N)" "$caller" "{name} $*" >> "$SCHEDULER_CALLS"
exec /usr/bin/{name} "$@"
"""
# A training that takes `seconds` and no CPU: a checkpoint at its end, and its metrics.
PROGRAM = """\
import json, os, time
from pathlib import Path

seconds = json.loads(Path(os.environ["SCRATCHFLOW_PARAMS"]).read_text())["seconds"]
time.sleep(seconds)
checkpoint = Path(os.environ["SCRATCHFLOW_CHECKPOINT_DIR"]) / "checkpoint-1"
checkpoint.mkdir(parents=True)
(checkpoint / "state.json").write_text("{}")
(checkpoint / "COMPLETE").touch()
Path(os.environ["SCRATCHFLOW_OUTPUT_DIR"], "metrics.json").write_text(json.dumps({"loss": 1.0}))
"""
PROFILE = "edinburgh"
STATUS_EVERY_SECONDS = 60
SAMPLE_SECONDS = 5


def write_grid(work: Path, runs: int, run_seconds: int, pack: int | None) -> None:
    for label in ("a", "b"):
        (work / "data" / label).mkdir(parents=True)
        (work / "data" / label / "1.txt").write_text(f"text of {label}")
    (work / "program.py").write_text(PROGRAM)
    config = {
        "task": "command",
        "dataset": {"name": "tiny", "path": "data", "format": "folder"},
        "training": {"command": [sys.executable, "program.py"], "seconds": run_seconds, "seed": 0},
        "grid": {"seed": list(range(runs))},
        "aggregate": {"metric": "loss", "goal": "min"},
        **({"cluster": {"pack_runs": pack}} if pack else {}),
    }
    (work / "config").mkdir()
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config))


def counting_clients(work: Path) -> Path:
    folder = work / "bin"
    folder.mkdir()
    for name in CLIENTS:
        (folder / name).write_text(COUNTING_CLIENT.format(name=name))
        (folder / name).chmod(0o755)
    return folder


def cpu_and_memory(pid: int) -> tuple[float, float, float]:
    """The process's CPU seconds (its own; its waited-for children's) and resident MB."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    own = (int(fields[11]) + int(fields[12])) / ticks
    children = (int(fields[13]) + int(fields[14])) / ticks
    resident = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmRSS"))
    return own, children, int(resident.split()[1]) / 1024


def run_variant(slurm: LocalSlurm, work: Path, runs: int, minutes: float, run_seconds: int, pack: int | None) -> dict:
    work.mkdir()
    write_grid(work, runs, run_seconds, pack)
    calls = work / "calls.tsv"
    calls.touch()
    env = {
        **os.environ,
        "SLURM_CONF": str(slurm.conf),
        "USER": os.environ.get("USER") or "root",
        "SCHEDULER_CALLS": str(calls),
        "PATH": f"{counting_clients(work)}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    env.pop("SCHEDULER_CALLER", None)
    command = slurm.inside(
        str(Path(sys.executable).parent / "snakemake"),
        *("--snakefile", str(REPO / "Snakefile"), "--profile", str(REPO / "profiles" / PROFILE)),
        *("--latency-wait", "5"),
        # Short runs, as packed runs are: 20 of the profile's 12-hour train jobs would not fit a pack's wall time.
        *("--set-resources", "train:runtime=5", "predict:runtime=5"),
    )
    samples = []
    with open(work / "snakemake.log", "w") as log:
        started = time.monotonic()
        workflow = subprocess.Popen(command, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
        next_status = started + STATUS_EVERY_SECONDS
        while time.monotonic() - started < minutes * 60 and workflow.poll() is None:
            time.sleep(SAMPLE_SECONDS)
            with contextlib.suppress(StopIteration, FileNotFoundError):  # it ended meanwhile
                samples.append((time.monotonic() - started, *cpu_and_memory(workflow.pid)))
            if time.monotonic() >= next_status:
                status = [sys.executable, str(REPO / "scripts" / "status.py"), str(work)]
                slurm.run(*status, env={**env, "SCHEDULER_CALLER": "status"}, check=False)
                next_status += STATUS_EVERY_SECONDS
        ended_early = workflow.poll() is not None
        workflow.send_signal(signal.SIGINT)  # as a user stops it: Snakemake cancels its jobs
        workflow.wait(timeout=300)
    slurm.run("scancel", "--user", env["USER"], check=False)  # anything left
    if ended_early:
        said = (work / "snakemake.log").read_text()[-3000:]
        raise RuntimeError(f"the workflow ended within the window (exit {workflow.returncode}):\n{said}")
    return figures(calls, samples, started_at_seconds=60.0)


def figures(calls: Path, samples: list[tuple[float, float, float, float]], started_at_seconds: float) -> dict:
    """Calls a minute by caller and client, and how many name one job; the login process's CPU
    share and memory over the steady part (after its first minute: planning, the preflight)."""
    lines = [line.split("\t") for line in calls.read_text().splitlines()]
    first = float(lines[0][0]) if lines else 0.0
    counted: dict[str, dict[str, int]] = {}
    commands: dict[str, int] = {}  # by caller and the call's first words (`scontrol show job`)
    one_job = 0
    for _at, caller, argv in lines:
        who = caller or "login node"
        client = argv.split()[0]
        counted.setdefault(who, {}).setdefault(client, 0)
        counted[who][client] += 1
        what = f"{who}: {' '.join(word for word in argv.split()[:3] if not word[0].isdigit())}"
        commands[what] = commands.get(what, 0) + 1
        if who == "login node" and client in ("squeue", "sacct", "scontrol") and _names_one_job(argv):
            one_job += 1
    span_minutes = max((float(lines[-1][0]) - first) / 60, 1e-9) if lines else 1.0
    steady = [sample for sample in samples if sample[0] >= started_at_seconds]
    (t0, own0, children0, _), (t1, own1, children1, _) = steady[0], steady[-1]
    return {
        "minutes": round(samples[-1][0] / 60, 2),
        "calls_a_minute": {
            who: {client: round(count / span_minutes, 2) for client, count in sorted(clients.items())}
            for who, clients in counted.items()
        },
        "calls": {who: sum(clients.values()) for who, clients in counted.items()},
        "commands": dict(sorted(commands.items(), key=lambda item: -item[1])),
        "login_queries_naming_one_job": one_job,
        "login_cpu_share_of_a_core": round((own1 - own0) / (t1 - t0), 4),
        "login_cpu_share_with_its_clients": round((own1 + children1 - own0 - children0) / (t1 - t0), 4),
        "login_cpu_seconds_first_minute": round(steady[0][1], 2),
        "login_resident_mb_peak": round(max(sample[3] for sample in samples), 1),
    }


def _names_one_job(argv: str) -> bool:
    """A status query about one job: `-j 123`, `--jobs=123`, `show job 123`."""
    words = argv.replace("=", " ").split()
    for flag in ("-j", "--jobs", "job"):
        if flag in words:
            following = words[words.index(flag) + 1 :]
            if following and "," not in following[0]:
                return True
    return False


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--minutes", type=float, default=6.0)
    parser.add_argument("--run-seconds", type=int, default=60)
    parser.add_argument("--pack", type=int, default=20, help="runs per Slurm job in the packed variant")
    options = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the finally below still stops the cluster
    variants = {"one Slurm job per run": None, f"packed, {options.pack} runs a job": options.pack}
    results = {}
    with tempfile.TemporaryDirectory(prefix="scratchflow-scheduler-") as temporary:
        root = Path(temporary)
        slurm = LocalSlurm(root / "slurm").start()
        try:
            for index, (name, pack) in enumerate(variants.items()):
                work = root / f"variant{index}"
                results[name] = run_variant(slurm, work, options.runs, options.minutes, options.run_seconds, pack)
                print(f"  {name}: {json.dumps(results[name])}", flush=True)
        finally:
            slurm.stop()
    rows = []
    for name, result in results.items():
        for who, clients in result["calls_a_minute"].items():
            rows.append([name, who, ", ".join(f"{client} {rate}" for client, rate in clients.items())])
    print_table(f"{options.runs} runs: Slurm calls a minute, by caller", ["variant", "caller", "calls a minute"], rows)
    print_table(
        "the login node's Snakemake, after its first minute",
        ["variant", "CPU share of a core", "with its clients", "peak MB", "queries naming one job"],
        [
            [
                name,
                f"{r['login_cpu_share_of_a_core']:.2%}",
                f"{r['login_cpu_share_with_its_clients']:.2%}",
                r["login_resident_mb_peak"],
                r["login_queries_naming_one_job"],
            ]
            for name, r in results.items()
        ],
    )
    save(options.json, "scheduler_load", {"runs": options.runs, "minutes": options.minutes, "variants": results})


if __name__ == "__main__":
    main()
