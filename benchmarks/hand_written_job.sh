#!/usr/bin/env bash
# The baseline of benchmarks/lifecycle.py: the sbatch script users write by hand, minus the #SBATCH
# lines. Copy the archive to scratch, extract it, train, copy the model back, delete the scratch.
#     hand_written_job.sh ARCHIVE MODEL RESULTS SCRATCH_ROOT
set -euo pipefail
archive=$1 model=$2 results=$3
scratch=$(mktemp -d "$4/hand-written.XXXXXX")
cp "$archive" "$scratch/"
tar -xf "$scratch/$(basename "$archive")" -C "$scratch"
python "$(dirname "$0")/hand_written_train.py" "$scratch" "$model" "$scratch/model" "$results/train_seconds"
mkdir -p "$results"
rsync -a "$scratch/model/" "$results/model/"
rm -rf "$scratch"
