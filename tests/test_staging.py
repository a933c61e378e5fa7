import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from scratchflow import staging
from scratchflow.files import HOST, NoSpace, read_json, remove_leftovers, write_json_atomically, written_whole
from scratchflow.snakemake_adapter import keep_job_variables
from scratchflow.staging import (
    StagingError,
    archive_dataset,
    copy_whole,
    resolve_scratch_root,
    scratch_directory,
    stage_in,
)

DATASET = {"name": "toy", "format": "folder"}


def file_sha256(path: Path) -> str:
    """The file's sha256, by Python's own hashlib (not the code under test)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def raw(tmp_path) -> Path:
    root = tmp_path / "raw" / "toy"
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for i in range(20):
            (root / label / f"{i}.txt").write_text(f"{label} example {i}\n" * (i + 1))
    return root


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def a_dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_archive_is_one_reproducible_tar_with_its_manifest(raw, tmp_path):
    first = archive_dataset({**DATASET, "path": str(raw)}, tmp_path / "1.tar", tmp_path / "1.json")
    second = archive_dataset({**DATASET, "path": str(raw)}, tmp_path / "2.tar", tmp_path / "2.json")
    assert first["sha256"] == second["sha256"] == file_sha256(tmp_path / "1.tar")
    assert first["files"] == 40
    assert first["bytes"] == sum(len(content) for content in tree(raw).values())
    assert read_json(tmp_path / "1.json") == first
    listing = subprocess.run(["tar", "-tf", tmp_path / "1.tar"], capture_output=True, text=True, check=True).stdout
    assert "toy/a/0.txt" in listing.split()


def test_a_failed_write_leaves_the_old_file_and_no_partial(tmp_path):
    target = tmp_path / "summary.tsv"
    target.write_text("old")
    with pytest.raises(RuntimeError), written_whole(target) as partial:
        partial.write_text("half of the new")
        raise RuntimeError("killed while writing")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["summary.tsv"]


def test_tar_errors_are_reported_and_leave_no_archive(raw, tmp_path, monkeypatch):
    monkeypatch.setattr(staging, "REPRODUCIBLE_TAR_OPTIONS", ("--no-such-option",))
    with pytest.raises(StagingError, match=r"tar failed.*no-such-option"):
        archive_dataset({**DATASET, "path": str(raw)}, tmp_path / "x.tar", tmp_path / "x.json")
    assert os.listdir(tmp_path) == ["raw"], "no archive, manifest or partial"


def test_stage_in_verifies_and_extracts_the_same_files(raw, tmp_path):
    archive_dataset({**DATASET, "path": str(raw)}, tmp_path / "toy.tar", tmp_path / "toy.json")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    staged = stage_in(tmp_path / "toy.tar", tmp_path / "toy.json", scratch)
    assert tree(staged) == tree(raw)
    assert not (scratch / "toy.tar").exists(), "the copied archive is removed once extracted"


def corrupt(archive: Path, manifest: Path) -> None:
    with open(archive, "r+b") as file:
        file.seek(2000)
        file.write(b"corrupt")


def truncate(archive: Path, manifest: Path) -> None:
    os.truncate(archive, archive.stat().st_size // 2)


def swap_manifest(archive: Path, manifest: Path) -> None:
    """The manifest of another version of the data beside this archive."""
    record = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**record, "sha256": "0" * 64}))


@pytest.mark.parametrize("damage", [corrupt, truncate, swap_manifest])
def test_an_archive_that_does_not_match_its_manifest_stops_and_leaves_nothing_extracted(damage, raw, tmp_path):
    archive_dataset({**DATASET, "path": str(raw)}, tmp_path / "toy.tar", tmp_path / "toy.json")
    damage(tmp_path / "toy.tar", tmp_path / "toy.json")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with pytest.raises(StagingError, match="checksum mismatch"):
        stage_in(tmp_path / "toy.tar", tmp_path / "toy.json", scratch)
    assert not (scratch / "data").exists()


@pytest.fixture
def uneven(tmp_path) -> Path:
    """A dataset of files from 100 bytes to 30 KB, in three label folders."""
    root = tmp_path / "raw" / "toy"
    for index in range(30):
        folder = root / f"label{index % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{index:02d}.txt").write_text(f"words of example {index} " * (4 + index * 60))
    return root


def decompressed_sha256(part: Path) -> str:
    if part.suffix != ".zst":
        return file_sha256(part)
    stream = subprocess.run(["zstd", "-dc", str(part)], capture_output=True, check=True).stdout
    return hashlib.sha256(stream).hexdigest()


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_a_dataset_in_parts_is_balanced_by_bytes_verified_per_part_and_staged_whole(compression, uneven, tmp_path):
    dataset = {**DATASET, "path": str(uneven), "archive_parts": 3, "compression": compression}
    suffix = {"none": ".tar", "zstd": ".tar.zst"}[compression]
    first = tmp_path / "archives" / f"toy{suffix}"
    record = archive_dataset(dataset, first, tmp_path / "archives" / "toy.manifest.json")
    assert sorted(os.listdir(first.parent)) == sorted(
        ["toy.manifest.json", f"toy{suffix}", f"toy.2{suffix}", f"toy.3{suffix}"]
    )
    parts = record["parts"]
    assert sum(part["files"] for part in parts) == 30 and sum(part["bytes"] for part in parts) == record["bytes"]
    largest_file = max(len(content) for content in tree(uneven).values())
    assert all(abs(part["bytes"] - record["bytes"] / 3) <= largest_file for part in parts)
    assert [decompressed_sha256(first.with_name(part["file"])) for part in parts] == [part["sha256"] for part in parts]
    if compression == "zstd":
        assert record["archive_bytes"] < record["bytes"] / 3
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    assert tree(stage_in(first, first.with_name("toy.manifest.json"), scratch)) == tree(uneven)


def test_a_small_dataset_keeps_one_archive(raw, tmp_path):
    record = archive_dataset(
        {**DATASET, "path": str(raw), "archive_parts": "auto"}, tmp_path / "toy.tar", tmp_path / "toy.json"
    )
    assert [part["file"] for part in record["parts"]] == ["toy.tar"]
    assert record["sha256"] == record["parts"][0]["sha256"] == file_sha256(tmp_path / "toy.tar")


def test_archiving_again_in_fewer_parts_leaves_no_old_part(uneven, tmp_path):
    for parts in (4, 2):
        archive_dataset(
            {**DATASET, "path": str(uneven), "archive_parts": parts}, tmp_path / "toy.tar", tmp_path / "toy.json"
        )
    assert sorted(os.listdir(tmp_path)) == ["raw", "toy.2.tar", "toy.json", "toy.tar"]


def missing(part: Path, manifest: Path) -> None:
    part.unlink()


@pytest.mark.parametrize("damage", [corrupt, missing])
def test_a_damaged_part_stops_stage_in_naming_it_and_leaves_nothing_extracted(damage, uneven, tmp_path):
    archive_dataset({**DATASET, "path": str(uneven), "archive_parts": 3}, tmp_path / "toy.tar", tmp_path / "toy.json")
    damage(tmp_path / "toy.2.tar", tmp_path / "toy.json")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with pytest.raises(StagingError, match=rf"{tmp_path / 'toy.2.tar'}.*delete {tmp_path / 'toy.json'}"):
        stage_in(tmp_path / "toy.tar", tmp_path / "toy.json", scratch)
    assert not (scratch / "data").exists()


def test_parts_are_extracted_at_once_as_many_as_the_job_has_cpus(uneven, tmp_path, monkeypatch):
    archive_dataset({**DATASET, "path": str(uneven), "archive_parts": 5}, tmp_path / "toy.tar", tmp_path / "toy.json")
    running, most, started = [], [], []
    extract_part = staging._extract_part
    lock = threading.Lock()
    # The first three parts meet here: it opens only if three are extracted at once (no sleep to race).
    three_at_once = threading.Barrier(3, timeout=60)

    def watched(*args):
        with lock:
            running.append(args[0])
            most.append(len(running))
            started.append(args[0])
            among_first_three = len(started) <= 3
        if among_first_three:
            three_at_once.wait()
        try:
            return extract_part(*args)
        finally:
            with lock:
                running.remove(args[0])

    monkeypatch.setattr(staging, "_extract_part", watched)
    monkeypatch.setattr(staging, "available_cpus", lambda: 3)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    assert tree(stage_in(tmp_path / "toy.tar", tmp_path / "toy.json", scratch)) == tree(uneven)
    assert max(most) == 3


def test_scratch_too_small_for_the_data_fails_before_copying_with_the_figures(tmp_path, small_disk):
    raw = tmp_path / "raw"
    for index in range(40):
        (raw / "label").mkdir(parents=True, exist_ok=True)
        (raw / "label" / f"{index}.txt").write_bytes(os.urandom(8192))
    archive_dataset({**DATASET, "path": str(raw)}, tmp_path / "big.tar", tmp_path / "big.json")
    with pytest.raises(StagingError, match=r"has 0\.3 MB free, but staging the dataset needs 0\.5 MB"):
        stage_in(tmp_path / "big.tar", tmp_path / "big.json", small_disk)
    assert list(small_disk.iterdir()) == []


def test_an_archive_that_fills_its_filesystem_fails_with_the_figures_and_leaves_no_partial(tmp_path, small_disk):
    """archives/ on a full filesystem (a project space over quota): one line with the folder, its
    filesystem, the bytes needed and free, instead of Python's bare "[Errno 28]"; no partial stays."""
    raw = tmp_path / "raw"
    (raw / "label").mkdir(parents=True)
    for index in range(40):
        (raw / "label" / f"{index}.txt").write_bytes(os.urandom(8192))
    with pytest.raises(NoSpace, match=r"no space in .*/small-disk for writing big\.tar there: it needs 0\.3 MB"):
        archive_dataset({**DATASET, "path": str(raw)}, small_disk / "big.tar", small_disk / "big.json")
    assert list(small_disk.iterdir()) == []


