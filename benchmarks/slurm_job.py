"""One Slurm job's timeline on the test cluster: where a train job's time goes between its submission
and Snakemake seeing it end, against a bare `sbatch` of the same training (benchmarks/
hand_written_job.sh: cp, tar -x, a bare Trainer, rsync back, rm) on the same cluster, in turn.

The scratchflow job is one grid point of benchmarks/lifecycle.py's text task (a tiny BERT on 300 BBC
News articles, 1 epoch: seconds of training, so that the fixed costs show), submitted by
`snakemake --profile profiles/edinburgh --profile tests/slurm_overlay --until train`. Its timeline,
in seconds after the submission:
- scheduled: Slurm started the job (sacct Start; 1 s resolution, as Submit and End are);
- job shell: the job's shell ran the profile's precommand (here it also writes the time);
- rule script: the train rule's script logged its first line (after the job step's Snakemake
  read the workflow, its config and its job);
- first step: the trainer's first training step is done (after the imports, the model's load,
  the stage-in, the Trainer's set-up);
- trained: the record's phases are logged (training, final checkpoint, sync back, cleanup done);
- job end: Slurm's end of the job (the job step's Snakemake exited);
- seen: the submitting Snakemake logged the job as finished.
The bare job: submitted, scheduled, ended (sacct), and seen by a poll of squeue every 0.2 s (a
script's `while squeue -j …`); its own account of its training (after its imports). A third
variant runs the scratchflow job without compiled bytecode (an empty PYTHONPYCACHEPREFIX): what
every process paid while the venv was installed with `pip --no-compile` and PYTHONDONTWRITEBYTECODE
was set, as it is on this machine.

    .venv/bin/python benchmarks/slurm_job.py [--repeats 3]      (root: the test cluster)
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from lifecycle import TRAINING, prepare, text_config
from measure import BIN, REPO, arguments, print_table, save

sys.path.insert(0, str(REPO / "tests"))
from local_slurm import LocalSlurm

USER = os.environ.get("USER") or "root"  # the Edinburgh profile's scratch names it
PROFILE_PRECOMMAND = "unset HF_TOKEN HUGGING_FACE_HUB_TOKEN WANDB_API_KEY"  # profiles/edinburgh's
# The train job's resources under the Edinburgh profile (its sbatch line), for the bare job too.
BARE_SBATCH = ["-p", "PGR-Standard", "--gres=gpu:1", "--cpus-per-task=4", "--mem", "32000", "-t", "720"]
LOG_TIME = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "


def log_time(log: str, pattern: str) -> float:
    """The timestamp of the first line of `log` matching `pattern` (scratchflow's log format)."""
    match = re.search(LOG_TIME + r".*" + pattern, log, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no line matching {pattern!r} in the log:\n{log[-2000:]}")
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def accounting(slurm: LocalSlurm, job_id: str) -> tuple[float, float, float]:
    """Submit, Start and End of a job, from Slurm's accounting (the database lags a few seconds)."""
    for _ in range(100):
        listed = slurm.run("sacct", "-X", "-n", "-P", "--format=Submit,Start,End", "-j", job_id).stdout.split()
        if listed and "Unknown" not in listed[0]:
            return tuple(datetime.fromisoformat(value).timestamp() for value in listed[0].split("|"))
        time.sleep(0.2)
    raise RuntimeError(f"sacct has no end for job {job_id}")


def cluster_env(slurm: LocalSlurm) -> dict[str, str]:
    """The test cluster's client environment, with this venv's Python first on PATH."""
    return {**slurm.env, "PATH": f"{BIN}{os.pathsep}{slurm.env['PATH']}", "USER": USER}


def scratchflow_job(slurm: LocalSlurm, work: Path, env: dict[str, str] | None = None) -> dict[str, float]:
    for produced in ("results", "checkpoints", "logs/train", ".snakemake/slurm_logs"):
        shutil.rmtree(work / produced, ignore_errors=True)
    marker = work / "job-shell-started"
    marker.unlink(missing_ok=True)
    command = slurm.inside(
        str(BIN / "snakemake"),
        *("--snakefile", str(REPO / "Snakefile"), "--profile", str(REPO / "profiles" / "edinburgh")),
        *("--profile", str(REPO / "tests" / "slurm_overlay"), "--until", "train", "--verbose"),
        *("--precommand", f"date +%s.%N > {marker} && {PROFILE_PRECOMMAND}"),
    )
    output = subprocess.run(
        command, cwd=work, env={**cluster_env(slurm), **(env or {})}, capture_output=True, text=True
    )
    if output.returncode != 0:
        raise RuntimeError(f"the workflow failed:\n{output.stdout[-3000:]}{output.stderr[-3000:]}")
    said = output.stdout + output.stderr
    (job_id,) = re.findall(r"SLURM jobid (\d+) \(log: \S*?rule_train/", said)
    seen = re.search(r"\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]\nFinished jobid: \d+ \(Rule: train\)", said)
    (log,) = [path for path in (work / "logs" / "train").glob("*.log") if ".piece-" not in path.name]
    text = log.read_text()
    submitted, started, ended = accounting(slurm, job_id)
    times = {
        "scheduled": started,
        "job shell": float(marker.read_text()),
        "rule script": log_time(text, r"INFO scratchflow: python "),
        "first step": log_time(text, r"first training step of this piece done"),
        "trained": log_time(text, r"trained; phases"),
        "job end": ended,
        "seen": datetime.strptime(" ".join(seen.group(1).split()), "%a %b %d %H:%M:%S %Y").timestamp(),
    }
    return {name: moment - submitted for name, moment in times.items()}


def bare_job(slurm: LocalSlurm, work: Path) -> dict[str, float]:
    results = work / "hand-written"
    shutil.rmtree(results, ignore_errors=True)
    scratch = Path(f"/disk/scratch/{USER}")
    script = " ".join(
        map(
            str,
            (
                "bash",
                REPO / "benchmarks" / "hand_written_job.sh",
                work / "archives" / "articles.tar",
                work / "models" / "tiny-bert",
                results,
                scratch,
            ),
        )
    )
    env = {**cluster_env(slurm), "OMP_NUM_THREADS": "1"}
    submitted = slurm.run("sbatch", "--parsable", *BARE_SBATCH, "-D", str(work), "--wrap", script, env=env)
    job_id = submitted.stdout.strip()
    while slurm.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout.strip() not in ("", "COMPLETED"):
        time.sleep(0.2)
    seen = time.time()
    submit, started, ended = accounting(slurm, job_id)
    if not (results / "train_seconds").is_file():
        raise RuntimeError(f"the bare job {job_id} failed: see {work}/slurm-{job_id}.out")
    return {
        "scheduled": started - submit,
        "job end": ended - submit,
        "seen": seen - submit,
        "training (own account)": float((results / "train_seconds").read_text()),
    }


def main() -> None:
    options = arguments(__doc__).parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a stopped benchmark still stops its cluster
    Path(f"/disk/scratch/{USER}").mkdir(parents=True, exist_ok=True)
    ours, theirs, uncompiled = [], [], []
    with tempfile.TemporaryDirectory(prefix="scratchflow-slurm-job-") as temporary:
        work = prepare(Path(temporary) / "work", text_config)
        slurm = LocalSlurm(Path(temporary) / "slurm").start()
        try:
            # Without bytecode: Python finds no compiled module (an empty cache) and, with
            # PYTHONDONTWRITEBYTECODE set, keeps none, as in a venv installed with --no-compile.
            no_bytecode = {"PYTHONPYCACHEPREFIX": str(Path(temporary) / "empty-bytecode-cache")}
            for _ in range(options.repeats):
                ours.append(scratchflow_job(slurm, work))
                theirs.append(bare_job(slurm, work))
                uncompiled.append(scratchflow_job(slurm, work, no_bytecode))
        finally:
            slurm.stop()
    mine = min(ours, key=lambda timeline: timeline["seen"])
    bare = min(theirs, key=lambda timeline: timeline["seen"])
    compiling = min(uncompiled, key=lambda timeline: timeline["seen"])
    steps = list(mine)
    print_table(
        f"a train job of {TRAINING['epochs']} epoch on the test Slurm cluster, seconds after its submission "
        f"(fastest of {options.repeats})",
        ["moment", "scratchflow", "since the moment before", "bare sbatch", "scratchflow, no bytecode"],
        [
            [
                step,
                mine[step],
                mine[step] - (mine[steps[index - 1]] if index else 0),
                bare.get(step, ""),
                compiling[step],
            ]
            for index, step in enumerate(steps)
        ],
    )
    fixed = {
        "Slurm: submission to start": mine["scheduled"],
        "job start to the rule's script (job step's Snakemake)": mine["rule script"] - mine["scheduled"],
        "rule's script to first training step (imports, model, stage-in)": mine["first step"] - mine["rule script"],
        "training to the last step and the record": mine["trained"] - mine["first step"],
        "record to job end (job step's Snakemake exits)": mine["job end"] - mine["trained"],
        "job end to seen": mine["seen"] - mine["job end"],
    }
    print("\n  " + "\n  ".join(f"{name}: {seconds:.1f} s" for name, seconds in fixed.items()))
    print(
        f"\n  submission to seen: scratchflow {mine['seen']:.1f} s, bare sbatch {bare['seen']:.1f} s "
        f"({mine['seen'] / bare['seen']:.2f}x); the bare job trained {bare['training (own account)']:.1f} s"
    )
    print(f"  without bytecode: {compiling['seen']:.1f} s ({compiling['seen'] / mine['seen']:.2f}x)")
    save(
        options.json,
        "slurm_job",
        {"scratchflow": mine, "bare_sbatch": bare, "scratchflow_spans_s": fixed, "scratchflow_no_bytecode": compiling},
    )


if __name__ == "__main__":
    main()
