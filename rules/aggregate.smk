# The grid's settings (seeds as replicates) and runs in two tables, the best of each, and figures
# comparing their test metrics and learning curves.


localrules:
    aggregate,


rule aggregate:
    input:
        unpack(run_results),
    output:
        **SEARCH_RESULTS,
        summary=GRID_OUTPUTS["summary"],
        runs=GRID_OUTPUTS["runs"],
        best=GRID_OUTPUTS["best"],
        page=report(
            GRID_OUTPUTS["page"], caption="report/summary.rst", category="Comparison"
        ),
        plot=report(
            GRID_OUTPUTS["plot"],
            caption="report/comparison.rst",
            category="Comparison",
        ),
        confusion=report(
            GRID_OUTPUTS["confusion"],
            caption="report/confusion_matrix.rst",
            category="Comparison",
        ),
        curves=report(
            GRID_OUTPUTS["curves"],
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
        metric=PLAN.metric,
        goal=PLAN.goal,
    script:
        "../scripts/aggregate.py"
