"""A run's lease: which run its shared folder holds (`run.json`), and which job trains it now
(`running.json`). A checkpoint is never resumed by a run it does not match (other parameters, other
data), and a second copy of the same run (a requeued job next to its resubmission, a rerun while an
orphaned job still trains) waits instead of writing the same checkpoints at the same time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import time
from collections.abc import Container, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scratchflow.files import OWNER_TAG, process_may_live, read_json, write_json_atomically
from scratchflow.staging import remove_leftovers

log = logging.getLogger(__name__)

OWNER_FILE = "run.json"
HOLDER_FILE = "running.json"
# squeue states of a job that may still write (a pending one was requeued and will start again).
ACTIVE_SLURM_STATES = {
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
    "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
}  # fmt: skip


class CheckpointMismatch(RuntimeError):
    """The run's folder belongs to a different run (other parameters or other data)."""


@dataclass(frozen=True)
class RunLease:
    """The lease on one run's shared folder: `claim` it for a run, then hold it while training."""

    folder: Path

    def claim(self, owner: dict[str, Any]) -> None:
        """Mark the folder as holding the checkpoints of the run described by `owner`, or refuse if
        it already holds another run's."""
        folder = self.folder
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

    @contextlib.contextmanager
    def held(self, poll_seconds: float = 20) -> Iterator[None]:
        """Train the run alone: wait while another live job holds it, then hold it until done.

        The holder file is created exclusively (O_EXCL, atomic on local disks, NFS and Lustre), so
        of two jobs that find the run free at once, one waits. A holder left by a killed job is
        taken over.
        """
        folder = self.folder
        holder_file = folder / HOLDER_FILE
        me = this_process()
        while True:
            try:
                descriptor = os.open(holder_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    holder = read_json(holder_file)
                except (FileNotFoundError, ValueError):
                    time.sleep(1)  # being written or just released: look again
                    continue
                if holder_is_alive(holder):
                    log.warning("another job is training this run (%s); waiting for it to end", holder)
                    time.sleep(poll_seconds)
                else:
                    log.info("taking over from a job that is gone: %s", holder)
                    _remove_holder(holder_file, holder)
                continue
            with os.fdopen(descriptor, "w") as out:
                out.write(json.dumps(me))
            break
        try:
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                if read_json(holder_file) == me:
                    os.unlink(holder_file)


def this_process() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "slurm_job_id": os.environ.get("SLURM_JOB_ID")}


def holder_is_alive(holder: dict[str, Any], active_slurm_jobs: Container[str] | None = None) -> bool:
    """Whether the job or process recorded in `running.json` may still be training. A Slurm job is
    looked up in `active_slurm_jobs` (the ids of the jobs that may still write, from one squeue of
    them all: the status asks once for a whole grid), or else asked about alone."""
    job_id = holder.get("slurm_job_id")
    if job_id:
        if job_id == os.environ.get("SLURM_JOB_ID"):
            return False  # this very job, requeued: its earlier run on a node is over
        if active_slurm_jobs is not None:
            return job_id in active_slurm_jobs
        try:
            result = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
        except FileNotFoundError:
            # No Slurm client here (a job step in a container image): the holder's process is all
            # that can be asked, on this node; one elsewhere is assumed alive rather than train twice.
            return process_may_live(holder["host"], holder["pid"])
        if result.returncode != 0 and "Invalid job id" not in result.stderr:
            return True  # Slurm did not answer (a controller restarting): ask again later
        return result.stdout.strip() in ACTIVE_SLURM_STATES
    return process_may_live(holder["host"], holder["pid"])


def _remove_holder(holder_file: Path, gone: dict[str, Any]) -> None:
    """Remove the holder file of a job that is gone. Another waiter may have replaced it by its own
    in the meantime: that one is put back, so that the run never has two holders."""
    moved = holder_file.with_name(f".{HOLDER_FILE}.stale{OWNER_TAG}")
    with contextlib.suppress(FileNotFoundError):
        os.rename(holder_file, moved)
        if read_json(moved) != gone:
            with contextlib.suppress(FileExistsError):
                os.link(moved, holder_file)
        os.unlink(moved)
