"""Job steps in an enroot image started by pyxis, for clusters whose software comes only that way
(cluster.image_variable: dfki, lrz).

pyxis runs the container for a job step, not for the batch step: sbatch's batch step starts on the
node with the workflow's own Python (the venv the workflow runs from, on shared storage), and the
Slurm plugin's job step, `srun <that Python> -m snakemake ...`, runs in the image. (With
--container-image on sbatch, or PYXIS_CONTAINER_* in sbatch's environment, pyxis would run the
batch step itself in the image, where there is no srun to start the job step with.) So the workflow
hands the container to its jobs as SCRATCHFLOW_PYXIS_CONTAINER_* variables, which sbatch passes on
(--export=ALL) without reading them, and the batch step's Snakemake, reading the workflow, turns
them into the PYXIS_CONTAINER_* variables its srun reads.

The plugin starts the job step with the interpreter that started the batch step, by its path on the
node. Inside the image that path is made to run the image's own `python` (IMAGE_PYTHON, mounted
there): the job step then uses the image's software, whatever the workflow's venv holds.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import overload

from scratchflow import SCRATCHFLOW_DIR
from scratchflow.config import ConfigError

SQUASHFS_MAGIC = b"hsqs"
# Mounted over the workflow's interpreter inside the image: `exec python "$@"`, the image's.
IMAGE_PYTHON = SCRATCHFLOW_DIR / "scripts" / "image_python"
HANDED_OVER = "SCRATCHFLOW_"  # the prefix that keeps sbatch from reading PYXIS_CONTAINER_* itself
RULE_IMAGES = "SCRATCHFLOW_RULE_IMAGES"  # rule -> its own image (cluster.rule_image_variables), JSON
JOB_STEP_CACHE = Path(".snakemake/scratchflow/job-step-cache")
BUILD_HINT = 'scripts/build_image.sh builds one (docs/clusters.md, "Containers")'


@overload
def check_image(variable: str, environ: Mapping[str, str], key: str = ...) -> Path: ...
@overload
def check_image(variable: None, environ: Mapping[str, str], key: str = ...) -> None: ...
def check_image(variable: str | None, environ: Mapping[str, str], key: str = "cluster.image_variable") -> Path | None:
    """The image the variable names (cluster.image_variable; None: no container), which must be a
    squashfs file named by its absolute path: pyxis reads a relative path from the job's directory
    and a name without a path as a registry image that every job would import again, and an image
    that is not there fails every job on its node."""
    if variable is None:
        return None
    value = environ.get(variable, "")
    where = f"config key {key}: the jobs run in the image ${variable} names"
    if not value:
        raise ConfigError(f"{where}, but {variable} is not set: export {variable}=/path/to/image.sqsh; {BUILD_HINT}")
    path = Path(value)
    if not path.is_absolute():
        raise ConfigError(f"{where}: {variable}={value} is not an absolute path to a .sqsh file; {BUILD_HINT}")
    try:
        with path.open("rb") as image:
            magic = image.read(len(SQUASHFS_MAGIC))
    except OSError as error:
        raise ConfigError(f"{where}: {variable}={value}: {error.strerror}; {BUILD_HINT}") from None
    if magic != SQUASHFS_MAGIC:
        raise ConfigError(f"{where}: {variable}={value} is not a squashfs image (enroot's .sqsh); {BUILD_HINT}")
    return path


def expanded_mounts(mounts: Iterable[str], environ: Mapping[str, str]) -> list[str]:
    """cluster.image_mounts with their $VARIABLES expanded from `environ`; an unset one is refused."""
    expanded = []
    for mount in mounts:
        for name in _variables_in(mount):
            if name not in environ:
                raise ConfigError(f"config key cluster.image_mounts: {mount!r} names ${name}, which is not set")
        for name in sorted(_variables_in(mount), key=len, reverse=True):
            mount = mount.replace(f"${{{name}}}", environ[name]).replace(f"${name}", environ[name])
        expanded.append(mount)
    return expanded


def _variables_in(text: str) -> set[str]:
    return {braced or plain for braced, plain in re.findall(r"\$\{(\w+)\}|\$(\w+)", text)}


def job_step_environment(
    image: Path, mounts: list[str], workdir: Path, workflow_dir: Path, inputs: Iterable[Path], interpreter: str
) -> dict[str, str]:
    """The PYXIS_CONTAINER_* variables of every job step, named for handing over (HANDED_OVER): the
    image; the cluster's mounts, the working directory (results, logs, checkpoints), the workflow's
    files and what the jobs read besides (the dataset, a local model) read-only, and the image's
    `python` over the workflow's interpreter; the working directory as the step's. And a cache
    folder in the working directory (XDG_CACHE_HOME): the job step's Snakemake keeps its source
    cache there, and an image's root filesystem is read-only, its home too where the cluster does
    not mount the user's."""
    own = [
        f"{workdir}:{workdir}",
        f"{workflow_dir}:{workflow_dir}:ro",
        # Seen in the image where the config names them, whatever links lead there on the host.
        *(
            f"{Path(path).resolve()}:{path}:ro"
            for path in sorted({str(Path(location).absolute()) for location in inputs})
        ),
        f"{IMAGE_PYTHON}:{interpreter}:ro",
    ]
    # pyxis splits the list at commas; a path with one would be cut in two.
    for mount in mounts + own:
        if "," in mount:
            raise ConfigError(f"a path mounted into the image holds a comma, which pyxis cannot mount: {mount!r}")
    return {
        HANDED_OVER + "PYXIS_CONTAINER_IMAGE": str(image),
        HANDED_OVER + "PYXIS_CONTAINER_MOUNTS": ",".join(mounts + own),
        HANDED_OVER + "PYXIS_CONTAINER_WORKDIR": str(workdir),
        "XDG_CACHE_HOME": str(workdir / JOB_STEP_CACHE),
    }


