# Entry point of rules train and train_rung; the work is scratchflow.jobs.train_job.
from pathlib import Path

from scratchflow.distributed import shape_of
from scratchflow.jobs import Rung, TrainJob, job_context, train_job
from scratchflow.tracking import TENSORBOARD_FOLDER

with job_context(snakemake.log[0], snakemake.threads):
    train_job(
        TrainJob(
            run_id=snakemake.wildcards.run_id,
            task=snakemake.config["task"],
            identity=snakemake.params.identity,
            resolved_config=dict(snakemake.config),
            archive=Path(snakemake.input.archive),
            manifest=Path(snakemake.input.manifest),
            base_model=Path(snakemake.input.base_model) if hasattr(snakemake.input, "base_model") else None,
            # Read from the config, not params: changing them must not make finished runs rerun.
            scratch_root=snakemake.config["cluster"]["scratch_root"],
            checkpointing=snakemake.config["checkpointing"],
            checkpoint_folder=Path(snakemake.params.checkpoints),
            threads=snakemake.threads,
            workflow_dir=Path(snakemake.scriptdir).parent,
            # A halving search's rung (rule train_rung) keeps the checkpoint, and syncs no model.
            model_out=Path(snakemake.output.model) if hasattr(snakemake.output, "model") else None,
            params_out=Path(snakemake.output.params) if hasattr(snakemake.output, "params") else None,
            record_out=Path(snakemake.output.record),
            tracking_dir=Path(snakemake.output.record).parent / TENSORBOARD_FOLDER,
            # From the config, not params: switching tracking on must not make finished runs rerun.
            tracking=snakemake.config["tracking"],
            log=Path(snakemake.log[0]),
            shape=shape_of(snakemake.resources),
            rung=Rung(int(snakemake.wildcards.rung), snakemake.params.rung_epochs)
            if hasattr(snakemake.params, "rung_epochs")
            else None,
        )
    )
