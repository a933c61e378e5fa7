# Entry point of rule aggregate; the work is scratchflow.jobs.aggregate_job.
from pathlib import Path

from scratchflow.jobs import HalvingComparison, aggregate_job, job_context

with job_context(snakemake.log[0]):
    aggregate_job(
        runs={
            Path(params).parent.name: {
                "params": Path(params),
                "metrics": Path(metrics),
                "record": Path(record),
                "predict_record": Path(predict_record),
            }
            for params, metrics, record, predict_record in zip(
                snakemake.input.params,
                snakemake.input.metrics,
                snakemake.input.records,
                snakemake.input.predict_records,
                strict=True,
            )
        },
        metric=snakemake.params.metric,
        goal=snakemake.params.goal,
        summary_out=Path(snakemake.output.summary),
        runs_out=Path(snakemake.output.runs),
        best_out=Path(snakemake.output.best),
        plot_out=Path(snakemake.output.plot),
        curves_out=Path(snakemake.output.curves),
        page_out=Path(snakemake.output.page),
        # A halving search's decisions, and its rungs' table and figure.
        halving_search=HalvingComparison(
            decisions=[Path(path) for path in snakemake.input.decisions],
            rung_records=[Path(path) for path in snakemake.input.rung_records],
            rungs_out=Path(snakemake.output.rungs),
            rung_plot_out=Path(snakemake.output.rung_plot),
        )
        if hasattr(snakemake.output, "rungs")
        else None,
    )
