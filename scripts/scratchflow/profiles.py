"""Snakemake profiles as scratchflow layers them: a cluster's profile (scratchflow's
`profiles/<cluster>/`), a lab's layer over it (`profiles/<cluster>/` of a lab pipeline, or of the
working directory that runs scratchflow's Snakefile: Snakemake's `--workflow-profile`), and the
switches of docs/clusters.md (`config/tests/profiles/<cluster>-<shape>.yaml`: several nodes, one
node, a preemptible partition), whose keys are merged into a profile key by key.

Snakemake replaces a top-level key of the profile with the layer's whole, so a switch copied into the
layer as it is would drop every other resource of the profile's `train` and all of `predict`'s. A
switch is applied instead by writing into the layer each top-level key it names, holding the profile's
value (or the layer's own) with the switch merged in: `apply_switch`, run by `scripts/apply_switch.py`.
"""

from __future__ import annotations

import copy
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from scratchflow import SCRATCHFLOW_DIR
from scratchflow.lab_pipeline import PROFILE_FILE, SUBMODULE
from scratchflow.releases import TAG_PATTERN, git

SWITCHES_FOLDER = "config/tests/profiles"  # in scratchflow's tree
APPLIED = re.compile(r"^# Applied: .*\n", re.MULTILINE)  # the header's line per switch applied

LAYER_HEADER = """\
# Our settings over scratchflow's {cluster} profile, key by key (a key set here replaces that key
# of scratchflow's profile whole). Run with:
#   snakemake {arguments}
# Written by scratchflow's scripts/apply_switch.py: each key a switch below names holds scratchflow's
# value (or ours, where we had set that key) with the switch's merged in (null removes one); our other
# keys are as they were. Comments below are not kept. Switches add up: to take one back, or to take
# another release's values, delete the keys it wrote and apply again.
"""


class SwitchError(ValueError):
    """A switch that cannot be applied as asked: said in one line, nothing written."""


def merged(settings: dict, switch: dict) -> dict:
    """`settings` with `switch`'s keys merged in: a mapping into a mapping key by key, any other value
    replacing the key's, `null` removing it. Neither argument is changed."""
    result = copy.deepcopy(settings)
    for key, value in switch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def layered(*profiles: dict) -> dict:
    """The settings Snakemake takes from a profile and the layers over it (`--profile`, then
    `--workflow-profile`): a later one's top-level key replaces an earlier one's whole; a key set to
    `null` is no setting at all."""
    settings: dict = {}
    for profile in profiles:
        settings.update({key: value for key, value in profile.items() if value is not None})
    return settings


def layer_with_switch(profile: dict, layer: dict, switch: dict) -> dict:
    """The layer that, over `profile`, gives the settings of `profile` under `layer` with `switch`
    merged in: the layer's keys as they were, and each top-level key the switch names holding its
    merged value whole (the lab's own value, where the layer has one, is what the switch merges into)."""
    wanted = merged(layered(profile, layer), switch)
    result = dict(layer)
    for key in switch:
        if key in wanted:
            result[key] = wanted[key]
        elif key in profile:
            raise SwitchError(
                f"the switch removes {key}, which scratchflow's profile sets, and a layer cannot remove a key "
                f"of the profile under it: set {key} to the value you want instead"
            )
        else:
            result.pop(key, None)
    return result


def read_settings(path: Path, what: str) -> dict:
    """A profile's, layer's or switch's settings (a YAML mapping), or one line saying what is wrong."""
    try:
        settings = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise SwitchError(f"{what} {path} is not YAML ({str(error).splitlines()[0]}): fix it") from None
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        raise SwitchError(f"{what} {path} holds no mapping of profile keys (key: value)")
    return settings


def switches_in(scratchflow: Path) -> list[str]:
    """The names of the switches scratchflow's checkout in `scratchflow` has."""
    return sorted(path.stem for path in (scratchflow / SWITCHES_FOLDER).glob("*.yaml"))


def find_switch(given: str, scratchflow: Path) -> Path:
    """The switch `given` names: one of scratchflow's by its name (`narval-several-nodes`, `.yaml`
    optional), or the path of a switch file of the lab's own."""
    if Path(given).expanduser().is_file():
        return Path(given).expanduser()
    named = scratchflow / SWITCHES_FOLDER / f"{given.removesuffix('.yaml')}.yaml"
    if "/" not in given and named.is_file():
        return named
    raise SwitchError(
        f"no switch {given}: name one of scratchflow's ({', '.join(switches_in(scratchflow))}; its "
        f"{SWITCHES_FOLDER}/, docs/clusters.md) or give a switch file's path"
    )


