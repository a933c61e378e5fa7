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

import argparse
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


def same_shape(points: int, *, benchmark: bool = True, script: bool = True, inputs_per_job: int = 3) -> str:
    """scratchflow's rules' shape without its logic. The keywords take one element of a job's shape
    away at a time, to show what each costs (`--shape-costs`)."""
    run = '    script:\n        "noop.py"\n' if script else '    shell:\n        "python noop.py {output}"\n'

    def benchmark_of(rule: str) -> str:
        return f'    benchmark:\n        "results/benchmarks/{rule}/{{run_id}}.tsv"\n' if benchmark else ""

    data = '        archive="archives/data.tar",\n        manifest="archives/data.manifest.json",\n'
    if inputs_per_job == 1:
        data = ""
    return f"""\
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
{run}

rule model:
    output:
        directory("models/model"),
    log:
        "logs/model.log",
{run}

rule train:
    input:
{data}        base_model="models/model",
    output:
        model=directory("results/runs/{{run_id}}/model"),
        params="results/runs/{{run_id}}/params.json",
        record="results/runs/{{run_id}}/record.json",
    log:
        "logs/train/{{run_id}}.log",
{benchmark_of("train")}    params:
        checkpoints="checkpoints/{{run_id}}",
{run}

rule predict:
    input:
{data}        model=rules.train.output.model,
    output:
        predictions="results/runs/{{run_id}}/predictions.csv",
        metrics="results/runs/{{run_id}}/metrics.json",
        record="results/runs/{{run_id}}/predict_record.json",
    log:
        "logs/predict/{{run_id}}.log",
{benchmark_of("predict")}{run}

rule aggregate:
    input:
        params=expand("results/runs/{{run_id}}/params.json", run_id=POINTS),
        metrics=expand("results/runs/{{run_id}}/metrics.json", run_id=POINTS),
    output:
        "results/summary.tsv",
    log:
        "logs/aggregate.log",
{run}"""


# What each element of a job's shape costs: the same shape with one element taken away at a time.
SHAPE_VARIANTS = {
    "same shape": {},
    "no benchmark:": {"benchmark": False},
    "shell: for script:": {"script": False},
    "1 input, not 3": {"inputs_per_job": 1},
    "all three": {"benchmark": False, "script": False, "inputs_per_job": 1},
}


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


def shape_costs(root: Path, points: int, repeats: int) -> dict[str, Timing]:
    """Each of SHAPE_VARIANTS and the minimal workflow of the same job count, run in turn, fastest kept."""
    workdirs = {
        name: baseline_workdir(root, f"variant-{index}-{points}", same_shape(points, **shape))
        for index, (name, shape) in enumerate(SHAPE_VARIANTS.items())
    }
    workdirs["minimal"] = baseline_workdir(root, f"minimal-{points}", MINIMAL.format(jobs=2 * points + FIXED_JOBS))
    timings: dict[str, list[Timing]] = {name: [] for name in workdirs}
    for _ in range(repeats):
        for name, workdir in workdirs.items():
            timings[name].append(plan(workdir))
    return {name: min(runs, key=lambda t: t.seconds) for name, runs in timings.items()}


def report_shape_costs(options: argparse.Namespace) -> None:
    rows, figures = [], {}
    with tempfile.TemporaryDirectory(prefix="scratchflow-shape-costs-") as temporary:
        for points in options.points:
            timings = shape_costs(Path(temporary), points, options.repeats)
            shape, minimal = timings["same shape"].seconds, timings["minimal"].seconds
            figures[str(points)] = {name: timing.seconds for name, timing in timings.items()}
            rows += [[points, name, t.seconds, t.seconds / shape, t.seconds / minimal] for name, t in timings.items()]
    print_table(
        f"snakemake -n of the same shape, one element taken away at a time, fastest of {options.repeats} (s)",
        ["points", "variant", "seconds", "x same shape", "x minimal"],
        rows,
    )
    save(options.json, "grid_shape_costs", {"repeats": options.repeats, "points": figures})


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--points", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--shape-costs", action="store_true", help="what each element of a job's shape costs, instead")
    options = parser.parse_args()
    if options.shape_costs:
        report_shape_costs(options)
        return
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
            shape_dir = baseline_workdir(root, f"shape-{points}", same_shape(points))
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
