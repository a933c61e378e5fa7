#!/usr/bin/env bash
# Build the image the container profiles (dfki, lrz) run every job in, the way those clusters'
# users make theirs: start a base image that holds Python (an NGC PyTorch image there) in a job with
# pyxis, install the pipeline's requirements.txt into it, and save the container as a squashfs file.
#
#   scripts/build_image.sh BASE OUTPUT.sqsh [srun options...]
#
# BASE is what --container-image takes (nvcr.io#nvidia/pytorch:25.01-py3, or a .sqsh path starting
# with / or ./). It installs requirements.txt of the folder it is run in (a lab's pipeline: its
# own, which includes scratchflow's), or scratchflow's where there is none; SCRATCHFLOW_REQUIREMENTS=FILE
# installs another file (requirements-cpu.txt: a small image for the rules that do not train).
# Where the nodes have no internet, set SCRATCHFLOW_WHEELHOUSE to a directory of wheels for it
# (`pip download -r requirements.txt -d DIR` on a login node): pip then installs from it alone.
set -euo pipefail
if [ $# -lt 2 ]; then
    sed -n '2,14s/^# \{0,1\}//p' "$0" >&2
    exit 2
fi
base=$1
output=$(realpath -m "$2")
shift 2
source=$(cd "$(dirname "$0")/.." && pwd)
default=$source/requirements.txt
[ -f requirements.txt ] && default=$PWD/requirements.txt
requirements=$(realpath "${SCRATCHFLOW_REQUIREMENTS:-$default}")
# The file's folder, for the files it includes (-r scratchflow/requirements.txt in a lab's).
mounts="$source:/scratchflow-source:ro,$(dirname "$requirements"):/scratchflow-requirements:ro"
if [ -n "${SCRATCHFLOW_WHEELHOUSE:-}" ]; then
    mounts="$mounts,$(realpath "$SCRATCHFLOW_WHEELHOUSE"):/scratchflow-wheelhouse:ro"
    export PIP_NO_INDEX=1 PIP_FIND_LINKS=/scratchflow-wheelhouse
fi
# As the image's root (--container-remap-root), on a writable copy of it, saved when the step ends.
exec srun --ntasks=1 "$@" \
    --container-image="$base" --container-save="$output" --container-remap-root --container-writable \
    --container-mounts="$mounts" \
    sh /scratchflow-source/scripts/install_into_image.sh "/scratchflow-requirements/$(basename "$requirements")"
