# Every run's parameters and test metrics in one table, the best run, and a plot comparing them.


localrules:
    aggregate,


rule aggregate:
    input:
        unpack(run_results),
    output:
        summary="results/summary.tsv",
        best="results/best_run.json",
        plot="results/comparison.png",
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
