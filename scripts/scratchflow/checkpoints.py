"""A run's training checkpoints on shared storage: `CheckpointStore` (and `CheckpointMirroring`,
which copies each new one a task saves on scratch into it).

The run's shared folder, `checkpoints/<run_id>/`, holds three things, each with one owner: its
checkpoints (here), its lease (scratchflow.lease: which run the folder is for, which job trains it)
and its ledger (scratchflow.ledger: the pieces that trained it, its progress).

Checkpoints live outside the rule's declared outputs (Snakemake deletes the outputs of failed jobs)
and appear there only whole: each is written to scratch by the task and then copied in with
`staging.copy_whole`. A checkpoint is a directory `checkpoint-<step>` and is complete once it holds
the task's marker file (written last). A checkpoint written by several training processes holds
`world.json` (how many) and is assembled from every node's part under a hidden name before it gets
its own. Each checkpoint carries `contents.json`, its files' sizes and sha256, written as it is
published: a job verifies the newest before resuming from it, and sets a damaged one aside
(`checkpoint-<step>.damaged`, with `damage.txt` saying what was wrong) to resume from the one
before. `published.jsonl` has a line per checkpoint published: when a piece that ended unfinished
last saved (scratchflow.accounting counts what it trained after as lost), and by which term.

A store writes only through its run's gate (scratchflow.lease.RunFolder): held by a piece, each
write (a publication with the pruning after it, a checkpoint set aside) happens only while no newer
piece holds the run. Each checkpoint records the term that published it in its contents.json, and a
reader ignores one that an older term published after a newer term began (`newest`, `newest_intact`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scratchflow.files import (
    file_sha256,
    filesystem_of,
    read_json,
    require_free_space,
    tree_bytes,
    write_json_atomically,
)
from scratchflow.lease import Publication, RunFolder
from scratchflow.staging import StagingError, copy_whole

log = logging.getLogger(__name__)

CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")
PUBLISHED_FILE = "published.jsonl"


# In a checkpoint written by several processes: their number (absent: one process wrote it).
WORLD_FILE = "world.json"
# In every checkpoint: its other files' sizes and sha256 (absent in one written before scratchflow 0.2).
CONTENTS_FILE = "contents.json"
DAMAGED_SUFFIX = ".damaged"
DAMAGE_FILE = "damage.txt"
# A checkpoint an older term published after a newer term began: set aside, never resumed from.
STALE_SUFFIX = ".stale"


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


def pruned_since(checkpoint: Path, folder: Path, marker: str) -> bool:
    """Whether the task has removed `checkpoint` from `folder`, or begun to, since it was the newest
    complete one there: it lacks its marker now, or a newer one is there (a task removes its old
    checkpoints once it has saved a new one, as the Trainer's save_total_limit does, and may remove
    the marker last)."""
    if not (checkpoint / marker).is_file():
        return True
    newer = (CHECKPOINT_NAME.fullmatch(entry.name) for entry in folder.iterdir())
    return any(match is not None and int(match.group(1)) > step_of(checkpoint) for match in newer)


def step_of(checkpoint: Path) -> int:
    named = CHECKPOINT_NAME.fullmatch(checkpoint.name)
    if named is None:
        raise ValueError(f"{checkpoint} is not named checkpoint-<step>")
    return int(named.group(1))


def contents_of(checkpoint: Path, term: int | None = None) -> dict:
    """What a checkpoint's contents.json holds: each file of `checkpoint` with its size and sha256,
    and the term of the piece that publishes it."""
    files = {
        str(path.relative_to(checkpoint)): {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
        for path in sorted(checkpoint.rglob("*"))
        if path.is_file() and path.name != CONTENTS_FILE
    }
    return {"files": files, "term": term}


def write_contents(checkpoint: Path, term: int | None = None) -> None:
    """A checkpoint's contents.json (`contents_of`), on scratch, where the task saved it."""
    write_json_atomically(contents_of(checkpoint, term), checkpoint / CONTENTS_FILE)


def term_of(checkpoint: Path) -> int | None:
    """The term that published `checkpoint` (None: unknown, or no piece held the run)."""
    try:
        contents = read_json(checkpoint / CONTENTS_FILE)
    except (OSError, ValueError):
        return None
    return contents.get("term", contents.get("epoch"))  # "epoch": as main wrote it between 0.3.0 and 0.4.0


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


