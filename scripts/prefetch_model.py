# Entry point of rule prefetch_model; the work is scratchflow.jobs.prefetch_job.
from pathlib import Path

from scratchflow.jobs import job_context, prefetch_job

with job_context(snakemake.log[0]):
    prefetch_job(
        task=snakemake.params.task,
        source=snakemake.params.source,
        destination=Path(snakemake.output[0]),
        # Read from the config, not params: a token file's path is no reason to download again.
        token_file=snakemake.config["model"]["token_file"],
    )
