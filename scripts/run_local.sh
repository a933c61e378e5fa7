#!/usr/bin/env bash
# Runs scratchflow on this machine (local profile) in the current directory, which holds
# config/config.yaml (and, for a lab's pipeline, its Snakefile) and receives archives/, models/,
# checkpoints/, results/ and logs/.
# Extra arguments go to Snakemake.
#
# A run killed outright (SIGKILL, a power cut) leaves Snakemake's directory lock behind, and the
# next run would refuse to start. This script holds an exclusive flock for as long as its run lives,
# and the kernel drops that flock however the run dies, so acquiring it proves that no other run of
# this script is active here: only then is a leftover lock lifted, and the run resumes.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
# The snakemake of the environment first on PATH (a lab's Makefile puts its environment there, and
# `make demo` scratchflow's .venv), else scratchflow's .venv, put first on PATH too: a command task's
# `python` is then the one with its packages.
if ! snakemake=$(command -v snakemake); then
    snakemake="$repo/.venv/bin/snakemake"
    export PATH="$repo/.venv/bin:$PATH"
fi
# A lab's pipeline (a Snakefile here that uses scratchflow as its module), or else scratchflow's own.
snakefile="$repo/Snakefile"
[ -f Snakefile ] && snakefile=Snakefile
workflow=(--snakefile "$snakefile" --profile "$repo/profiles/local")

# Nothing here uses Slurm, but the Slurm plugin runs `scontrol show config` whenever Snakemake
# starts, which waits 9 s where a Slurm client is installed and no controller answers.
export SLURM_CONF=/dev/null

mkdir -p .snakemake
exec 9>.snakemake/run_local.flock
if ! flock --nonblock 9; then
    echo "scratchflow: another run is active in $(pwd); wait for it to finish." >&2
    exit 75
fi
if compgen -G ".snakemake/locks/*" >/dev/null; then
    echo "scratchflow: lifting the lock left by an interrupted run; it resumes now." >&2
    "$snakemake" "${workflow[@]}" --unlock --quiet all
fi
exec "$snakemake" "${workflow[@]}" "$@"
