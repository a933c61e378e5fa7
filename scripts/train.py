# Entry point of rules train and train_rung (a halving search's rung, which keeps its checkpoint and
# syncs no model: its one output is the rung's record); the work is scratchflow.jobs.train_job.
from pathlib import Path

from scratchflow.distributed import shape_of
from scratchflow.halving import Rung
from scratchflow.jobs import RunOutputs, TrainJob, job_context, train_job
from scratchflow.plan import RUN_PATHS
from scratchflow.slurm_job import signal_lead_seconds

# A rung's job is the one named by its rung (its rule's name may carry a module's prefix).
rung_number = snakemake.wildcards.get("rung")
rung = (
    Rung(int(rung_number), snakemake.params.budget_epochs, Path(snakemake.output.rung_record))
    if rung_number is not None
    else None
)
# The run's train job predicts as the run ends, where its predict job would run in the same software
# (scratchflow.prediction).
images = snakemake.config["cluster"]["rule_image_variables"]
predicts_at_end = rung is None and images.get("predict") == images.get("train")
# A packed run is not its Slurm job's last: its pack job is (rules/pack.smk).
packed = snakemake.config["cluster"]["pack_runs"] > 1
with job_context(snakemake.log[0], snakemake.threads, ends_its_slurm_job=not packed) as cpus:
    train_job(
        TrainJob(
            run_id=snakemake.wildcards.run_id,
            task=snakemake.config["task"],
            identity=snakemake.params.identity,
            resolved_config=dict(snakemake.config),
            archive=Path(snakemake.input.archive),
            manifest=Path(snakemake.input.manifest),
            base_model=Path(snakemake.input.base_model) if snakemake.input.get("base_model") else None,
            # Read from the config, not params: changing them must not make finished runs rerun.
            scratch_root=snakemake.config["cluster"]["scratch_root"],
            checkpointing=snakemake.config["checkpointing"],
            shared_folder=Path(snakemake.params.checkpoints),
            threads=cpus,
            workflow_dir=Path(snakemake.scriptdir).parent,
            tracking_dir=Path(RUN_PATHS.of(snakemake.wildcards.run_id).tensorboard),
            # From the config, not params: switching tracking on must not make finished runs rerun.
            tracking=snakemake.config["tracking"],
            log=Path(snakemake.log[0]),
            ends_with=rung
            or RunOutputs(Path(snakemake.output.model), Path(snakemake.output.params), Path(snakemake.output.record)),
            shape=shape_of(snakemake.resources),
            warning_lead_seconds=signal_lead_seconds(snakemake.resources.get("slurm_extra")),
            prediction_at_end=Path(RUN_PATHS.of(snakemake.wildcards.run_id).predicted_in_training)
            if predicts_at_end
            else None,
        )
    )
