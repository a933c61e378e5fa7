"""A run's progress on shared storage, owned by one object: `RunCheckpoints`.

Checkpoints live outside the rule's declared outputs (Snakemake deletes the outputs of failed jobs),
in `checkpoints/<run_id>/`, and appear there only whole: each is written to scratch by the task and
then copied in with `staging.copy_whole`. A checkpoint is a directory `checkpoint-<step>` and is
complete once it holds the task's marker file (written last). The folder's `run.json` says which
run (parameters and data) the checkpoints belong to, so that a checkpoint is never resumed by a run
it does not match. A checkpoint written by several training processes holds `world.json` (how many)
and is assembled from every node's part under a hidden name before it gets its own. Each checkpoint
carries `contents.json`, its files' sizes and sha256, written as it is published: a job verifies the
newest before resuming from it, and sets a damaged one aside (`checkpoint-<step>.damaged`, with
`damage.txt` saying what was wrong) to resume from the one before. While a job
trains the run, `running.json` names it: a second copy of the same run (a requeued job next to its
resubmission, a rerun while an orphaned job still trains) waits instead of writing the same
checkpoints at the same time. `pieces.json` lists the jobs that trained
the run, in order, with how each ended and when it last published a checkpoint (`published.jsonl`
has a line per checkpoint published: what a piece that ended unfinished trained after it was lost,
scratchflow.accounting); `progress.json` says where the training is (step, speed, time left), for
`scripts/status.py`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Container, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scratchflow.files import (
    OWNER_TAG,
    file_sha256,
    filesystem_of,
    process_may_live,
    read_json,
    require_free_space,
    write_json_atomically,
)
from scratchflow.slurm_job import requeue_cause
from scratchflow.staging import StagingError, copy_whole, remove_leftovers, tree_bytes

log = logging.getLogger(__name__)

CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")
OWNER_FILE = "run.json"
HOLDER_FILE = "running.json"
PIECES_FILE = "pieces.json"
PROGRESS_FILE = "progress.json"
PUBLISHED_FILE = "published.jsonl"
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S%z"  # a piece's times, as its entry in pieces.json holds them


def piece_time(stamp: str) -> float:
    """A time of a piece's entry (TIME_FORMAT) as seconds since the epoch."""
    return datetime.datetime.strptime(stamp, TIME_FORMAT).timestamp()


# In a checkpoint written by several processes: their number (absent: one process wrote it).
WORLD_FILE = "world.json"
# In every checkpoint: its other files' sizes and sha256 (absent in one written before scratchflow 0.2).
CONTENTS_FILE = "contents.json"
DAMAGED_SUFFIX = ".damaged"
DAMAGE_FILE = "damage.txt"
# squeue states of a job that may still write (a pending one was requeued and will start again).
ACTIVE_SLURM_STATES = {
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
    "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
}  # fmt: skip


class CheckpointMismatch(RuntimeError):
    """The checkpoint folder belongs to a different run (other parameters or other data)."""


class WorldSizeChanged(RuntimeError):
    """The newest checkpoint was written by another number of training processes than this job runs."""


def world_size_of(checkpoint: Path) -> int:
    world_file = checkpoint / WORLD_FILE
    return read_json(world_file)["world_size"] if world_file.is_file() else 1


