"""Grid scale: how long `snakemake -n` (config validation, grid expansion, start-up checks, DAG,
the dry run's job list) takes for 100, 1,000 and 10,000 grid points, and its peak memory.

Baselines, run in the same process in alternation:
- minimal: Snakemake with a trivial one-rule workflow of the same job count (one output per job);
- same shape: a workflow with scratchflow's rules' shape (train and predict per point, three inputs
  and three outputs each, log, benchmark, script) but none of its logic: no config, no schema, no
  grid, no input functions, no checks. The ratio to it is what scratchflow's own code costs; the
  ratio of same shape to minimal is what Snakemake charges for the shape.

    .venv/bin/python benchmarks/grid_scale.py [--points 100 1000 10000] [--repeats 3]
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml
from measure import REPO, Timing, arguments, fastest, print_table, run_timed, save, snakemake, snakemake_env

# Besides the two jobs per point: archive_dataset, prefetch_model, aggregate (and `all`, in both).
FIXED_JOBS = 3

MINIMAL = """\
rule all:
    input:
        expand("out/{{i}}.txt", i=range({jobs})),


rule make:
    output:
        "out/{{i}}.txt",
    shell:
        "touch {{output}}"
"""

SAME_SHAPE = """\
POINTS = [f"{{i:010x}}" for i in range({points})]


rule all:
    input:
        "results/summary.tsv",


rule archive:
    output:
        archive="archives/data.tar",
        manifest="archives/data.manifest.json",
    log:
        "logs/archive.log",
    script:
        "noop.py"


rule model:
    output:
        directory("models/model"),
    log:
        "logs/model.log",
    script:
        "noop.py"


rule train:
    input:
        archive="archives/data.tar",
        manifest="archives/data.manifest.json",
        base_model="models/model",
    output:
        model=directory("results/runs/{{run_id}}/model"),
        params="results/runs/{{run_id}}/params.json",
        record="results/runs/{{run_id}}/record.json",
    log:
        "logs/train/{{run_id}}.log",
    benchmark:
        "results/benchmarks/train/{{run_id}}.tsv"
    params:
        checkpoints="checkpoints/{{run_id}}",
    script:
        "noop.py"


rule predict:
    input:
        archive="archives/data.tar",
        manifest="archives/data.manifest.json",
        model=rules.train.output.model,
    output:
        predictions="results/runs/{{run_id}}/predictions.csv",
        metrics="results/runs/{{run_id}}/metrics.json",
        record="results/runs/{{run_id}}/predict_record.json",
    log:
        "logs/predict/{{run_id}}.log",
    benchmark:
        "results/benchmarks/predict/{{run_id}}.tsv"
    script:
        "noop.py"


rule aggregate:
    input:
        params=expand("results/runs/{{run_id}}/params.json", run_id=POINTS),
        metrics=expand("results/runs/{{run_id}}/metrics.json", run_id=POINTS),
    output:
        "results/summary.tsv",
    log:
        "logs/aggregate.log",
    script:
        "noop.py"
"""


def scratchflow_workdir(workdir: Path, points: int) -> Path:
    """The demo's config with a grid of `points` learning rates."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["grid"] = {"learning_rate": [1.0e-6 * (index + 1) for index in range(points)]}
    (workdir / "config").mkdir(parents=True, exist_ok=True)
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    return workdir


def baseline_workdir(root: Path, name: str, snakefile: str) -> Path:
    workdir = root / name
    workdir.mkdir()
    (workdir / "Snakefile").write_text(snakefile)
    (workdir / "noop.py").write_text("")
    return workdir


def plan(workdir: Path, *workflow: str) -> Timing:
    return run_timed([snakemake(), *workflow, "--cores", "1", "-n"], cwd=workdir, env=snakemake_env())


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--points", type=int, nargs="+", default=[100, 1000, 10000])
    options = parser.parse_args()
    scratchflow = ["--snakefile", str(REPO / "Snakefile"), "--profile", str(REPO / "profiles" / "local")]
    rows, figures = [], {}
    with tempfile.TemporaryDirectory(prefix="scratchflow-grid-scale-") as temporary:
        root = Path(temporary)
        # Once, untimed: the first start reads the data for its checks (kept per data version) and
        # compiles bytecode; a user planning a grid has long paid both.
        ours_dir = scratchflow_workdir(root / "scratchflow", 1)
        plan(ours_dir, *scratchflow)
        for points in options.points:
            jobs = 2 * points + FIXED_JOBS
            scratchflow_workdir(ours_dir, points)
            minimal_dir = baseline_workdir(root, f"minimal-{points}", MINIMAL.format(jobs=jobs))
            shape_dir = baseline_workdir(root, f"shape-{points}", SAME_SHAPE.format(points=points))
            ours, minimal = fastest(
                lambda: plan(ours_dir, *scratchflow),
                lambda minimal_dir=minimal_dir: plan(minimal_dir),
                options.repeats,
            )
            shape = min((plan(shape_dir) for _ in range(options.repeats)), key=lambda t: t.seconds)
            figures[str(points)] = {
                "jobs": jobs + 1,
                "scratchflow_s": ours.seconds,
                "scratchflow_peak_mb": ours.peak_mb,
                "minimal_s": minimal.seconds,
                "minimal_peak_mb": minimal.peak_mb,
                "same_shape_s": shape.seconds,
                "same_shape_peak_mb": shape.peak_mb,
                "ratio_to_minimal": ours.seconds / minimal.seconds,
                "ratio_to_same_shape": ours.seconds / shape.seconds,
                "memory_ratio_to_minimal": ours.peak_mb / minimal.peak_mb,
            }
            rows.append(
                [
                    points,
                    jobs + 1,
                    ours.seconds,
                    ours.peak_mb,
                    minimal.seconds,
                    shape.seconds,
                    ours.seconds / minimal.seconds,
                    ours.seconds / shape.seconds,
                ]
            )
    print_table(
        f"snakemake -n, fastest of {options.repeats} (s, MB)",
        ["points", "jobs", "scratchflow", "peak MB", "minimal", "same shape", "x minimal", "x same shape"],
        rows,
    )
    save(options.json, "grid_scale", {"repeats": options.repeats, "points": figures})


if __name__ == "__main__":
    main()