def check_rule_image_rules(variables: Mapping[str, str], rules: Iterable[str]) -> None:
    """cluster.rule_image_variables names only rules that run as jobs (`rules`), whatever the
    executor: a local dry run of a cluster's config refuses what the cluster would."""
    known = sorted(rules)
    for rule in variables:
        if rule not in known:
            raise ConfigError(
                f"config key cluster.rule_image_variables: {rule!r} is not a rule that runs as a job "
                f"(the rules: {', '.join(known)})"
            )


def rule_images(variables: Mapping[str, str], rules: Iterable[str], environ: Mapping[str, str]) -> dict[str, Path]:
    """cluster.rule_image_variables checked: each rule one of the workflow's Slurm jobs, each
    variable naming an image as cluster.image_variable must."""
    check_rule_image_rules(variables, rules)
    return {
        rule: check_image(variable, environ, f"cluster.rule_image_variables.{rule}")
        for rule, variable in variables.items()
    }


def start_job_steps_in_image(environ: MutableMapping[str, str], rules: Iterable[str] = ()) -> None:
    """In a job's batch step (its Snakemake reads the workflow before it starts the job step): the
    container the workflow handed over, as the PYXIS_CONTAINER_* variables srun reads; the image of
    the job's rule where it has its own (`rules`: the rules of the jobs it runs, one but in a pack)."""
    for name, value in list(environ.items()):
        if name.startswith(HANDED_OVER + "PYXIS_CONTAINER_"):
            environ[name.removeprefix(HANDED_OVER)] = value
    own = json.loads(environ.get(RULE_IMAGES, "{}"))
    images = {own[rule] for rule in rules if rule in own}
    if len(images) == 1:
        environ["PYXIS_CONTAINER_IMAGE"] = images.pop()


def set_job_step_image(
    cluster: Mapping,
    workdir: Path,
    workflow_dir: Path,
    inputs: Iterable[Path],
    interpreter: str,
    job_rules: Iterable[str],
) -> Path | None:
    """At start-up, with the Slurm executor: check the images, and put the job steps' container into
    this process's environment, which every sbatch passes on. None where jobs run without one."""
    image = check_image(cluster["image_variable"], os.environ)
    if image is None:
        if cluster["rule_image_variables"]:
            raise ConfigError(
                "config key cluster.rule_image_variables needs cluster.image_variable (the other rules' image)"
            )
        return None
    mounts = expanded_mounts(cluster["image_mounts"], os.environ)
    own = rule_images(cluster["rule_image_variables"], job_rules, os.environ)
    os.environ.update(job_step_environment(image, mounts, workdir, workflow_dir, inputs, interpreter))
    os.environ[RULE_IMAGES] = json.dumps({rule: str(path) for rule, path in own.items()})
    return image
