"""Checkpoints on shared storage: the progress of a run that must survive a killed job.

They live outside the rule's declared outputs (Snakemake deletes the outputs of failed jobs), in
`checkpoints/<run_id>/`, and appear there only whole: each is written to scratch by the trainer and
then moved in with `staging.sync_back`. The folder's `run.json` says which run (parameters and data)
the checkpoints belong to, so that a checkpoint is never resumed by a run it does not match.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from scratchflow.staging import OWNER_TAG, read_json, remove_leftovers, sync_back, write_json_atomically

CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")
# The trainer writes this last, so a checkpoint without it is incomplete.
COMPLETION_FILE = "trainer_state.json"
OWNER_FILE = "run.json"


class CheckpointMismatch(RuntimeError):
    """The checkpoint folder belongs to a different run (other parameters or other data)."""


def complete_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint in `folder`, oldest first."""
    found = []
    if folder.is_dir():
        for entry in folder.iterdir():
            match = CHECKPOINT_NAME.fullmatch(entry.name)
            if match and (entry / COMPLETION_FILE).is_file():
                found.append((int(match.group(1)), entry))
    return sorted(found)


def newest_complete_checkpoint(folder: Path) -> Path | None:
    checkpoints = complete_checkpoints(folder)
    return checkpoints[-1][1] if checkpoints else None


def claim(folder: Path, owner: dict[str, Any]) -> None:
    """Mark `folder` as holding the checkpoints of the run described by `owner`, or refuse if it
    already holds another run's."""
    owner_file = folder / OWNER_FILE
    remove_leftovers(folder.parent, f".{folder.name}.")
    remove_leftovers(folder)
    if owner_file.is_file():
        recorded = read_json(owner_file)
        if recorded != owner:
            differing = sorted(key for key in set(recorded) | set(owner) if recorded.get(key) != owner.get(key))
            raise CheckpointMismatch(
                f"{folder} holds checkpoints of a different run (differs in: {', '.join(differing)}). "
                f"Resuming from them would mix two experiments. Delete {folder} to start this run from scratch."
            )
        return
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomically(owner, owner_file)


def _remove_whole(path: Path) -> None:
    """Delete a directory so that no half-deleted copy keeps its name: rename first, then delete."""
    doomed = path.with_name(f".{path.name}.deleting{OWNER_TAG}")
    os.rename(path, doomed)
    shutil.rmtree(doomed)


def mirror(local_checkpoint: Path, folder: Path, keep: int) -> Path:
    """Copy a checkpoint the trainer just wrote on scratch into the shared folder, whole or not at
    all, then drop all but the newest `keep` complete ones."""
    destination = folder / local_checkpoint.name
    sync_back(local_checkpoint, destination)
    for _step, old in complete_checkpoints(folder)[:-keep]:
        _remove_whole(old)
    return destination


def release(folder: Path) -> None:
    """Remove a finished run's checkpoints: its model is on shared storage now."""
    if folder.is_dir():
        _remove_whole(folder)
