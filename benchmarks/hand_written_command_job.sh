#!/usr/bin/env bash
# The baseline of benchmarks/lifecycle.py's command-task variant: the sbatch script a lab writes by
# hand around its own program, minus the #SBATCH lines. Copy the archive to scratch, extract it, run
# the program with the same environment scratchflow gives it, copy its output back, delete the
# scratch. Writes the seconds the program ran to RESULTS/train_seconds.
#     hand_written_command_job.sh ARCHIVE PROGRAM PARAMS RESULTS SCRATCH_ROOT
set -euo pipefail
archive=$1 program=$2 params=$3 results=$4
scratch=$(mktemp -d "$5/hand-written.XXXXXX")
cp "$archive" "$scratch/"
tar -xf "$scratch/$(basename "$archive")" -C "$scratch"
started=$EPOCHREALTIME
SCRATCHFLOW_DATA_DIR=$(find "$scratch" -mindepth 1 -maxdepth 1 -type d) \
    SCRATCHFLOW_PARAMS=$params \
    SCRATCHFLOW_CHECKPOINT_DIR=$scratch/checkpoints \
    SCRATCHFLOW_RESUME_FROM='' \
    SCRATCHFLOW_OUTPUT_DIR=$scratch/output \
    SCRATCHFLOW_SAVE_EVERY_STEPS=100000 \
    python "$program"
finished=$EPOCHREALTIME
mkdir -p "$results"
rsync -a "$scratch/output/" "$results/model/"
python -c "print($finished - $started)" > "$results/train_seconds"
rm -rf "$scratch"
