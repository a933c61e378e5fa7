"""Submission at scale, on the real local Slurm cluster of the tests (tests/local_slurm.py; root,
about a minute to start): 200 tiny jobs through the Slurm plugin, as one sbatch per job, as job
arrays, and packed (several jobs per Slurm job with Snakemake's groups). Counts the sbatch calls (a
counter in front of the real sbatch) and the Slurm jobs (sacct), and times the whole run.

Each job is a one-line shell rule: what is measured is the cost of getting it run (submission,
scheduling, Snakemake's start inside the job, status checks), not work. The default variant is the
plugin's own (40 s before the first status check); the others use scratchflow profiles' 10 s.

    .venv/bin/python benchmarks/submission.py [--jobs 200] [--pack 20] [--gpu]

With --gpu, every job asks for one GPU, and the variants are one Slurm job per run against runs
packed the way `cluster.pack_runs` packs them (each Slurm job still asks for one GPU).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import REPO, arguments, print_table, save, snakemake

sys.path.insert(0, str(REPO / "tests"))
from local_slurm import LocalSlurm

WORKFLOW = """\
rule all:
    input:
        expand("out/{{i}}.txt", i=range({jobs})),


rule tiny:
    output:
        "out/{{i}}.txt",
    resources:
        slurm_partition="batch",
        runtime=5,
        mem_mb=200,
        cpus_per_task=1,
    shell:
        "echo {{wildcards.i}} > {{output}}"
"""

# --gpu: each job asks for one GPU; packed the way cluster.pack_runs packs scratchflow's runs (a
# pack job per pack joins them into one group job; a local pack_slot makes them run one after
# another), so that a Slurm job asks for one GPU, not one per packed job.
GPU_WORKFLOW = """\
PACK = {pack}


def tiny_jobs_of(wildcards):
    first = int(wildcards.p) * PACK
    return expand("out/{{i}}.txt", i=range(first, min(first + PACK, {jobs})))


resource_scopes:
    pack_slot="local",


if PACK > 1:
    workflow.register_resource("pack_slot", 1)