@dataclass(frozen=True)
class CheckpointStore:
    """The checkpoints of one run on shared storage (in `run_folder`, through which it writes): the
    newest complete (and intact) one, restored to scratch; each new one published whole; all of them
    removed once the run is done. `marker` is the file a task writes last into a checkpoint."""

    run_folder: RunFolder
    marker: str
    keep: int = 2

    @property
    def folder(self) -> Path:
        return self.run_folder.path

    @property
    def term(self) -> int | None:
        return self.run_folder.term

    def complete(self) -> list[tuple[int, Path]]:
        return complete_checkpoints(self.folder, self.marker)

    def newest(self) -> Path | None:
        """The newest complete checkpoint a reader may trust (`too_late`)."""
        return next(
            (checkpoint for _step, checkpoint in reversed(self.complete()) if not self.too_late(checkpoint)), None
        )

    def newest_step(self) -> int | None:
        newest = self.newest()
        return step_of(newest) if newest else None

    def too_late(self, checkpoint: Path) -> str | None:
        """Why `checkpoint` is not to be trusted: an older term published it after a newer term
        began (scratchflow.lease); None to trust it. Costs a listing where the run had one term."""
        terms = self.run_folder.terms_listed()
        if len(terms) < 2:
            return None
        term = term_of(checkpoint)
        listed = self._published_lines()
        mine = [line for line in listed if line["checkpoint"] == checkpoint.name and _term(line) == term]
        return self.run_folder.published_too_late(
            term, mine[-1]["at"] if mine else None, self.run_folder.terms_began(terms)
        )

    def newest_intact(self) -> tuple[Path | None, dict[str, str]]:
        """The newest complete checkpoint whose files are those it was saved with and that its term
        published in time, and those newer that were set aside, by name, with why: a damaged one
        (renamed checkpoint-<step>.damaged, with damage.txt), one published too late
        (checkpoint-<step>.stale, likewise); each said."""
        aside: dict[str, str] = {}
        for _step, checkpoint in reversed(self.complete()):
            late = self.too_late(checkpoint)
            damage = None if late else checkpoint_damage(checkpoint)
            if late is None and damage is None:
                return checkpoint, aside
            suffix = STALE_SUFFIX if late else DAMAGED_SUFFIX
            with self.run_folder.publishing() as publication:
                moved = checkpoint.with_name(checkpoint.name + suffix)
                if moved.exists():
                    publication.remove(moved)
                publication.rename(checkpoint, moved)
                publication.write_text((late or damage or "") + "\n", moved / DAMAGE_FILE)
            aside[checkpoint.name] = late or f"damaged: {damage}"
            log.warning(
                "%s %s: set aside as %s; resuming from the one before",
                *(checkpoint, late or f"is damaged ({damage})", moved.name),
            )
        return None, aside

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

    def mirroring(self, local_folder: Path, restored_step: int | None = None, **then: Any) -> CheckpointMirroring:
        """The service that copies each new complete checkpoint a task writes into `local_folder`
        (on scratch) to this shared folder; `restored_step`: the step restored from here, if any;
        `then`: CheckpointMirroring's `with_each` and `published`."""
        return CheckpointMirroring(self, local_folder, restored_step, **then)

    def mirror(self, local_checkpoint: Path, with_it: Callable[[Publication], None] | None = None) -> Path:
        """Copy a checkpoint the task just wrote on scratch into the shared folder, whole or not at
        all, then drop all but the newest `keep` complete ones. `with_it`: what goes to shared storage
        in the same publication, just before it is renamed into place."""
        destination = self.folder / local_checkpoint.name
        write_contents(local_checkpoint, self.term)
        publication = self.run_folder.publish_copy(local_checkpoint, destination, with_it)
        self._after_publication(destination, publication)
        return destination

    def _after_publication(self, checkpoint: Path, publication: Publication) -> None:
        """Its line in published.jsonl, and all but the newest `keep` complete checkpoints removed,
        never the one just published (a newer one may be a stale term's), in its publication."""
        publication.append_line(
            {"checkpoint": checkpoint.name, "at": time.time(), "term": self.term}, self.folder / PUBLISHED_FILE
        )
        for _step, old in self.complete()[: -self.keep]:
            if old != checkpoint:
                publication.remove(old)

    def last_published_since(self, since: float) -> float | None:
        """When the newest checkpoint published at or after `since` was published (None: none was)."""
        times = [line["at"] for line in self.published()]
        return max((at for at in times if at >= since), default=None)

    def last_published_by(self, term: int) -> tuple[int, float] | None:
        """The step of the last checkpoint the piece of `term` published, and when (None: none)."""
        mine = [line for line in self.published() if _term(line) == term]
        return (step_of(Path(mine[-1]["checkpoint"])), mine[-1]["at"]) if mine else None

    def published(self) -> list[dict]:
        """published.jsonl's lines, oldest first; a line an older term wrote after a newer term
        began is left out (scratchflow.lease: readers check the token)."""
        listed = self._published_lines()
        if len({_term(line) for line in listed}) < 2:
            return listed
        began = self.run_folder.terms_began(self.run_folder.terms_listed())
        return [line for line in listed if not self.run_folder.published_too_late(_term(line), line["at"], began)]

    def _published_lines(self) -> list[dict]:
        try:
            lines = (self.folder / PUBLISHED_FILE).read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    def assembly(self, name: str, tag: str) -> Path:
        """Where the parts of checkpoint `name`, written by several processes on several nodes, are
        gathered before `publish` gives it its name. `tag` (the launching job's owner tag, the same
        on every node) lets a later job remove what a killed one left."""
        return self.folder / f".{name}.assembling{tag}"

    def assemble_part(self, local_checkpoint: Path, assembly: Path) -> None:
        """One node's part of a checkpoint of several processes, copied into its hidden assembly
        folder (no reader looks there; `publish` looks at the fence before it gives it its name)."""
        self.run_folder.unpublished().copy_tree_into(local_checkpoint, assembly)

    def publish(self, assembly: Path, world_size: int, with_it: Callable[[Publication], None] | None = None) -> Path:
        """Give an assembled checkpoint its name, with the number of processes that wrote it, then
        drop all but the newest `keep` complete ones. `with_it`: as `mirror`'s."""
        destination = self.folder / assembly.name[1:].split(".assembling")[0]
        assembling = self.run_folder.unpublished()
        assembling.write_json({"world_size": world_size}, assembly / WORLD_FILE)
        assembling.write_json(contents_of(assembly, self.term), assembly / CONTENTS_FILE)
        with self.run_folder.publishing() as publication:
            if with_it is not None:
                with_it(publication)
            if destination.exists():
                publication.remove(destination)
            publication.rename(assembly, destination)
            self._after_publication(destination, publication)
        return destination

    def remove_all(self) -> None:
        """Remove a finished run's checkpoints: its results are on shared storage now."""
        if self.folder.is_dir():
            with self.run_folder.publishing() as publication:
                publication.remove(self.folder)


