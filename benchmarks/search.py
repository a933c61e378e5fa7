"""Successive halving against training every configuration to the end, on this machine in one run.

The same configurations both ways: a halving search (`search: {kind: halving}`) and a random search
of the same seed, space, trials and seeds (`kind: random`), which draws the same configurations and
trains every one to the last rung's epochs, as a grid of them would (and with the same run ids).
Each runs through the whole lifecycle with the local profile (`scripts/run_local.sh`) in a fresh
folder. The task is the command example (config/examples/command/train.py: a bag-of-words
classifier in plain PyTorch) on all 2,225 BBC News articles, fast enough to train 18 runs twice.

Reported: the training steps each spent (every run's last step, summed) and what the grid's tables
say it cost (scratchflow.accounting: CPU-hours here, from the pieces' clocks; on a cluster the
GPU-hours a budget pays, from sacct), the best setting each found by the mean test macro-F1 of its
seeds, and where halving's choice stands among all the settings trained to the end (the same
setting, or within one standard deviation of the seeds of the best).

    .venv/bin/python benchmarks/search.py [--trials 9] [--json out.json]
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

import pandas as pd
import yaml
from measure import REPO, arguments, print_table, run_timed, save, snakemake_env

EXAMPLE = REPO / "config" / "examples" / "command"
RUNGS = [1, 2, 4]
KEEP = 1 / 3
SPACE = {
    "learning_rate": {"log_uniform": [1.0e-4, 3.0e-2]},
    "hidden": {"choice": [16, 64, 256]},
}


def search_config(kind: str, trials: int) -> dict:
    config = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    del config["grid"]
    config["training"]["epochs"] = RUNGS[-1]
    config["search"] = {"kind": kind, "trials": trials, "seed": 0, "seeds": [0, 1], "space": SPACE}
    if kind == "halving":
        config["search"].update(rungs=RUNGS, keep=KEEP)
    return config


def run_search(work: Path, kind: str, trials: int) -> dict:
    """One search through the lifecycle: its wall time, its steps, its settings' test macro-F1."""
    (work / "config").mkdir(parents=True)
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(search_config(kind, trials), sort_keys=False))
    shutil.copy(EXAMPLE / "train.py", work / "train.py")
    timing = run_timed([str(REPO / "scripts" / "run_local.sh")], cwd=work, env=snakemake_env())
    steps = 0
    for run in (work / "results" / "runs").iterdir():
        record = run / "record.json"
        if record.is_file():
            steps += json.loads(record.read_text())["training"]["global_steps"]
        else:  # stopped at its last rung
            last = max(run.glob("rung-*.json"), key=lambda path: int(path.stem.split("-")[1]))
            steps += json.loads(last.read_text())["global_steps"]
    costs = pd.read_csv(work / "results" / ("search/rungs.tsv" if kind == "halving" else "runs.tsv"), sep="\t")
    summary = pd.read_csv(work / "results" / "summary.tsv", sep="\t")
    settings = {
        (round(float(row["learning_rate"]), 6), int(row["hidden"])): (row["macro_f1_mean"], row["macro_f1_std"])
        for _, row in summary.iterrows()
    }
    return {
        "seconds": timing.seconds,
        "steps": steps,
        "cpu_hours": float(costs["cpu_hours"].sum()),  # every run's, those a halving search stopped too
        "settings": settings,
        "runs": len(list((work / "results" / "runs").iterdir())),
    }


def main() -> None:
    parser = arguments(__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=9, help="configurations drawn (each with 2 seeds)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        halving = run_search(Path(folder) / "halving", "halving", options.trials)
        every = run_search(Path(folder) / "every", "random", options.trials)
    best = max(every["settings"], key=lambda setting: every["settings"][setting][0])
    (chosen,) = halving["settings"]  # the last rung's one setting
    best_mean, best_std = every["settings"][best]
    chosen_mean = every["settings"][chosen][0]
    rank = sorted(every["settings"].values(), reverse=True).index(every["settings"][chosen]) + 1
    title = f"{options.trials} configurations x 2 seeds, rungs {RUNGS} epochs, keep {KEEP:.2f} (command example)"
    print_table(
        title,
        ["", "runs", "training steps", "x all", "CPU-hours", "x all", "wall s", "best setting (lr, hidden)",
         "its test macro-F1"],
        [
            ["every configuration to the end", every["runs"], every["steps"], 1.0, round(every["cpu_hours"], 4), 1.0,
             every["seconds"], str(best), best_mean],
            ["successive halving", halving["runs"], halving["steps"], halving["steps"] / every["steps"],
             round(halving["cpu_hours"], 4), halving["cpu_hours"] / every["cpu_hours"], halving["seconds"],
             str(chosen), halving["settings"][chosen][0]],
        ],
    )  # fmt: skip
    within = best_mean - chosen_mean <= (0.0 if math.isnan(best_std) else best_std)
    verdict = "the same setting" if chosen == best else "within one std" if within else "more than one std below"
    print(
        f"\nhalving's choice is setting {rank} of {len(every['settings'])} by test macro-F1 "
        f"({chosen_mean:.4f} against the best's {best_mean:.4f} ± {best_std:.4f}): {verdict}"
    )
    save(
        options.json,
        "search",
        {
            "trials": options.trials,
            "rungs": RUNGS,
            "keep": KEEP,
            "every": {**every, "settings": {str(key): value for key, value in every["settings"].items()}},
            "halving": {**halving, "settings": {str(key): value for key, value in halving["settings"].items()}},
            "steps_ratio": halving["steps"] / every["steps"],
            "cpu_hours_ratio": halving["cpu_hours"] / every["cpu_hours"],
            "chosen_rank": rank,
            "chosen_within_one_std": bool(within),
        },
    )


if __name__ == "__main__":
    main()