rule all:
    input:
        expand("out/{{i}}.txt", i=range({jobs})),
        expand("packs/{{p}}.done", p=range(-(-{jobs} // PACK)) if PACK > 1 else []),


rule tiny:
    output:
        "out/{{i}}.txt",
    group:
        "packed" if PACK > 1 else None
    resources:
        slurm_partition="batch",
        runtime=5,
        mem_mb=200,
        cpus_per_task=1,
        gres="gpu:1",
        pack_slot=1,
    shell:
        "echo {{wildcards.i}} > {{output}}"


rule pack:
    input:
        tiny_jobs_of,
    output:
        "packs/{{p}}.done",
    group:
        "packed"
    resources:
        slurm_partition="batch",
        runtime=1,
        mem_mb=200,
        cpus_per_task=1,
    shell:
        "touch {{output}}"
"""

# Plugin 2.8 puts every task's command into one sbatch argument; past Linux's 128 KB limit for one
# argument it falls back to a script that runs the first task's job in every task (found here with
# 100 tasks of this workflow). scratchflow's profiles use the same limit.
ARRAY_LIMIT = 20
# Plugin 2.8 also holds back array jobs it is handed until a whole array's worth of the rule's
# ready-or-running jobs has arrived, which may never happen: such a run would wait forever.
STALL_SECONDS = 120

COUNTING_SBATCH = """\
#!/usr/bin/env bash
echo x >> "$SBATCH_CALLS"
exec /usr/bin/sbatch "$@"
"""


def variants(pack: int) -> dict[str, list[str]]:
    quick = ["--slurm-init-seconds-before-status-checks", "10"]
    return {
        "one sbatch per job, plugin default (40 s first check)": [],
        "one sbatch per job, first check after 10 s": quick,
        # See ARRAY_LIMIT.
        f"job arrays of {ARRAY_LIMIT} (--slurm-array-jobs)": [
            *quick,
            "--slurm-array-jobs",
            "all",
            "--slurm-array-limit",
            str(ARRAY_LIMIT),
        ],
        f"packed, {pack} jobs per Slurm job (groups)": [
            *quick,
            "--groups",
            "tiny=pack",
            "--group-components",
            f"pack={pack}",
        ],
    }


def gpu_variants(pack: int) -> dict[str, tuple[int, list[str]]]:
    """name -> (runs per Slurm job, options): one GPU a job."""
    quick = ["--slurm-init-seconds-before-status-checks", "10"]
    return {
        "one GPU job per run, first check after 10 s": (1, quick),
        f"{pack} runs per GPU job (as cluster.pack_runs: {pack})": (pack, quick),
    }


def run_variant(slurm: LocalSlurm, work: Path, jobs: int, options: list[str], workflow: str) -> dict[str, object]:
    """One run of the workflow; stopped and reported as stalled when no job has finished for
    STALL_SECONDS while none is queued or running (Snakemake would wait forever)."""
    work.mkdir()
    (work / "Snakefile").write_text(workflow)
    counter = work / "bin"
    counter.mkdir()
    (counter / "sbatch").write_text(COUNTING_SBATCH)
    (counter / "sbatch").chmod(0o755)
    calls = work / "sbatch-calls"
    calls.touch()
    started_at = slurm.run("date", "+%Y-%m-%dT%H:%M:%S").stdout.strip()
    env = {
        **os.environ,
        "SLURM_CONF": str(slurm.conf),
        "SBATCH_CALLS": str(calls),
        "PATH": f"{counter}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    command = slurm.inside(
        snakemake(), "--executor", "slurm", "--jobs", "100", "--slurm-no-account", "--latency-wait", "5", *options
    )
    outputs = work / "out"
    with open(work / "snakemake.log", "w") as log:
        started = time.perf_counter()
        process = subprocess.Popen(command, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
        done, progress_at, stalled = 0, started, False
        while process.poll() is None:
            time.sleep(5)
            now_done = len(list(outputs.iterdir())) if outputs.is_dir() else 0
            if now_done != done:
                done, progress_at = now_done, time.perf_counter()
            elif time.perf_counter() - progress_at > STALL_SECONDS and not slurm.run("squeue", "-h").stdout.strip():
                stalled = True
                process.terminate()
                process.wait()
        seconds = time.perf_counter() - started
    finished = len(list(outputs.iterdir())) if outputs.is_dir() else 0
    if not stalled and process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed; see {work / 'snakemake.log'}")
    slurm_jobs = slurm.run("sacct", "-X", "-n", "-P", "-o", "JobID", "--starttime", started_at).stdout.split()
    return {
        "seconds": seconds,
        "finished_jobs": finished,
        "stalled": stalled,
        "sbatch_calls": len(calls.read_text().split()),
        "slurm_jobs": len({job.split("_")[0] for job in slurm_jobs}),
    }


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--pack", type=int, default=20)
    parser.add_argument("--gpu", action="store_true", help="jobs of one GPU: one per run, and packed")
    options = parser.parse_args()
    # name -> (the workflow, its options)
    if options.gpu:
        chosen = {
            name: (GPU_WORKFLOW.format(jobs=options.jobs, pack=pack), extra)
            for name, (pack, extra) in gpu_variants(options.pack).items()
        }
    else:
        chosen = {name: (WORKFLOW.format(jobs=options.jobs), extra) for name, extra in variants(options.pack).items()}
    results = {}
    # A benchmark stopped with SIGTERM still stops its cluster (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    with tempfile.TemporaryDirectory(prefix="scratchflow-submission-") as temporary:
        root = Path(temporary)
        slurm = LocalSlurm(root / "slurm").start()
        try:
            for index, (name, (workflow, extra)) in enumerate(chosen.items()):
                results[name] = run_variant(slurm, root / f"variant{index}", options.jobs, extra, workflow)
                print(f"  {name}: {results[name]}", flush=True)
        finally:
            slurm.stop()
    baseline = next(iter(results.values()))["seconds"]
    for figures in results.values():
        figures["ratio_to_default"] = figures["seconds"] / baseline
    print_table(
        f"{options.jobs} tiny jobs on the local Slurm cluster",
        ["variant", "sbatch calls", "Slurm jobs", "jobs done", "seconds", "x default"],
        [
            [
                name,
                f["sbatch_calls"],
                f["slurm_jobs"],
                f"{f['finished_jobs']}{' (stalled)' if f['stalled'] else ''}",
                f["seconds"],
                f["ratio_to_default"],
            ]
            for name, f in results.items()
        ],
    )
    save(options.json, "submission", {"jobs": options.jobs, "pack": options.pack, "variants": results})


if __name__ == "__main__":
    main()
