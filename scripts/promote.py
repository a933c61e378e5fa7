# Entry point of rule promote (a halving search's decision after a rung); the work is
# scratchflow.halving.promote_job.
from pathlib import Path

from scratchflow.halving import promote_job
from scratchflow.jobs import job_context

with job_context(snakemake.log[0]):
    promote_job(
        rung=int(snakemake.wildcards.rung),
        epochs=snakemake.params.budget_epochs,
        records=[Path(path) for path in snakemake.input.records],
        settings=snakemake.params.settings,
        metric=snakemake.params.metric,
        goal=snakemake.params.goal,
        keep=snakemake.params.keep,
        decision_out=Path(snakemake.output.decision),
    )
