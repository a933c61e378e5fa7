# Entry point of rule predict; the work is scratchflow.jobs.predict_job.
from pathlib import Path

from scratchflow.jobs import PredictJob, job_context, predict_job
from scratchflow.plan import RUN_PATHS

# A packed run is not its Slurm job's last: its pack job is (rules/pack.smk).
packed = snakemake.config["cluster"]["pack_runs"] > 1
with job_context(snakemake.log[0], snakemake.threads, ends_its_slurm_job=not packed) as cpus:
    predict_job(
        PredictJob(
            run_id=snakemake.wildcards.run_id,
            task=snakemake.config["task"],
            identity=snakemake.params.identity,
            archive=Path(snakemake.input.archive),
            manifest=Path(snakemake.input.manifest),
            trained=Path(snakemake.input.model),
            scratch_root=snakemake.config["cluster"]["scratch_root"],
            threads=cpus,
            workflow_dir=Path(snakemake.scriptdir).parent,
            metrics_out=Path(snakemake.output.metrics),
            record_out=Path(snakemake.output.record),
            curves_out=Path(snakemake.output.curves),
            predictions_out=Path(snakemake.output.predictions) if hasattr(snakemake.output, "predictions") else None,
            tracking=snakemake.config["tracking"],
            train_record=Path(RUN_PATHS.of(snakemake.wildcards.run_id).record),
            figures_out=Path(RUN_PATHS.of(snakemake.wildcards.run_id).figures),
            predicted_in_training=Path(RUN_PATHS.of(snakemake.wildcards.run_id).predicted_in_training),
        )
    )
