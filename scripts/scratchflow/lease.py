"""A run's lease, and the one gate to its shared folders.

The lease: which run the shared folder `checkpoints/<run_id>/` holds (`run.json`), which job trains
it now (`running.json`). A checkpoint is never resumed by a run it does not match (other parameters,
other data), and a second copy of the same run (a requeued job next to its resubmission, a rerun
while an orphaned job still trains) waits instead of writing the same checkpoints at the same time.

Waiting needs the holder to be known alive, which no one can know of a job whose node stopped
answering: Slurm requeues it under the same id (its slurmd died, a network partition) while its
processes may train on. So each holder also takes the run's next **term**, a number that only grows
(`lease/000007`, created exclusively; records of main between 0.3.0 and 0.4.0 called it `epoch`), and every write of its
piece to the run's folders (`checkpoints/<run_id>/`, `results/runs/<run_id>/`) goes through one
gate, `RunFolder`, which looks first that no newer term exists (one listing of `lease/`, once per
publication: `RunFolder.publishing`). A piece that finds one is `Superseded`: it writes nothing more
there and ends, its end noted beside its own term (`lease/000007.superseded`), which the ledger reads.

A look and the rename after it are not one step: a process frozen between them (tens of
milliseconds for a publication; longer for a stopped process) can still put an older term's file in
place after a newer term began. So readers check the token too: a checkpoint or a ledger line that
an older term published after a newer term began is ignored (`RunFolder.published_too_late`), by
the times both recorded (the nodes' clocks, NTP-close).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scratchflow.files import (
    OWNER_TAG,
    process_may_live,
    read_json,
    remove_leftovers,
    remove_whole,
    write_json_atomically,
    written_whole,
)
from scratchflow.staging import copied_whole, copy_whole

log = logging.getLogger(__name__)

OWNER_FILE = "run.json"
HOLDER_FILE = "running.json"
LEASE_FOLDER = "lease"  # the run's terms, one file each (TERM_NAME), and the ends of superseded pieces
TERM_NAME = "{term:06d}"
SUPERSEDED_SUFFIX = ".superseded"
# squeue states of a job that may still write (a pending one was requeued and will start again).
ACTIVE_SLURM_STATES = {
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
    "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
}  # fmt: skip


class CheckpointMismatch(RuntimeError):
    """The run's folder belongs to a different run (other parameters or other data)."""


class Superseded(RuntimeError):
    """A newer piece holds the run (or the run is over and its folder removed): this piece may write
    nothing more to the run's shared folders."""