class CheckpointMirroring:
    """Copies each new complete checkpoint on scratch to shared storage, whole, newest only: called by
    a task after it saves (`mirror_newest`), or from a thread that looks every `poll_seconds` while a
    program runs that saves on its own (`watching`), and once more when it ends."""

    def __init__(
        self,
        store: CheckpointStore,
        local_folder: Path,
        restored_step: int | None = None,
        with_each: Callable[[Publication], None] | None = None,
        published: Callable[[int, float], None] | None = None,
    ):
        self.store, self.local_folder = store, local_folder
        self.failure: BaseException | None = None  # the watching thread's, once a copy failed
        self.mirrored_step = restored_step  # a restored checkpoint is on shared storage already
        # Called just before each checkpoint is renamed into place, in its publication: what must be
        # on shared storage once it is there.
        self.with_each = with_each
        # Called once each is there, with its step and when its publication began (time.monotonic).
        self.published = published

    def mirror_newest(self) -> Path | None:
        """The newest complete checkpoint on scratch, copied if it is new; None if there is none new."""
        newest = newest_complete_checkpoint(self.local_folder, self.store.marker)
        if newest is None or (self.mirrored_step is not None and step_of(newest) <= self.mirrored_step):
            return None
        started = time.monotonic()
        try:
            self.store.mirror(newest, self.with_each)
        except (StagingError, FileNotFoundError):  # what a source removed mid-copy gives (never NoSpace)
            if not pruned_since(newest, self.local_folder, self.store.marker):
                raise
            log.info("%s was removed by the task while it was copied: the newer one is copied next", newest.name)
            return None
        self.mirrored_step = step_of(newest)
        log.info("checkpoint %s saved to %s", newest.name, self.store.folder)
        if self.published is not None:
            self.published(self.mirrored_step, started)
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


def _term(line: dict) -> int | None:
    """A published.jsonl line's term ("epoch" as main wrote it between 0.3.0 and 0.4.0)."""
    return line.get("term", line.get("epoch"))