def complete_checkpoints(folder: Path, marker: str) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint in `folder` (holding `marker`), oldest first: the
    one definition of "complete", on scratch and on shared storage, for resume, mirroring and the
    status alike."""
    found = []
    if folder.is_dir():
        for entry in folder.iterdir():
            match = CHECKPOINT_NAME.fullmatch(entry.name)
            if match and (entry / marker).is_file():
                found.append((int(match.group(1)), entry))
    return sorted(found)


def newest_complete_checkpoint(folder: Path, marker: str) -> Path | None:
    checkpoints = complete_checkpoints(folder, marker)
    return checkpoints[-1][1] if checkpoints else None


def step_of(checkpoint: Path) -> int:
    return int(CHECKPOINT_NAME.fullmatch(checkpoint.name).group(1))


def write_contents(checkpoint: Path) -> None:
    """Record each file of `checkpoint` with its size and sha256, in the checkpoint itself."""
    files = {
        str(path.relative_to(checkpoint)): {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
        for path in sorted(checkpoint.rglob("*"))
        if path.is_file() and path.name != CONTENTS_FILE
    }
    write_json_atomically({"files": files}, checkpoint / CONTENTS_FILE)


def checkpoint_damage(checkpoint: Path, read_bytes: bool = True) -> str | None:
    """What is wrong with `checkpoint` against its contents.json (a file missing, of another size,
    or, with `read_bytes`, of other bytes), or None. One without contents.json cannot be checked."""
    try:
        recorded = read_json(checkpoint / CONTENTS_FILE)["files"]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError) as error:
        return f"its {CONTENTS_FILE} is unreadable ({error})"
    for name, expected in recorded.items():
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != expected["bytes"]:
            return f"{name} has {size} bytes where {expected['bytes']} were saved"
        if read_bytes and file_sha256(path) != expected["sha256"]:
            return f"{name} has other bytes than were saved (sha256 differs)"
    return None


def remove_whole(path: Path) -> None:
    """Delete a directory so that no half-deleted copy keeps its name: rename first, then delete."""
    doomed = path.with_name(f".{path.name}.deleting{OWNER_TAG}")
    os.rename(path, doomed)
    shutil.rmtree(doomed)


@dataclass(frozen=True)
class RunCheckpoints:
    """The checkpoint state of one run on shared storage: claim, hold, pieces, newest complete
    checkpoint, mirror, release. `marker` is the file a task writes last into a checkpoint."""

    folder: Path
    marker: str
    keep: int = 2

    def complete(self) -> list[tuple[int, Path]]:
        return complete_checkpoints(self.folder, self.marker)

    def newest(self) -> Path | None:
        return newest_complete_checkpoint(self.folder, self.marker)

    def newest_intact(self) -> Path | None:
        """The newest complete checkpoint whose files are those it was saved with; each newer one that
        is not is set aside (renamed checkpoint-<step>.damaged, with damage.txt), and said."""
        for _step, checkpoint in reversed(self.complete()):
            damage = checkpoint_damage(checkpoint)
            if damage is None:
                return checkpoint
            aside = checkpoint.with_name(checkpoint.name + DAMAGED_SUFFIX)
            if aside.exists():
                remove_whole(aside)
            os.rename(checkpoint, aside)
            (aside / DAMAGE_FILE).write_text(damage + "\n")
            log.warning(
                "%s is damaged (%s): set aside as %s; resuming from the one before", checkpoint, damage, aside.name
            )
        return None

    def check_space_for_the_next(self, newest: Path | None) -> None:
        """Fail at once, before a piece trains, when the folder's filesystem has no room for one
        more checkpoint the size of `newest` (the newest intact one): the piece could not save its
        progress, and a retry would train to the same wall."""
        if newest is None:
            return
        require_free_space(
            self.folder, tree_bytes(newest), f"the next checkpoint (the newest, {newest.name}, is as big)"
        )

    def check_scratch_space(self, scratch: Path, newest: Path | None, model: Path | None) -> None:
        """Fail at once, before a piece trains, when node-local `scratch` (its data staged) has no
        room for the checkpoints the task keeps there while it trains (`keep`, and the next one
        written before the oldest goes), each the size of `newest`, or else estimated
        (`checkpoint_size`); nothing is said where no size is known yet."""
        size = (
            (tree_bytes(newest), f"the size of {newest.name}") if newest else checkpoint_size(self.folder.parent, model)
        )
        if size is None:
            return
        require_free_space(
            scratch,
            size[0] * (self.keep + 1),
            f"the {self.keep + 1} checkpoints it holds while it trains (one's size: {size[1]})",
        )

    def damaged(self) -> dict[str, str]:
        """The checkpoints set aside as damaged, by name, with what was wrong."""
        found = {}
        for aside in sorted(self.folder.glob(f"checkpoint-*{DAMAGED_SUFFIX}")):
            with contextlib.suppress(OSError):
                found[aside.name.removesuffix(DAMAGED_SUFFIX)] = (aside / DAMAGE_FILE).read_text().strip()
        return found

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

    def restore_newest_to(self, local_folder: Path, world_size: int = 1) -> Path | None:
        """Copy the newest complete checkpoint to scratch (`local_folder`), where the task resumes
        from it; None when the run starts from zero. Refused if it was written by another number of
        training processes: the global batch, the data order and the per-process random states
        would not continue the same run. A copy already there (restored by the node's launcher) is
        used as it is."""
        newest = self.newest()
        if newest is None:
            return None
        written_by = world_size_of(newest)
        if written_by != world_size:
            raise WorldSizeChanged(
                f"{newest} was written by {written_by} training process(es), and this job trains with "
                f"{world_size}: resuming would continue the run with another global batch and data order. "
                "Train it with the shape it started with (the train rule's nodes and processes_per_node, or "
                f"GPUs, in the profile), or delete {self.folder} to start it again at this shape."
            )
        local = local_folder / newest.name
        if not local.is_dir():
            copy_whole(newest, local)
        log.info("resuming from %s", newest)
        return local

    def mirroring(self, local_folder: Path, restored_step: int | None = None) -> CheckpointMirroring:
        """The service that copies each new complete checkpoint a task writes into `local_folder`
        (on scratch) to this shared folder; `restored_step`: the step restored from here, if any."""
        return CheckpointMirroring(self, local_folder, restored_step)

    def mirror(self, local_checkpoint: Path) -> Path:
        """Copy a checkpoint the task just wrote on scratch into the shared folder, whole or not at
        all, then drop all but the newest `keep` complete ones."""
        destination = self.folder / local_checkpoint.name
        write_contents(local_checkpoint)
        copy_whole(local_checkpoint, destination)
        self._note_published(destination)
        for _step, old in self.complete()[: -self.keep]:
            remove_whole(old)
        return destination

    def _note_published(self, checkpoint: Path) -> None:
        """A line in published.jsonl: appended whole (one short write), from whichever process
        published, without a lock."""
        with open(self.folder / PUBLISHED_FILE, "a") as out:
            out.write(json.dumps({"checkpoint": checkpoint.name, "at": time.time()}) + "\n")

    def last_published_since(self, since: float) -> float | None:
        """When the newest checkpoint published at or after `since` was published (None: none was)."""
        try:
            lines = (self.folder / PUBLISHED_FILE).read_text().splitlines()
        except FileNotFoundError:
            return None
        times = [json.loads(line)["at"] for line in lines if line.strip()]
        return max((at for at in times if at >= since), default=None)

    def assembly(self, name: str, tag: str) -> Path:
        """Where the parts of checkpoint `name`, written by several processes on several nodes, are
        gathered before `publish` gives it its name. `tag` (the launching job's owner tag, the same
        on every node) lets a later job remove what a killed one left."""
        return self.folder / f".{name}.assembling{tag}"

    def publish(self, assembly: Path, world_size: int) -> Path:
        """Give an assembled checkpoint its name, with the number of processes that wrote it, then
        drop all but the newest `keep` complete ones."""
        write_json_atomically({"world_size": world_size}, assembly / WORLD_FILE)
        write_contents(assembly)
        destination = self.folder / assembly.name[1:].split(".assembling")[0]
        if destination.exists():
            remove_whole(destination)
        os.rename(assembly, destination)
        self._note_published(destination)
        for _step, old in self.complete()[: -self.keep]:
            remove_whole(old)
        return destination

    def release(self) -> None:
        """Remove a finished run's checkpoints: its results are on shared storage now."""
        if self.folder.is_dir():
            remove_whole(self.folder)

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

    def report_progress(self, progress: dict[str, Any]) -> None:
        """Where the training is now (step, max_steps, loss, samples_per_second, seconds_left, at)."""
        write_json_atomically(progress, self.folder / PROGRESS_FILE)

    def pieces(self) -> list[dict[str, Any]]:
        """The jobs that have trained this run so far, oldest first."""
        path = self.folder / PIECES_FILE
        return read_json(path) if path.is_file() else []

    def record_piece(self, piece: dict[str, Any]) -> None:
        """Add or update (same number) this job's entry in the run's list of pieces."""
        listed = [entry for entry in self.pieces() if entry.get("piece") != piece["piece"]]
        listed.append(piece)
        write_json_atomically(listed, self.folder / PIECES_FILE)

    @contextlib.contextmanager
    def piece(self) -> Iterator[dict[str, Any]]:
        """List this job in the run's pieces with how it ended (finished, or the error that stopped
        it, with the step of the run's newest checkpoint then); the caller adds what it knows
        (steps, its log) to the yielded entry. Called while holding the run: an earlier piece still
        listed as running was killed (no job holds the run), and is closed as such."""
        self.close_killed_pieces()
        self.note_requeue()
        started = time.time()
        piece = {
            "piece": len(self.pieces()) + 1,
            **this_process(),
            "started_at": time.strftime(TIME_FORMAT, time.localtime(started)),
            "outcome": "running",
        }
        self.record_piece(piece)
        try:
            yield piece
        except BaseException as error:
            piece["outcome"] = outcome_of(error)
            piece.setdefault("reached_step", self.newest_step())
            trained_to = self._progress_step_since(started)
            if trained_to is not None and trained_to > (piece["reached_step"] or 0):
                piece["trained_to_step"] = trained_to  # the steps since its newest checkpoint are lost
            raise
        else:
            piece["outcome"] = "finished"
        finally:
            piece["ended_at"] = time.strftime(TIME_FORMAT)
            piece["last_checkpoint_at"] = self._published_stamp(started)
            self.record_piece(piece)

    def _published_stamp(self, since: float) -> str | None:
        published = self.last_published_since(since)
        return time.strftime(TIME_FORMAT, time.localtime(published)) if published is not None else None

    def _progress_step_since(self, started: float) -> int | None:
        """The step this piece's trainer last reported (progress.json), if it reported since `started`."""
        try:
            progress = read_json(self.folder / PROGRESS_FILE)
        except (FileNotFoundError, ValueError):
            return None
        return progress.get("step") if progress.get("at", 0) >= started else None

    def newest_step(self) -> int | None:
        newest = self.newest()
        return step_of(newest) if newest else None

    def note_requeue(self) -> None:
        """This job is one that Slurm requeued (a preemption, a lost node): the earlier piece ran in the
        same job, and sacct lists an earlier run of it. That piece gets `requeued`, the cause
        (`requeue_cause`). (SLURM_RESTART_COUNT would say so too, but no job step gets it.)"""
        job_id, listed = os.environ.get("SLURM_JOB_ID"), self.pieces()
        if not (listed and job_id):
            return
        earlier = listed[-1]
        if earlier.get("slurm_job_id") != job_id or "requeued" in earlier:
            return
        cause = requeue_cause(job_id)
        if cause:
            earlier["requeued"] = cause
            log.info("piece %s ended when Slurm requeued job %s: %s", earlier["piece"], job_id, cause)
            write_json_atomically(listed, self.folder / PIECES_FILE)

    def close_killed_pieces(self) -> None:
        """Pieces listed as running whose job is gone (killed outright: SIGKILL, a node failure)
        become `killed`, with the step of the newest checkpoint, the last one they could write."""
        listed = self.pieces()
        killed = [entry for entry in listed if entry.get("outcome") == "running"]
        if not killed:
            return
        for entry in killed:
            started = piece_time(entry["started_at"])
            entry.update(
                outcome="killed",
                reached_step=self.newest_step(),
                ended_at=None,
                last_checkpoint_at=self._published_stamp(started),
            )
            job = f"Slurm job {entry['slurm_job_id']}" if entry.get("slurm_job_id") else f"pid {entry.get('pid')}"
            log.warning(
                "piece %s (%s on %s) was killed; the run goes on from step %s",
                *(entry["piece"], job, entry.get("host"), entry["reached_step"]),
            )
        write_json_atomically(listed, self.folder / PIECES_FILE)


class CheckpointMirroring:
    """Copies each new complete checkpoint on scratch to shared storage, whole, newest only: called by
    a task after it saves (`mirror_newest`), or from a thread that looks every `poll_seconds` while a
    program runs that saves on its own (`watching`), and once more when it ends."""

    def __init__(self, run: RunCheckpoints, local_folder: Path, restored_step: int | None = None):
        self.run, self.local_folder = run, local_folder
        self.failure: BaseException | None = None  # the watching thread's, once a copy failed
        self.mirrored_step = restored_step  # a restored checkpoint is on shared storage already

    def mirror_newest(self) -> Path | None:
        """The newest complete checkpoint on scratch, copied if it is new; None if there is none new."""
        newest = newest_complete_checkpoint(self.local_folder, self.run.marker)
        if newest is None or (self.mirrored_step is not None and step_of(newest) <= self.mirrored_step):
            return None
        try:
            self.run.mirror(newest)
        except (StagingError, OSError):
            if newest.exists():
                raise
            return None  # the task pruned it while it was copied: a newer one is there
        self.mirrored_step = step_of(newest)
        log.info("checkpoint %s saved to %s", newest.name, self.run.folder)
        return newest

    @contextlib.contextmanager
    def watching(self, poll_seconds: float = 1.0) -> Iterator[CheckpointMirroring]:
        """Mirror from a thread while the block runs. A copy that fails (a full disk) ends the
        watching and is raised when the block ends; until then `failure` holds it, for the caller
        to stop the program that would train on past what it can save."""
        done = threading.Event()
        self.failure = None

        def watch() -> None:
            while not done.wait(poll_seconds):
                try:
                    self.mirror_newest()
                except BaseException as error:  # raised in the job's thread when the block ends
                    self.failure = error
                    return

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            done.set()
            thread.join()
        if self.failure is not None:
            raise self.failure
        self.mirror_newest()


# A model's weight files, whose size (times 3: the weights and AdamW's two moments, as a trainer
# saves them) estimates a checkpoint before one is saved; a few saved ones, once there are.
WEIGHT_SUFFIXES = {".safetensors", ".bin", ".pt", ".pth"}
CHECKPOINTS_SAMPLED = 8


def checkpoint_size(root: Path, model: Path | None) -> tuple[int, str] | None:
    """The bytes one checkpoint of the grid under `root` takes, and where the figure comes from: the
    largest of a few checkpoints saved there, or else 3 times the weight files of `model` (a folder);
    None where neither exists (a `command` task's first run)."""
    saved = []
    for checkpoint in root.glob("*/checkpoint-*"):
        if CHECKPOINT_NAME.fullmatch(checkpoint.name) and checkpoint.is_dir():
            saved.append(tree_bytes(checkpoint))
            if len(saved) == CHECKPOINTS_SAMPLED:
                break
    if saved:
        return max(saved), "the largest saved"
    weights = sum(
        path.stat().st_size
        for path in (model.iterdir() if model and model.is_dir() else ())
        if path.suffix in WEIGHT_SUFFIXES
    )
    return (3 * weights, "3 x the model's weights: they and the optimizer's two moments") if weights else None


def space_warning(root: Path, runs: int, keep: int, model: Path | None) -> str | None:
    """A line where the checkpoints of `runs` runs still to train (`keep` each, kept until the workflow
    succeeds) may not fit in the free space of `root`'s filesystem; None where they fit, or where
    no size is known yet."""
    size = checkpoint_size(root, model)
    if not runs or size is None:
        return None
    needed = size[0] * keep * runs
    existing = next(path for path in (root.absolute(), *root.absolute().parents) if path.exists())
    free = shutil.disk_usage(existing).free
    if needed <= free:
        return None
    mount_point, kind = filesystem_of(existing)
    return (
        f"the checkpoints of the {runs} run(s) still to train may take {needed / 1e9:.1f} GB in {root.absolute()} "
        f"({keep} per run, kept until the workflow succeeds, of {size[0] / 1e6:.0f} MB each: {size[1]}), and its "
        f"filesystem ({kind} at {mount_point}) has {free / 1e9:.1f} GB free. A job that finds no room for its next "
        "checkpoint fails; free space there, lower checkpointing.keep, or train the grid in parts"
    )


def this_process() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "slurm_job_id": os.environ.get("SLURM_JOB_ID")}


def outcome_of(error: BaseException) -> str:
    """How a piece that `error` ended ended, in one line (the traceback and any output the error
    quotes are in the piece's log): "killed by SIGTERM" where a signal ended it before it could
    pause (signals.exit_on_sigterm: a node failure's cancellation, a scancel while it restored)."""
    code = error.code if isinstance(error, SystemExit) else None
    if isinstance(code, int) and code - 128 in {number.value for number in signal.Signals}:
        return f"killed by {signal.Signals(code - 128).name}"
    return f"{type(error).__name__}: {error}".splitlines()[0]


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
