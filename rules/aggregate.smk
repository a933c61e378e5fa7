# The grid's settings (seeds as replicates) and runs in two tables, the best of each, and figures
# comparing their test metrics and learning curves. The best run's figures (its confusion matrix,
# where it reports one, and its task's own) are on the page; results/best_confusion_matrix.png is
# no output, as whether the best run reports a matrix is known only once the runs have predicted
# (scratchflow.plan.BEST_CONFUSION_MATRIX).

# The comparison of a halving search also shows its rungs.
SEARCH_RESULTS = (
    {
        "rungs": SEARCH_OUTPUTS["rungs"],
        "rung_plot": report(
            SEARCH_OUTPUTS["rung_plot"], caption="report/rungs.rst", category="Search"
        ),
    }
    if PLAN.halving
    else {}
)


localrules:
    aggregate,


rule aggregate:
    input:
        unpack(run_results),
    output:
        **SEARCH_RESULTS,
        summary=COMPARISON_OUTPUTS["summary"],
        runs=COMPARISON_OUTPUTS["runs"],
        best=COMPARISON_OUTPUTS["best"],
        page=report(
            COMPARISON_OUTPUTS["page"],
            caption="report/summary.rst",
            category="Comparison",
        ),
        plot=report(
            COMPARISON_OUTPUTS["plot"],
            caption="report/comparison.rst",
            category="Comparison",
        ),
        curves=report(
            COMPARISON_OUTPUTS["curves"],
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
