# Entry point of rule predict; the work is scratchflow.jobs.predict_job.
from pathlib import Path

from scratchflow.jobs import job_context, predict_job

with job_context(snakemake.log[0], snakemake.threads):
    predict_job(
        run_id=snakemake.wildcards.run_id,
        identity=snakemake.params.identity,
        archive=Path(snakemake.input.archive),
        manifest=Path(snakemake.input.manifest),
        model=Path(snakemake.input.model),
        scratch_root=snakemake.config["cluster"]["scratch_root"],
        threads=snakemake.threads,
        workflow_dir=Path(snakemake.scriptdir).parent,
        predictions_out=Path(snakemake.output.predictions),
        metrics_out=Path(snakemake.output.metrics),
        record_out=Path(snakemake.output.record),
    )
