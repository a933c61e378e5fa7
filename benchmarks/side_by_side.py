"""Two trainings side by side on a 2-core machine: what `make test` does when it runs the Slurm tests
beside the others (tests/run_all.sh), and what any two jobs sharing a node's cores do.

Each variant runs the README's local command (`scripts/run_local.sh`) on a grid of one run, the
tests' long run (a tiny BERT, 280 steps, 300 BBC News articles), in two directories at once, and
is compared with the same run alone (baseline): a ratio of 1 means the two cost the time of one,
2 that they might as well have run one after the other. Variants: 2 threads each with OpenMP's
default waiting (its idle threads spin for a while before they sleep), 2 threads each with
OMP_WAIT_POLICY=PASSIVE (they sleep at once), and 1 thread each. The weights of every run are
compared with the baseline's of the same thread count: the wait policy must change no bit.

    .venv/bin/python benchmarks/side_by_side.py [--repeats 1]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import REPO, arguments, print_table, save, snakemake_env

sys.path.insert(0, str(REPO / "tests"))
from conftest import copy_bbc_subset, long_run  # the tests' own long run
from scratchflow.dataset import load_examples
from scratchflow.tiny_model import build_tiny_bert

PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}
VARIANTS = {  # name -> (threads per run, extra environment)
    "2 threads each, OpenMP's default waiting": (2, {}),
    "2 threads each, OMP_WAIT_POLICY=PASSIVE": (2, PASSIVE),
    "1 thread each": (1, {}),
}


def train_side_by_side(work: Path, data: Path, model: Path, runs: int, threads: int, env: dict) -> tuple[float, list]:
    """`runs` one-run grids at once; the wall time until the last ends, and each run's weights."""
    started, processes, workdirs = time.perf_counter(), [], []
    for _ in range(runs):
        workdir = Path(tempfile.mkdtemp(dir=work))
        long_run(workdir, data, model)
        command = [str(REPO / "scripts" / "run_local.sh"), "--set-threads", f"train={threads}", f"predict={threads}"]
        output = open(workdir / "run.log", "w")  # noqa: SIM115 (closed with the process below)
        processes.append(
            (
                subprocess.Popen(
                    command, cwd=workdir, env={**os.environ, **snakemake_env(), **env}, stdout=output, stderr=output
                ),
                output,
            )
        )
        workdirs.append(workdir)
    for process, output in processes:
        if process.wait() != 0:
            raise RuntimeError(f"a run failed: see {output.name}")
        output.close()
    seconds = time.perf_counter() - started
    weights = [next(workdir.glob("results/runs/*/model/model.safetensors")).read_bytes() for workdir in workdirs]
    for workdir in workdirs:
        shutil.rmtree(workdir)
    return seconds, weights


def main() -> None:
    options = arguments(__doc__.split("\n")[0]).parse_args()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        data = copy_bbc_subset(work / "articles", per_label=60)
        texts = [example.text for example in load_examples(data, "folder", "text", "label")]
        model = build_tiny_bert(texts, work / "tiny-bert")
        alone: dict[int, tuple[float, bytes]] = {}
        rows, figures = [], {}
        for threads in (2, 1):
            best = min(train_side_by_side(work, data, model, 1, threads, {}) for _ in range(options.repeats))
            alone[threads] = (best[0], best[1][0])
            rows.append([f"one run alone, {threads} thread{'s' * (threads > 1)}", best[0], 1.0, "-"])
        for name, (threads, env) in VARIANTS.items():
            seconds, weights = min(
                train_side_by_side(work, data, model, 2, threads, env) for _ in range(options.repeats)
            )
            same = all(weight == alone[threads][1] for weight in weights)
            ratio = seconds / alone[threads][0]
            rows.append([f"two side by side, {name}", seconds, ratio, "yes" if same else "NO"])
            figures[name] = {"seconds": seconds, "ratio_to_one_alone": ratio, "same_weights": same}
        figures["alone"] = {f"{threads} threads": seconds for threads, (seconds, _) in alone.items()}
    print_table(
        "Two one-run grids side by side on this machine, against one alone (wall time)",
        ["variant", "seconds", "x one alone", "same weights as alone"],
        rows,
    )
    save(options.json, "side_by_side", figures)


if __name__ == "__main__":
    main()
