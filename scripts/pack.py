# Entry point of rules pack_train and pack_predict; the work is scratchflow.jobs.pack_job.
from pathlib import Path

from scratchflow.jobs import job_context, pack_job

with job_context(snakemake.log[0], 1):
    pack_job(written=[Path(path) for path in snakemake.input], output=Path(snakemake.output[0]))
