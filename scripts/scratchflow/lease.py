"""A run's lease: which run its shared folder holds (`run.json`), which job trains it now
(`running.json`), and the fence that keeps every other writer out (`lease/`). A checkpoint is never
resumed by a run it does not match (other parameters, other data), and a second copy of the same run
(a requeued job next to its resubmission, a rerun while an orphaned job still trains) waits instead
of writing the same checkpoints at the same time.

Waiting needs the holder to be known alive, which no one can know of a job whose node stopped
answering: Slurm requeues it under the same id (its slurmd died, a network partition) while its
processes may train on. So each holder also takes the run's next **epoch**, a number that only
grows (`lease/000007`, created exclusively), and checks before each write to the run's shared
folders that no newer epoch exists (`Fence.check`, one directory listing). A piece that finds one
is `Superseded`: it writes nothing more there and ends, its end noted in its own epoch's file
(`lease/000007.superseded`), which the ledger reads.
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
LEASE_FOLDER = "lease"  # the run's epochs, one file each (EPOCH_NAME), and the ends of superseded pieces
EPOCH_NAME = "{epoch:06d}"
SUPERSEDED_SUFFIX = ".superseded"
# squeue states of a job that may still write (a pending one was requeued and will start again).
ACTIVE_SLURM_STATES = {
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
    "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
}  # fmt: skip


class CheckpointMismatch(RuntimeError):
    """The run's folder belongs to a different run (other parameters or other data)."""


class Superseded(RuntimeError):
    """A newer piece holds the run (or the run is over and its folder released): this piece may write
    nothing more to the run's shared folders."""


@dataclass(frozen=True)
class Fence:
    """A piece's epoch of its run: what it writes to the run's shared folders, it writes only while no
    newer epoch exists."""

    folder: Path  # the run's shared folder (its lease folder: LEASE_FOLDER in it)
    epoch: int

    @property
    def lease_folder(self) -> Path:
        return self.folder / LEASE_FOLDER

    def check(self) -> None:
        """Raise Superseded where a newer epoch holds the run, or the run's folder is gone (a finished
        workflow released it): one listing of the lease folder, before each write."""
        try:
            newest = max(epochs_in(self.lease_folder))
        except (FileNotFoundError, ValueError):
            raise Superseded(
                f"the run's folder {self.folder} is gone (a finished workflow released it): this piece "
                f"(epoch {self.epoch}) writes nothing more"
            ) from None
        if newest > self.epoch:
            newer = _read_or_empty(self.lease_folder / EPOCH_NAME.format(epoch=newest))
            by = f"Slurm job {newer['slurm_job_id']}" if newer.get("slurm_job_id") else f"pid {newer.get('pid')}"
            raise Superseded(
                f"a newer piece holds the run (epoch {newest}: {by} on {newer.get('host')}) since "
                f"{newer.get('began', '?')}: this piece (epoch {self.epoch}) stops and writes nothing more "
                f"to {self.folder}"
            )

    def note_superseded(self, end: dict[str, Any]) -> None:
        """This piece's end (its ledger entry), in its own file of the lease folder: the ledger reads it
        (`superseded_ends`), since the ledger's own files are the newer piece's now."""
        with contextlib.suppress(FileNotFoundError):  # the run's folder released: nothing left to tell
            path = self.lease_folder / (EPOCH_NAME.format(epoch=self.epoch) + SUPERSEDED_SUFFIX)
            write_json_atomically(end, path, durable=False)


def epochs_in(lease_folder: Path) -> list[int]:
    return [int(name) for name in os.listdir(lease_folder) if name.isdigit()]


def take_epoch(folder: Path, holder: dict[str, Any]) -> Fence:
    """The run's next epoch, for `holder`: its file created exclusively (atomic on local disks, NFS
    and Lustre), so that of two holders that count the same, one takes the number after."""
    lease_folder = folder / LEASE_FOLDER
    lease_folder.mkdir(exist_ok=True)
    while True:
        epoch = max(epochs_in(lease_folder), default=0) + 1
        try:
            path = lease_folder / EPOCH_NAME.format(epoch=epoch)
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            continue
        with os.fdopen(descriptor, "w") as out:
            out.write(json.dumps({**holder, "epoch": epoch, "began": time.strftime("%Y-%m-%dT%H:%M:%S%z")}))
        return Fence(folder, epoch)


def superseded_ends(folder: Path) -> dict[int, dict[str, Any]]:
    """The ends the superseded pieces of the run in `folder` noted (Fence.note_superseded), by epoch."""
    try:
        names = os.listdir(folder / LEASE_FOLDER)
    except FileNotFoundError:
        return {}
    ends = {}
    for name in names:
        if name.endswith(SUPERSEDED_SUFFIX):
            with contextlib.suppress(OSError, ValueError):
                ends[int(name.removesuffix(SUPERSEDED_SUFFIX))] = read_json(folder / LEASE_FOLDER / name)
    return ends


def _read_or_empty(path: Path) -> dict[str, Any]:
    try:
        return read_json(path)
    except (OSError, ValueError):
        return {}


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
    def held(self, poll_seconds: float = 20) -> Iterator[Fence]:
        """Train the run alone: wait while another live job holds it, then hold it until done, with
        the run's next epoch (yielded: the fence of every write to the run's shared folders).

        The holder file is created exclusively (O_EXCL, atomic on local disks, NFS and Lustre), so
        of two jobs that find the run free at once, one waits. A holder left by a job that is gone is
        taken over; if its processes still train (a requeued job whose node stopped answering), the
        new epoch stops them at their next write.
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
            yield take_epoch(folder, me)
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