def test_a_checkpoint_pruned_while_its_copy_fills_the_disk_is_said_to_need_what_it_held(
    tmp_path, small_disk, monkeypatch
):
    """The task prunes the checkpoint whose copy fills the disk: the line gives the bytes it held
    when the copy began (it said 0.0 MB, measured after the pruning), and no partial stays."""
    source = tmp_path / "checkpoint-40"
    source.mkdir()
    (source / "state.pt").write_bytes(os.urandom(400_000))
    run = subprocess.run

    def copy_then_prune(command, **options):
        result = run(command, **options)
        shutil.rmtree(source, ignore_errors=True)
        return result

    monkeypatch.setattr(staging.subprocess, "run", copy_then_prune)
    with pytest.raises(NoSpace, match=r"for copying checkpoint-40 there: it needs 0\.4 MB and its filesystem"):
        copy_whole(source, small_disk / "checkpoint-40")
    assert os.listdir(small_disk) == []


def test_a_result_written_on_a_full_filesystem_says_so_and_keeps_the_old_one(small_disk):
    """Any whole-or-absent write (a run's record, its metrics, its predictions) on a full
    filesystem: the line with the folder and its free space; the file before it stays as it was."""
    result = small_disk / "metrics.json"
    write_json_atomically({"accuracy": 0.5}, result)
    with pytest.raises(
        NoSpace, match=r"for writing metrics\.json there: its filesystem \(tmpfs at .*\) has 0\.\d MB free"
    ):
        write_json_atomically({"predictions": "x" * 400_000}, result)
    assert read_json(result) == {"accuracy": 0.5}
    assert os.listdir(small_disk) == ["metrics.json"], "no partial"


