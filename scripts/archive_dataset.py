# Entry point of rule archive_dataset; the work is scratchflow.jobs.archive_job.
from pathlib import Path

from scratchflow.jobs import archive_job, job_context

with job_context(snakemake.log[0]):
    archive_job(
        dataset=snakemake.params.dataset,
        archive=Path(snakemake.output.archive),
        manifest=Path(snakemake.output.manifest),
    )
