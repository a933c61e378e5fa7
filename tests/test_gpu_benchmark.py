"""benchmarks/gpu.py, which measures scratchflow's jobs on a GPU, checked where there is none: it says
so and runs every part on a tiny model on the CPU (benchmarks/README.md holds the GPU's figures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_gpu_benchmark_runs_every_part_on_the_cpu_and_says_there_is_no_gpu(tmp_path):
    figures_file = tmp_path / "gpu.json"
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--repeats", "1", "--json", str(figures_file)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "no GPU here (CUDA is not available)" in result.stdout
    figures = json.loads(figures_file.read_text())
    assert figures["gpu"] is None
    (job,) = figures["precision"].values()
    assert job["device"] == "cpu" and 0 <= job["test_accuracy"] <= 1
    assert job["fixed_cost_s"]["start_to_first_step"] > 0 and job["fixed_cost_s"]["last_step_to_end"] > 0
    assert set(job["phases"]) == {"start to first step", "training loop", "last step to job end", "predict job"}
    resumed = figures["resume"]["default"]
    assert resumed["stopped"].startswith("stopped on SIGUSR1 at step 2") and resumed["same_weights"]
    assert figures["throughput"]["bare HF Trainer"]["loop_ratio_to_bare"] == 1.0
    by_steps, by_default, by_cost = figures["checkpoints"].values()
    assert by_steps["steps"] == 45 and by_steps["checkpoints_in_loop"] == 2, "every 20 steps, then the final"
    assert by_default["checkpoints_in_loop"] == 0, "ten minutes: the final checkpoint only"
    assert by_cost["checkpoints_in_loop"] >= 1 and 0 < by_cost["share_of_loop"] < 1
    assert all(cost["save_seconds"] > 0 and cost["publish_seconds"] > 0 for cost in by_cost["costs"])