def test_copy_whole_replaces_the_destination_whole(tmp_path):
    source = tmp_path / "scratch" / "model"
    source.mkdir(parents=True)
    (source / "weights").write_text("new")
    destination = tmp_path / "shared" / "model"
    destination.mkdir(parents=True)
    (destination / "stale").write_text("old")
    copy_whole(source, destination)
    assert tree(destination) == {"weights": b"new"}
    assert os.listdir(destination.parent) == ["model"], "no partial or superseded copy is left"


def test_a_failed_sync_leaves_no_result(tmp_path):
    destination = tmp_path / "shared" / "model"
    with pytest.raises(StagingError, match="rsync failed"):
        copy_whole(tmp_path / "does-not-exist", destination)
    assert not destination.exists()


def copy_whole_in_a_process(tmp_path: Path, before: str = "") -> tuple[subprocess.Popen, Path, Path]:
    """copy_whole of 50 MB (200 random files) in a process group of its own, running `before` first;
    returned once its rsync is writing the partial copy: (the process, the source, the destination)."""
    source = tmp_path / "big"
    source.mkdir()
    for i in range(200):
        (source / f"{i}.bin").write_bytes(os.urandom(256 * 1024))
    destination = tmp_path / "shared" / "big"
    code = (
        f"{before}\n"
        "from pathlib import Path\n"
        "from scratchflow.staging import copy_whole\n"
        f"copy_whole(Path({str(source)!r}), Path({str(destination)!r}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "scripts")}
    syncing = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.monotonic() + 30
    while not list(destination.parent.glob(".big.partial*")) and time.monotonic() < deadline:
        time.sleep(0.005)
    return syncing, source, destination


def test_a_sync_killed_midway_never_looks_finished(tmp_path):
    """SIGKILL a process in the middle of copy_whole: the destination is absent, and the partial
    copy it left is removed by the next sync of the same destination."""
    syncing, source, destination = copy_whole_in_a_process(tmp_path)
    os.killpg(syncing.pid, signal.SIGKILL)
    syncing.communicate()
    assert list(destination.parent.glob(".big.partial*")), "the kill should have hit mid-copy"
    assert not destination.exists()
    copy_whole(source, destination)
    assert sorted(os.listdir(destination.parent)) == ["big"]
    assert len(os.listdir(destination)) == 200


@pytest.mark.parametrize("stop", [signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGTERM])
def test_a_sync_that_a_stop_signal_reaches_is_renamed_into_place_only_whole(stop, tmp_path):
    """Slurm signals every process of a job: any configurable stop signal (its wall-time warning,
    USR2, HUP) or scancel's TERM reaches the rsync of a checkpoint being mirrored. rsync ends on each,
    and on USR2 with status 0, its copy cut short. The job (here ignoring the signal, as a job step
    does until its trainer listens) is saving its progress then: the copy goes on, and what is
    renamed into place is the whole source."""
    before = f"import logging, signal\nsignal.signal({int(stop)}, signal.SIG_IGN)\nlogging.basicConfig()"
    syncing, source, destination = copy_whole_in_a_process(tmp_path, before)
    os.killpg(syncing.pid, stop)
    _, errors = syncing.communicate(timeout=60)
    assert syncing.returncode == 0, errors
    assert "is not whole" in errors, "the signal should have hit mid-copy"
    assert sorted(os.listdir(destination.parent)) == ["big"]
    assert tree(destination) == tree(source)


def test_a_copy_that_stays_incomplete_fails_naming_what_is_missing(tmp_path, monkeypatch):
    """A copying tool that keeps reporting success without copying everything (here rsync told to
    leave one file out): nothing is renamed into place, and the error names the missing file."""
    source = tmp_path / "checkpoint-40"
    source.mkdir()
    for name in ("model.safetensors", "optimizer.pt", "trainer_state.json"):
        (source / name).write_bytes(os.urandom(1024))
    monkeypatch.setattr(staging, "RSYNC_OPTIONS", (*staging.RSYNC_OPTIONS, "--exclude=optimizer.pt"))
    destination = tmp_path / "shared" / "checkpoint-40"
    with pytest.raises(StagingError, match=r"optimizer\.pt: missing"):
        copy_whole(source, destination)
    assert not destination.exists()


def test_a_source_removed_while_it_is_copied_fails_at_once_and_leaves_no_partial(tmp_path, monkeypatch):
    """A task that prunes the checkpoint being mirrored: no retry can make that copy whole, and
    retrying cost the checkpoint watcher its next chance to publish the newer one."""
    source = tmp_path / "checkpoint-40"
    source.mkdir()
    (source / "state.pt").write_bytes(os.urandom(1024))
    copies, run = [], subprocess.run

    def copy_then_prune(command, **options):
        copies.append(command)
        result = run(command, **options)
        shutil.rmtree(source)
        return result

    monkeypatch.setattr(staging.subprocess, "run", copy_then_prune)
    destination = tmp_path / "shared" / "checkpoint-40"
    destination.parent.mkdir()
    with pytest.raises(StagingError, match="was removed while it was copied"):
        copy_whole(source, destination)
    assert len(copies) == 1, "no copy again"
    assert os.listdir(destination.parent) == []


def test_scratch_is_removed_when_the_job_fails(tmp_path):
    with pytest.raises(RuntimeError), scratch_directory(str(tmp_path), "train-abc") as scratch:
        (scratch / "data").write_text("x")
        raise RuntimeError("training failed")
    assert os.listdir(tmp_path) == []


def test_scratch_is_removed_when_the_job_is_terminated(tmp_path):
    """Snakemake and Slurm cancel jobs with SIGTERM: the job's `finally` must still run."""
    code = (
        "import time\n"
        "from scratchflow.signals import exit_on_sigterm\n"
        "from scratchflow.staging import scratch_directory\n"
        "exit_on_sigterm()\n"
        f"with scratch_directory({str(tmp_path)!r}, 'train-abc') as scratch:\n"
        "    (scratch / 'ready').write_text('')\n"
        "    time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "scripts")}
    job = subprocess.Popen([sys.executable, "-c", code], env=env)
    deadline = time.monotonic() + 30
    while not list(tmp_path.glob("*/ready")) and time.monotonic() < deadline:
        time.sleep(0.05)
    job.send_signal(signal.SIGTERM)
    assert job.wait(timeout=30) == 128 + signal.SIGTERM
    assert os.listdir(tmp_path) == []


def test_scratch_left_by_jobs_that_died_here_is_removed_by_the_next_job_whatever_its_run(tmp_path):
    """A killed job's retry, or any job on a node that was lost with a persistent scratch on it
    (Edinburgh's /disk/scratch): the next scratchflow job there removes what dead jobs left; a
    living job's scratch, and what is not scratchflow's, stay."""
    leftover = tmp_path / f"scratchflow-train-abc@{HOST}@{a_dead_pid()}@x1"
    leftover.mkdir()
    other_run = tmp_path / f"scratchflow-predict-def@{HOST}@{a_dead_pid()}@x3"
    other_run.mkdir()
    living = tmp_path / f"scratchflow-train-abc@{HOST}@{os.getpid()}@x2"
    living.mkdir()
    not_ours = tmp_path / f"other-tool@{HOST}@{a_dead_pid()}@x4"
    not_ours.mkdir()
    with scratch_directory(str(tmp_path), "train-xyz"):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([living.name, not_ours.name])


def test_leftovers_of_other_hosts_are_not_touched(tmp_path):
    elsewhere = tmp_path / f"scratchflow-train-abc@another-node@{a_dead_pid()}@x"
    elsewhere.mkdir()
    assert remove_leftovers(tmp_path) == []
    assert elsewhere.exists()


def test_scratch_root_expands_job_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_TMPDIR", str(tmp_path))
    assert resolve_scratch_root("$SLURM_TMPDIR") == tmp_path
    monkeypatch.delenv("SLURM_TMPDIR")
    with pytest.raises(StagingError, match="SLURM_TMPDIR"):
        resolve_scratch_root("$SLURM_TMPDIR/x")


def test_a_slurm_variable_the_job_step_removed_is_found_where_the_jobs_snakemake_kept_it(tmp_path):
    """A several-node job runs the rule in the batch step, after the plugin's job step removed every
    SLURM_* variable from its environment; its Snakemake, which read the workflow, kept them."""
    batch_step = {"SLURM_TMPDIR": str(tmp_path / "job_7"), "SLURM_JOB_ID": "7", "HOME": "/home/me"}
    keep_job_variables(batch_step)
    rule = {name: value for name, value in batch_step.items() if not name.startswith("SLURM_")}  # the job step
    assert resolve_scratch_root("$SLURM_TMPDIR", rule) == tmp_path / "job_7"
    assert resolve_scratch_root("${SLURM_TMPDIR}/x", {**rule, "SLURM_TMPDIR": "/srun"}) == Path("/srun/x")


@pytest.mark.parametrize("parts", [1, 3])
def test_split_files_travel_in_one_archive_whatever_their_names(parts, tmp_path):
    """Splits from different folders, with the same base name and characters tar's renaming treats
    specially, arrive as <name>/train, <name>/validation, <name>/test."""
    sources = {
        "train": tmp_path / "a.b" / "data",
        "validation": tmp_path / "x,y" / "dev[1].csv",
        "test": tmp_path / "c" / "data",
    }
    for name, path in sources.items():
        if path.suffix:
            path.parent.mkdir(parents=True)
            path.write_text(f"{name}\n")
        else:
            (path / "cat").mkdir(parents=True)
            (path / "cat" / "1.txt").write_text(f"{name}\n")
    splits = {name: str(path) for name, path in sources.items()}
    dataset = {"name": "bench", "format": "folder", "splits": splits, "archive_parts": parts}
    record = archive_dataset(dataset, tmp_path / "bench.tar", tmp_path / "bench.json")
    assert record["files"] == 3 and record["root"] == "bench" and len(record["parts"]) == parts
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    staged = stage_in(tmp_path / "bench.tar", tmp_path / "bench.json", scratch)
    assert (staged / "train" / "cat" / "1.txt").read_text() == "train\n"
    assert (staged / "validation").read_text() == "validation\n"
    assert (staged / "test" / "cat" / "1.txt").read_text() == "test\n"
    assert sorted(path.name for path in staged.iterdir()) == ["test", "train", "validation"]
    assert [path.name for path in (scratch / "data").iterdir()] == ["bench"]