@dataclass(frozen=True)
class RunFolder:
    """A run's shared folders, and the one way to write to them: the folder `path`
    (`checkpoints/<run_id>/`: its checkpoints, lease and ledger) and its results (`results/runs/<run_id>/`).
    Held by a piece (`term`), each write looks at the fence first; not held (None: the status, a
    task's check, the cleaning after a workflow), it writes without a look."""

    path: Path
    results: Path | None = None
    term: int | None = None

    @property
    def lease_folder(self) -> Path:
        return self.path / LEASE_FOLDER

    @contextlib.contextmanager
    def publishing(self) -> Iterator[Publication]:
        """One look at the fence (one listing of lease/), then the block's writes, made through the
        `Publication` it yields: all of them go only where no newer piece held the run when it looked."""
        self.look()
        yield Publication(self)

    @contextlib.contextmanager
    def publishing_if_held(self) -> Iterator[Publication | None]:
        """As `publishing`, or None where a newer piece holds the run: for what a piece writes as it
        ends, superseded or not (its last progress, its end)."""
        try:
            self.look()
        except Superseded:
            yield None
        else:
            yield Publication(self)

    def superseded(self) -> bool:
        """Whether a newer piece holds the run now (or its folder is gone)."""
        with self.publishing_if_held() as publication:
            return publication is None

    def write_json(self, data: Any, path: Path, durable: bool = True) -> None:
        """One file written whole, in a publication of its own."""
        with self.publishing() as publication:
            publication.write_json(data, path, durable)

    def publish_copy(
        self, source: Path, destination: Path, with_it: Callable[[Publication], None] | None = None
    ) -> Publication:
        """A file or folder copied whole from scratch (scratchflow.staging.copied_whole), its look at
        the fence just before it is renamed into place, `with_it` written in the same publication;
        returned, for what follows the rename in it."""
        self._inside(destination)
        with copied_whole(source, destination), self.publishing() as publication:
            if with_it is not None:
                with_it(publication)
        return publication

    def unpublished(self) -> Publication:
        """Writes that no reader looks at until a publication gives them a name (the hidden folder
        where a checkpoint of several processes is assembled): no look at the fence."""
        return Publication(self)

    def note_superseded(self, end: dict[str, Any]) -> None:
        """A superseded piece's end (its ledger entry), in its own term's file of lease/ (the ledger's
        own files are the newer piece's now), which the ledger reads (`superseded_ends`)."""
        assert self.term is not None, "only a held folder's piece is superseded"
        with contextlib.suppress(FileNotFoundError):  # the run's folder removed: nothing left to tell
            path = self.lease_folder / (TERM_NAME.format(term=self.term) + SUPERSEDED_SUFFIX)
            write_json_atomically(end, path, durable=False)

    def published_too_late(
        self, term: int | None, at: float | None, began: dict[int, float | None] | None = None
    ) -> str | None:
        """Why what the piece of `term` published at `at` (time.time()) is to be ignored: it came
        after a newer term began (a frozen process's write, between its look and its rename); or
        None, to trust it. Unknown times (`at` None) of an older term than the newest are not trusted.
        `began`: `terms_began()`, where the caller judges several things at once."""
        if term is None:
            return None  # written where no piece held the run (before 0.4, or by a task's check)
        began = self.terms_began(self.terms_listed()) if began is None else began
        newer = [number for number in began if number > term]
        if not newer:
            return None
        first = min(newer)  # terms are taken in order: the first newer one began first
        first_began = began[first]
        if at is None:
            return f"published by term {term} with no time noted (its piece ended or froze first); term {first} began"
        if first_began is None or at > first_began:
            return f"published by term {term} after term {first} began"
        return None

    def terms_began(self, terms: list[int]) -> dict[int, float | None]:
        """When each of `terms` began (None: unknown), from its file in lease/."""
        return {term: _read_or_empty(self.lease_folder / TERM_NAME.format(term=term)).get("began_at") for term in terms}

    def terms_listed(self) -> list[int]:
        """The run's terms (one listing of lease/)."""
        try:
            return terms_in(self.lease_folder)
        except FileNotFoundError:
            return []

    def look(self) -> None:
        """Raise Superseded where a newer term holds the run, or the run's folder is gone (a finished
        workflow removed it): one listing of the lease folder. Every write of a held folder's comes
        after one (`publishing`); a piece calls it itself where its failure may be its supersession."""
        if self.term is None:
            return
        try:
            newest = max(terms_in(self.lease_folder))
        except (FileNotFoundError, ValueError):
            raise Superseded(
                f"the run's folder {self.path} is gone (a finished workflow removed it): this piece "
                f"(term {self.term}) writes nothing more"
            ) from None
        if newest > self.term:
            newer = _read_or_empty(self.lease_folder / TERM_NAME.format(term=newest))
            by = f"Slurm job {newer['slurm_job_id']}" if newer.get("slurm_job_id") else f"pid {newer.get('pid')}"
            raise Superseded(
                f"a newer piece holds the run (term {newest}: {by} on {newer.get('host')}) since "
                f"{newer.get('began', '?')}: this piece (term {self.term}) stops and writes nothing more "
                f"to {self.path}"
            )

    def _inside(self, path: Path) -> None:
        """The gate writes its run's folders only (both known: a piece's)."""
        if self.results is None:
            return
        folders = [self.path, self.results]
        if not any(path.absolute().is_relative_to(folder.absolute()) for folder in folders):
            raise ValueError(f"{path} is outside the run's folders {', '.join(map(str, folders))}")


