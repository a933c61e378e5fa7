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
        page=report(
            "results/summary.html", caption="report/summary.rst", category="Comparison"
        ),
        plot=report(
            "results/comparison.png",
            caption="report/comparison.rst",
            category="Comparison",
        ),
        confusion=report(
            "results/best_confusion_matrix.png",
            caption="report/confusion_matrix.rst",
            category="Comparison",
        ),
        curves=report(
            "results/curves.png",
            caption="report/curves.rst",
            category="Learning curves",
        ),
    log:
        "logs/aggregate.log",
    benchmark:
        "results/benchmarks/aggregate.tsv"
    conda:
        "../envs/scratchflow.yaml"
    params:
        run_ids=RUN_IDS,
        metric=config["aggregate"]["metric"],
        goal=config["aggregate"]["goal"],
    script:
        "../scripts/aggregate.py"
