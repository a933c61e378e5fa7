#!/bin/sh
# Runs inside the base image, as its root (srun --container-remap-root), by scripts/build_image.sh:
# installs the requirements file it is given into a virtual environment at /opt/scratchflow and puts it first on the
# image's PATH, so that a job's `python` is this environment's. pip reads PIP_* from the environment
# (PIP_NO_INDEX and PIP_FIND_LINKS for a wheelhouse, where compute nodes have no internet).
set -eu
requirements="$1"
# The lifecycle's tools (zstd only for dataset.compression: zstd): a base image must bring them.
for tool in tar rsync; do
    if ! command -v "$tool" >/dev/null; then
        echo "scratchflow image: the base image has no $tool, which the jobs run; install it in the base image first (Debian, Ubuntu: apt-get install $tool)" >&2
        exit 1
    fi
done
python3 -m venv --system-site-packages /opt/scratchflow
# Compiled here, once (pip's default): a job step's container is a fresh copy of the image, so what
# Python compiles while a job imports torch and transformers is lost with it, every job.
/opt/scratchflow/bin/python -m pip install --quiet --disable-pip-version-check -r "$requirements"
# enroot sets a container's environment from its /etc/environment (an imported registry image's
# ENV lines are written there), and pyxis lets the image's values win over the job's; then enroot
# starts a login shell, whose /etc/profile may set PATH again (Debian's does): /etc/profile.d too.
path=$(sed -n 's/^PATH=//p' /etc/environment 2>/dev/null | tr -d '"')
path=${path:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}
sed -i '/^PATH=/d' /etc/environment 2>/dev/null || true
echo "PATH=/opt/scratchflow/bin:$path" >> /etc/environment
mkdir -p /etc/profile.d
echo 'case ":$PATH:" in *:/opt/scratchflow/bin:*) ;; *) PATH="/opt/scratchflow/bin:$PATH" ;; esac' > /etc/profile.d/scratchflow.sh
/opt/scratchflow/bin/python -c "import sys, snakemake; print('scratchflow image: python', sys.version.split()[0], 'snakemake', snakemake.__version__)"
