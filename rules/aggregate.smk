# The grid's settings (seeds as replicates) and runs in two tables, the best of each, and figures
# comparing their test metrics and learning curves.


localrules:
    aggregate,


rule aggregate:
    input:
        unpack(run_results),
    output:
        summary="results/summary.tsv",
        runs="results/runs.tsv",
        best="results/best_run.json",
        plot="results/comparison.png",
        curves="results/curves.png",
    log:
        "logs/aggregate.log",
    benchmark:
        "results/benchmarks/aggregate.tsv"
    conda:
        "../envs/scratchflow.yaml"
    params:
        run_ids=list(RUNS),
        metric=config["aggregate"]["metric"],
        goal=config["aggregate"]["goal"],
    script:
        "../scripts/aggregate.py"
