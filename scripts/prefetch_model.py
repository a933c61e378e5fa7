# Entry point of rule prefetch_model; the work is scratchflow.jobs.prefetch_job.
from pathlib import Path

from scratchflow.jobs import job_context, prefetch_job

with job_context(snakemake.log[0]):
    prefetch_job(source=snakemake.params.source, destination=Path(snakemake.output[0]))