def version_of(checkout: Path) -> str:
    """The release `checkout` is (v0.3.0), the commits after one (v0.3.0-2-g1a2b3c4d), or its commit."""
    try:
        return git(checkout, "describe", "--tags", "--always", "--match", TAG_PATTERN, "HEAD").strip()
    except (OSError, subprocess.CalledProcessError):
        return "(not a git checkout)"


def scratchflow_under(folder: Path) -> Path:
    """The scratchflow whose profiles a layer in `folder` goes over: a lab pipeline's submodule, or,
    in a working directory that runs scratchflow's Snakefile from its own folder (docs/clusters.md,
    "Step by step"), the scratchflow this code is part of, whose profiles are never written."""
    submodule = folder / SUBMODULE
    if submodule.exists():
        if not (submodule / "profiles").is_dir():
            raise SwitchError(
                f"{submodule.resolve()} holds no scratchflow yet: run git submodule update --init in {folder.resolve()}"
            )
        return submodule
    if folder.resolve() == SCRATCHFLOW_DIR:
        raise SwitchError(
            f"{folder.resolve()} is scratchflow's own folder, whose profiles are not yours to change: apply "
            "the switch in your pipeline's folder, or the working directory you run the workflow in (--pipeline DIR)"
        )
    return SCRATCHFLOW_DIR


def run_arguments(folder: Path, scratchflow: Path, cluster: str) -> str:
    """Snakemake's arguments, in `folder`, for scratchflow's profile of `cluster` under the layer there
    (and scratchflow's Snakefile, where `folder` has none of its own)."""
    shown = SUBMODULE if scratchflow == folder / SUBMODULE else str(scratchflow)
    snakefile = "" if (folder / "Snakefile").is_file() else f"--snakefile {shown}/Snakefile "
    return f"{snakefile}--profile {shown}/profiles/{cluster} --workflow-profile profiles/{cluster}"


@dataclass(frozen=True)
class Applied:
    """A switch written into a layer: the layer's file, and Snakemake's arguments that read it."""

    layer: Path
    arguments: str


def apply_switch(folder: Path, given: str, cluster: str | None = None) -> Applied:
    """Apply the switch `given` (find_switch) in `folder` (a lab pipeline, or a working directory):
    write its layer over scratchflow's profile for `cluster` (default: the switch's name up to its
    first `-`), with a header saying what it was made from, such that Snakemake given the profile and
    the layer (run_arguments) reads the profile with the layer's earlier keys and the switch's merged
    in, every other key of the profile intact."""
    scratchflow = scratchflow_under(folder)
    path = find_switch(given, scratchflow)
    # The layer given as its own switch: its keys merged into scratchflow's, each written whole.
    own_layer = path.name == PROFILE_FILE and path.resolve().parent.parent == (folder / "profiles").resolve()
    cluster = path.parent.name if own_layer else cluster or path.stem.split("-")[0]
    profile_path = scratchflow / "profiles" / cluster / PROFILE_FILE
    if not profile_path.is_file():
        clusters = sorted(entry.parent.name for entry in (scratchflow / "profiles").glob(f"*/{PROFILE_FILE}"))
        raise SwitchError(
            f"scratchflow has no profile for the cluster {cluster!r} (its profiles: {', '.join(clusters)}): "
            "name the cluster the switch is for with --cluster"
        )
    layer_path = folder / "profiles" / cluster / PROFILE_FILE
    earlier = layer_path.read_text() if layer_path.is_file() else ""
    layer = read_settings(layer_path, "the layer") if earlier and not own_layer else {}
    switch = read_settings(path, "the switch")
    written = layer_with_switch(read_settings(profile_path, "scratchflow's profile"), layer, switch)
    source = path.resolve()
    shown = source.relative_to(folder.resolve()) if source.is_relative_to(folder.resolve()) else source
    arguments = run_arguments(folder, scratchflow, cluster)
    header = LAYER_HEADER.format(cluster=cluster, arguments=arguments)
    what = "the layer's own keys, each written whole" if own_layer else shown
    applied = [*APPLIED.findall(earlier), f"# Applied: {what}, over scratchflow {version_of(scratchflow)}\n"]
    header += "".join(dict.fromkeys(applied))
    layer_path.parent.mkdir(parents=True, exist_ok=True)
    layer_path.write_text(header + yaml.safe_dump(written, sort_keys=False, width=float("inf"), allow_unicode=True))
    return Applied(layer_path, arguments)