class Publication:
    """The writes of one publication to a run's folders, made after its gate looked at the fence
    (`RunFolder.publishing`): each whole or not at all."""

    def __init__(self, gate: RunFolder) -> None:
        self.gate = gate

    def write_json(self, data: Any, path: Path, durable: bool = True) -> None:
        """`durable`: on disk before it is renamed into place (an fsync: a round trip to a shared
        filesystem's servers, spared for what a crash may lose)."""
        self.gate._inside(path)
        write_json_atomically(data, path, durable=durable)

    def write_text(self, text: str, path: Path) -> None:
        self.gate._inside(path)
        with written_whole(path) as partial:
            partial.write_text(text)

    def copy_file(self, source: Path, destination: Path) -> None:
        """One small file, copied under a partial name and renamed (rsync's copy, for a checkpoint's
        many files, costs the metadata server ten times the operations)."""
        self.gate._inside(destination)
        with written_whole(destination) as partial:
            shutil.copyfile(source, partial)

    def copy_tree_into(self, source: Path, destination: Path) -> None:
        """A folder's files copied into `destination`, beside what is there (a node's part of a checkpoint)."""
        self.gate._inside(destination)
        shutil.copytree(source, destination, dirs_exist_ok=True)

    def copy_tree(self, source: Path, destination: Path) -> None:
        """A folder (or file) copied whole with rsync (scratchflow.staging.copy_whole)."""
        self.gate._inside(destination)
        copy_whole(source, destination)

    def append_line(self, data: Any, path: Path) -> None:
        """A JSON line appended whole (one short write), without a lock."""
        self.gate._inside(path)
        with open(path, "a") as out:
            out.write(json.dumps(data) + "\n")

    def rename(self, source: Path, destination: Path) -> None:
        self.gate._inside(source)
        self.gate._inside(destination)
        os.rename(source, destination)

    def remove(self, path: Path) -> None:
        """A folder deleted whole (renamed first: no half-deleted copy keeps its name)."""
        self.gate._inside(path)
        remove_whole(path)


def terms_in(lease_folder: Path) -> list[int]:
    return [int(name) for name in os.listdir(lease_folder) if name.isdigit()]


def take_term(folder: Path, holder: dict[str, Any]) -> int:
    """The run's next term, for `holder`: its file created exclusively (atomic on local disks, NFS
    and Lustre), so that of two holders that count the same, one takes the number after."""
    lease_folder = folder / LEASE_FOLDER
    lease_folder.mkdir(exist_ok=True)
    while True:
        term = max(terms_in(lease_folder), default=0) + 1
        try:
            path = lease_folder / TERM_NAME.format(term=term)
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            continue
        began = time.time()
        with os.fdopen(descriptor, "w") as out:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(began))
            out.write(json.dumps({**holder, "term": term, "began": stamp, "began_at": began}))
        return term


def superseded_ends(folder: Path) -> dict[int, dict[str, Any]]:
    """The ends the superseded pieces of the run in `folder` noted (RunFolder.note_superseded), by term."""
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
    def held(self, results: Path | None = None, poll_seconds: float = 20) -> Iterator[RunFolder]:
        """Train the run alone: wait while another live job holds it, then hold it until done, with
        the run's next term (yielded: the gate of every write to the run's folders, `results` too).

        The holder file is created exclusively (O_EXCL, atomic on local disks, NFS and Lustre), so
        of two jobs that find the run free at once, one waits. A holder left by a job that is gone is
        taken over; if its processes still train (a requeued job whose node stopped answering), the
        new term stops them at their next write.
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
                    time.sleep(1)  # being written or just removed: look again
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
            yield RunFolder(folder, results, take_term(folder, me))
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
