import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest
from scratchflow import checkpoints, lease
from scratchflow import ledger as ledger_module
from scratchflow.checkpoints import CheckpointStore
from scratchflow.files import NoSpace
from scratchflow.lease import RunFolder, RunLease, this_process
from scratchflow.ledger import PieceRecord, PiecesLimit, PiecesLimitReached, RunLedger, piece_records

MARKER = "COMPLETE"  # any file a task writes last into a checkpoint


def make_checkpoint(folder, step, complete=True):
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_text(f"weights {step}")
    if complete:
        (path / MARKER).write_text(json.dumps({"global_step": step}))
    return path


def test_the_newest_complete_checkpoint_wins_over_a_newer_half_written_one(tmp_path):
    make_checkpoint(tmp_path, 10)
    make_checkpoint(tmp_path, 20)
    make_checkpoint(tmp_path, 30, complete=False)
    (tmp_path / "checkpoint-latest").mkdir()
    assert CheckpointStore(RunFolder(tmp_path), MARKER).newest().name == "checkpoint-20"


def test_steps_are_compared_as_numbers(tmp_path):
    make_checkpoint(tmp_path, 9)
    make_checkpoint(tmp_path, 10)
    assert CheckpointStore(RunFolder(tmp_path), MARKER).newest().name == "checkpoint-10"


def test_no_checkpoint_means_a_fresh_start(tmp_path):
    assert CheckpointStore(RunFolder(tmp_path / "missing"), MARKER).newest() is None


def test_a_folder_is_claimed_by_one_run_and_refused_to_another(tmp_path):
    folder = tmp_path / "abc"
    run = RunLease(folder)
    owner = {"run_id": "abc", "training": {"seed": 0}, "data_sha256": "1"}
    run.claim(owner)
    run.claim(owner)  # the same run again: resumes
    with pytest.raises(lease.CheckpointMismatch, match="data_sha256") as refused:
        run.claim({**owner, "data_sha256": "2"})
    assert f"Delete {folder}" in str(refused.value)


def test_mirroring_keeps_only_the_newest(tmp_path):
    scratch, shared = tmp_path / "scratch", tmp_path / "shared"
    run = CheckpointStore(RunFolder(shared), MARKER, keep=2)
    for step in (5, 10, 15):
        run.mirror(make_checkpoint(scratch, step))
    assert [step for step, _ in run.complete()] == [10, 15]
    assert sorted(p.name for p in shared.iterdir()) == ["checkpoint-10", "checkpoint-15", "published.jsonl"]
    published = [json.loads(line)["checkpoint"] for line in (shared / "published.jsonl").read_text().splitlines()]
    assert published == ["checkpoint-5", "checkpoint-10", "checkpoint-15"], "when each was published, for the cost"
    assert (shared / "checkpoint-15" / "model.safetensors").read_text() == "weights 15"


@pytest.mark.parametrize("saved_a_newer_one", [True, False])
def test_a_checkpoint_the_task_prunes_while_it_is_mirrored_is_skipped_for_the_newer_one(
    tmp_path, monkeypatch, saved_a_newer_one
):
    """A program that saves on its own removes its old checkpoints once it has saved a newer one, in
    whatever order its rmtree takes the files (CI: a file gone, the marker not yet). The watcher's
    copy of the old one fails; it publishes the newer one next instead of failing the job. A file that
    vanishes from the newest checkpoint with nothing newer saved is an error."""
    scratch, shared = tmp_path / "scratch", tmp_path / "shared"
    mirroring = checkpoints.CheckpointMirroring(CheckpointStore(RunFolder(shared), MARKER, keep=2), scratch)
    make_checkpoint(scratch, 40)
    mirror = CheckpointStore.mirror

    def copy_while_the_task_prunes(store, checkpoint, *arguments):
        if checkpoint.name != "checkpoint-40":
            return mirror(store, checkpoint, *arguments)
        if saved_a_newer_one:
            make_checkpoint(scratch, 60)
        vanished = checkpoint / "model.safetensors"
        vanished.unlink()
        raise FileNotFoundError(2, "No such file or directory", str(vanished))  # as the copy's check met it in CI

    monkeypatch.setattr(CheckpointStore, "mirror", copy_while_the_task_prunes)
    if not saved_a_newer_one:
        with pytest.raises(FileNotFoundError):
            mirroring.mirror_newest()
        return
    assert mirroring.mirror_newest() is None
    shutil.rmtree(scratch / "checkpoint-40")
    assert mirroring.mirror_newest() == scratch / "checkpoint-60"
    assert [path.name for _step, path in CheckpointStore(RunFolder(shared), MARKER).complete()] == ["checkpoint-60"]


def test_a_full_disk_while_the_task_saves_a_newer_checkpoint_is_raised(tmp_path, monkeypatch):
    """No room on shared storage is no pruning: the newer checkpoint needs the room too, and the
    program must stop before it trains past what it can save."""
    scratch = tmp_path / "scratch"
    store = CheckpointStore(RunFolder(tmp_path / "shared"), MARKER, keep=2)
    make_checkpoint(scratch, 40)

    def full(*_arguments):
        make_checkpoint(scratch, 60)
        raise NoSpace("no space in shared/ for checkpoint-40")

    monkeypatch.setattr(CheckpointStore, "mirror", full)
    with pytest.raises(NoSpace):
        checkpoints.CheckpointMirroring(store, scratch).mirror_newest()


def mirrored(tmp_path, steps=(10, 20)) -> CheckpointStore:
    run = CheckpointStore(RunFolder(tmp_path / "shared"), MARKER, keep=len(steps))
    for step in steps:
        run.mirror(make_checkpoint(tmp_path / "scratch", step))
    return run


def test_a_published_checkpoint_lists_its_files_sizes_and_checksums(tmp_path):
    run = mirrored(tmp_path, steps=(10,))
    contents = json.loads((run.newest() / checkpoints.CONTENTS_FILE).read_text())["files"]
    assert sorted(contents) == [MARKER, "model.safetensors"]
    assert contents["model.safetensors"]["bytes"] == len("weights 10")
    assert checkpoints.checkpoint_damage(run.newest()) is None


@pytest.mark.parametrize(
    "damage, said",
    [
        (lambda weights: weights.write_text("weights"), "model.safetensors has 7 bytes where 10 were saved"),
        (lambda weights: weights.unlink(), "model.safetensors is missing"),
        (lambda weights: weights.write_text("weights 99"), "model.safetensors has other bytes than were saved"),
    ],
    ids=["truncated", "removed", "changed"],
)
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_one_before_resumed(tmp_path, damage, said, caplog):
    """A file of the newest checkpoint truncated, removed or overwritten after it was published (a
    user's rm, a filesystem fault): the job resumes from the one before, names what was wrong, and
    keeps the damaged one aside (not deleted, no longer taken for complete)."""
    run = mirrored(tmp_path)
    damage(run.newest() / "model.safetensors")
    assert run.newest_intact()[0].name == "checkpoint-10"
    assert said in caplog.text and "checkpoint-20.damaged" in caplog.text
    assert run.newest().name == "checkpoint-10", "no longer complete"
    assert said in run.damaged()["checkpoint-20"]
    assert checkpoints.checkpoint_damage(run.newest(), read_bytes=False) is None


def test_a_checkpoint_from_before_contents_were_recorded_is_taken_as_it_is(tmp_path):
    run = mirrored(tmp_path)
    (run.newest() / checkpoints.CONTENTS_FILE).unlink()
    assert run.newest_intact()[0].name == "checkpoint-20" and run.damaged() == {}


def test_release_removes_the_folder(tmp_path):
    folder = tmp_path / "abc"
    make_checkpoint(folder, 5)
    CheckpointStore(RunFolder(folder), MARKER).remove_all()
    assert list(tmp_path.iterdir()) == []


HOLD_UNTIL_RELEASED = """
import sys, time
from pathlib import Path
from scratchflow.lease import RunLease
folder, release = Path(sys.argv[1]), Path(sys.argv[2])
with RunLease(folder).held():
    (folder / "first-holds").touch()
    while not release.exists():
        time.sleep(0.05)
    (folder / "first-done").touch()
"""


def test_a_second_copy_of_a_run_waits_for_the_first_to_finish(tmp_path):
    folder, release = tmp_path / "run", tmp_path / "release"
    folder.mkdir()
    first = subprocess.Popen(
        [sys.executable, "-c", HOLD_UNTIL_RELEASED, folder, release], env={**os.environ, "PYTHONPATH": "scripts"}
    )
    while not (folder / "first-holds").exists():
        assert first.poll() is None
        time.sleep(0.05)
    threading.Timer(1.0, release.touch).start()
    with RunLease(folder).held(poll_seconds=0.1):
        assert (folder / "first-done").exists(), "the second copy started before the first ended"
        assert json.loads((folder / "running.json").read_text())["pid"] == os.getpid()
    assert first.wait() == 0
    assert not (folder / "running.json").exists()


def test_a_holder_that_is_gone_is_taken_over_at_once(tmp_path, monkeypatch):
    def never_wait(seconds):
        raise AssertionError(f"waited {seconds} s for a holder that is gone")

    monkeypatch.setattr(lease.time, "sleep", never_wait)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "running.json").write_text(json.dumps({**this_process(), "pid": int(dead.stdout)}))
    with RunLease(tmp_path).held(poll_seconds=0.1):
        assert json.loads((tmp_path / "running.json").read_text()) == this_process()
    # A requeued job finds its own job id, left by its first start on a node: that start is over.
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    (tmp_path / "running.json").write_text(json.dumps({**this_process(), "host": "node-that-died"}))
    with RunLease(tmp_path).held(poll_seconds=0.1):
        assert json.loads((tmp_path / "running.json").read_text()) == this_process()
    assert not (tmp_path / "running.json").exists()


def test_without_a_slurm_client_a_holders_job_is_judged_by_its_process(tmp_path, monkeypatch):
    """In a job step inside a container image there is no squeue: a holder's Slurm job cannot be
    asked about, its process on this node can (a killed trainer's retry must not wait for it
    forever); one on another node is assumed alive, rather than train the run twice at once."""
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = {**this_process(), "pid": int(dead.stdout), "slurm_job_id": "41"}
    assert not lease.holder_is_alive(gone)
    assert lease.holder_is_alive({**this_process(), "slurm_job_id": "41"})  # this very process: alive
    assert lease.holder_is_alive({**gone, "host": "another-node"})


def test_a_holder_that_replaced_the_dead_one_meanwhile_is_kept(tmp_path):
    """Two waiters judge the same dead holder; the first takes over. The second must not remove
    the first's new holder file, or two jobs would train the run at once."""
    holder_file = tmp_path / "running.json"
    first_waiter = {**this_process(), "pid": 1}
    holder_file.write_text(json.dumps(first_waiter))
    lease._remove_holder(holder_file, gone={**this_process(), "pid": 999_999})
    assert json.loads(holder_file.read_text()) == first_waiter
    assert [path.name for path in tmp_path.iterdir()] == ["running.json"]


def test_a_piece_found_killed_by_the_next_is_closed_with_the_step_of_its_last_checkpoint(tmp_path):
    run, ledger = CheckpointStore(RunFolder(tmp_path), MARKER), RunLedger(RunFolder(tmp_path))
    # A job SIGKILLed inside its piece: its entry never gets an ending.
    ledger.record(PieceRecord(piece=1, **this_process(), started_at="2026-11-24T10:00:00+0000"))
    make_checkpoint(tmp_path, 20)
    make_checkpoint(tmp_path, 40)
    with pytest.raises(RuntimeError), ledger.piece(run):
        make_checkpoint(tmp_path, 60)
        raise RuntimeError("the loss is NaN")
    first, second = ledger.pieces()
    assert (first.outcome, first.reached_step, first.ended_at) == ("killed", 40, None)
    assert (second.outcome, second.reached_step) == ("RuntimeError: the loss is NaN", 60)
    assert second.ended_at


def test_a_piece_that_a_signal_ends_before_it_can_pause_is_recorded_killed_by_it(tmp_path):
    """SIGTERM where the piece does not listen (signals.exit_on_sigterm raises SystemExit(143)): a
    lost node's cancellation of the job on the node left, a scancel while restoring. Before, the
    record read "SystemExit: 143" and `make status` said the piece failed."""
    run, ledger = CheckpointStore(RunFolder(tmp_path), MARKER), RunLedger(RunFolder(tmp_path))
    with pytest.raises(SystemExit), ledger.piece(run):
        raise SystemExit(128 + 15)
    with pytest.raises(SystemExit), ledger.piece(run):
        raise SystemExit(1)
    assert [piece.outcome for piece in ledger.pieces()] == ["killed by SIGTERM", "SystemExit: 1"]


def test_a_job_slurm_requeued_marks_its_earlier_piece_with_the_cause(tmp_path, monkeypatch):
    """Preempted (or its node lost), the job runs again under its id: its earlier piece is marked
    with why, once; another job's piece, or this job's first run, is not."""
    causes = []
    monkeypatch.setattr(ledger_module, "requeue_cause", lambda job_id: causes.append(job_id) or "preempted")
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    run, ledger = CheckpointStore(RunFolder(tmp_path), MARKER), RunLedger(RunFolder(tmp_path))
    with ledger.piece(run):  # the job's first run
        pass
    with ledger.piece(run):  # its run after the requeue
        pass
    monkeypatch.setenv("SLURM_JOB_ID", "42")  # a retry Snakemake submitted: a job of its own
    with ledger.piece(run):
        pass
    first, second, third = ledger.pieces()
    assert first.requeued == "preempted" and causes == ["41"]
    assert second.requeued is None and third.requeued is None

    monkeypatch.setattr(ledger_module, "requeue_cause", lambda job_id: None)  # sacct lists one run of it
    with ledger.piece(run):  # the same job again, unrequeued: a local retry inside an salloc allocation
        pass
    assert ledger.pieces()[2].requeued is None


def test_a_run_that_trained_in_max_pieces_is_refused_the_next_naming_the_key_and_a_rung_counts_its_own(tmp_path):
    """cluster.max_pieces: a job that requeues itself on every wall-time warning is never stopped by
    Slurm; the run's next piece past the limit is refused in one line naming the key and where the
    run goes on from, and records nothing. A halving search's rung counts its own pieces."""
    run, ledger = CheckpointStore(RunFolder(tmp_path), MARKER), RunLedger(RunFolder(tmp_path))
    limit = PiecesLimit(max_pieces=2)
    for _ in range(2):
        with pytest.raises(SystemExit), ledger.piece(run, limit):
            raise SystemExit(128 + 10)  # a pause
    make_checkpoint(tmp_path, 40)
    with pytest.raises(PiecesLimitReached) as refused, ledger.piece(run, limit):
        pytest.fail("a third piece trained")
    assert str(refused.value) == (
        f"run {tmp_path.name} has trained in 2 pieces (jobs), the most config key cluster.max_pieces (2) allows, "
        "and is not finished: raise cluster.max_pieces and run the same command again to train on from checkpoint-40"
    )
    assert len(ledger.pieces()) == 2, "the refused piece recorded nothing"
    with ledger.piece(run, PiecesLimit(max_pieces=2, rung=1)) as entry:  # the next rung's first piece
        entry.rung = 1
    with ledger.piece(run, PiecesLimit(max_pieces=3)):  # the limit raised: the run trains on
        pass
    assert [piece.outcome for piece in ledger.pieces()][-2:] == ["finished", "finished"]


def test_a_failed_piece_says_how_far_it_trained_past_its_newest_checkpoint(tmp_path):
    """A piece that trained to step 30 and could not save past 15 (a full disk): it reached 15, the
    step the run goes on from, and trained to 30, the steps lost."""
    run, ledger = CheckpointStore(RunFolder(tmp_path), MARKER), RunLedger(RunFolder(tmp_path))
    ledger.report_progress({"step": 90, "at": time.time() - 3600})  # an earlier piece's
    make_checkpoint(tmp_path, 15)
    with pytest.raises(OSError), ledger.piece(run):
        ledger.report_progress({"step": 30, "at": time.time()})
        raise OSError(28, "No space left on device")
    (piece,) = ledger.pieces()
    assert (piece.reached_step, piece.trained_to_step) == (15, 30)
    with pytest.raises(OSError), ledger.piece(run):
        raise OSError(28, "No space left on device")  # before it trained: the progress is older
    assert ledger.pieces()[-1].trained_to_step is None


def test_a_failed_pieces_outcome_is_the_errors_first_line(tmp_path):
    """An error that quotes a program's output (TrainingFailed holds the last lines of torchrun's)
    left 25 lines in record.json; the piece's log has them."""
    run, ledger = CheckpointStore(RunFolder(tmp_path), MARKER), RunLedger(RunFolder(tmp_path))
    with pytest.raises(RuntimeError), ledger.piece(run):
        raise RuntimeError("torchrun exited with 1; its last lines:\nTraceback (most recent call last):\n  File x")
    assert ledger.pieces()[0].outcome == "RuntimeError: torchrun exited with 1; its last lines:"


def test_a_pause_recorded_by_scratchflow_0_2_reads_as_todays(tmp_path):
    """0.1 and 0.2 said a pause in a sentence; status and accounting read today's fields from it."""
    said = "TrainingStopped: stopped on SIGTERM while staging the data in, before training, and paused; the next"
    old = {"piece": 1, **this_process(), "started_at": "2026-11-24T10:00:00+0000", "reached_step": 40}
    (training, staging) = piece_records(
        [{**old, "outcome": "TrainingStopped: stopped on SIGUSR1 at step 40 and paused; checkpoint-40 is saved"},
         {**old, "piece": 2, "outcome": said, "an_old_key": 1}]
    )  # fmt: skip
    assert (training.outcome, training.signal, training.phase, training.reached_step) == (
        "paused", "SIGUSR1", "training", 40
    )  # fmt: skip
    assert (staging.outcome, staging.signal, staging.phase) == ("paused", "SIGTERM", "staging")


def test_a_grid_whose_checkpoints_may_not_fit_is_warned_of_with_the_figures(tmp_path):
    """Sized by a saved checkpoint: 10^7 runs still to train of 1 MB checkpoints, 2 each, need 20 TB,
    more than this filesystem has; one run fits, and nothing is said."""
    root = tmp_path / "checkpoints"
    (make_checkpoint(root / "run0", 20) / "optimizer.pt").write_bytes(os.urandom(1_000_000))
    warning = checkpoints.space_warning(root, 10**7, 2, model=None)
    assert warning.startswith("the checkpoints of the 10000000 run(s) still to train may take 2000") and (
        f"in {root} (2 per run, kept until the workflow succeeds, of 1 MB each: the largest saved)" in warning
    ), warning
    assert re.search(r"its filesystem \(\w+ at /[^)]*\) has [\d.]+ GB free", warning), warning
    assert checkpoints.space_warning(root, 1, 2, model=None) is None


def test_before_any_checkpoint_the_size_is_three_times_the_models_weights(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"w" * 1000)
    (model / "config.json").write_text("{}")
    assert checkpoints.checkpoint_size(tmp_path / "checkpoints", model) == (
        3000,
        "3 x the model's weights: they and the optimizer's two moments",
    )
    assert checkpoints.checkpoint_size(tmp_path / "checkpoints", None) is None, "a command task's first run"
    assert checkpoints.space_warning(tmp_path / "checkpoints", 10**12, 2, None) is None, "no size: nothing said"


def test_the_workflow_warns_at_start_counting_only_the_runs_still_to_train(tmp_path, monkeypatch, capsys):
    """The start-up check sizes a checkpoint from the local model's weights (before any is saved)
    and counts the grid's runs without a record."""
    from scratchflow.plan import Plan
    from scratchflow.workflow_hooks import warn_of_checkpoint_space

    monkeypatch.chdir(tmp_path)
    model = tmp_path / "inputs" / "model"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"w" * 1000)
    runs = {f"run{index}": {} for index in range(3)}
    (tmp_path / "results" / "runs" / "run0").mkdir(parents=True)
    (tmp_path / "results" / "runs" / "run0" / "record.json").write_text("{}")
    plan = Plan(runs, {}, "model", "hf_classification", "accuracy", "max", MARKER)
    config = {"model": {"name": "model", "source": str(model)}, "checkpointing": {"keep": 10**12}}
    warn_of_checkpoint_space(config, plan)
    assert "warning: the checkpoints of the 2 run(s) still to train may take 6000000" in capsys.readouterr().err
    config["checkpointing"]["keep"] = 2
    warn_of_checkpoint_space(config, plan)
    assert capsys.readouterr().err == ""


def test_a_piece_whose_scratch_cannot_hold_its_checkpoints_fails_before_it_trains(tmp_path, small_disk):
    """Node-local scratch (256 KB here) with the data staged, and checkpoints of 100 KB, 2 kept: the
    task holds 3 at once while it saves, so the piece fails at once with the figures instead of at
    its first save, its training lost."""
    run = CheckpointStore(RunFolder(tmp_path / "checkpoints" / "run"), MARKER, keep=2)
    newest = make_checkpoint(run.folder, 40)
    (newest / "optimizer.pt").write_bytes(os.urandom(100_000))
    with pytest.raises(
        NoSpace,
        match=r"for the 3 checkpoints it holds while it trains \(one's size: the size of checkpoint-40\)",
    ):
        run.check_scratch_space(small_disk, newest, model=None)
    run.check_scratch_space(tmp_path, newest, model=None)  # room enough
    first = CheckpointStore(RunFolder(tmp_path / "other-grid" / "run"), MARKER, keep=2)
    first.check_scratch_space(small_disk, None, model=None)  # no checkpoint, no model: nothing said


def fenced(folder, holder="a") -> tuple[CheckpointStore, RunLedger, RunFolder]:
    run_folder = RunFolder(folder, term=lease.take_term(folder, {"host": holder, "pid": 1, "slurm_job_id": "7"}))
    return CheckpointStore(run_folder, MARKER, keep=1), RunLedger(run_folder), run_folder


def test_each_holder_takes_the_next_term_and_an_older_one_is_superseded_by_it(tmp_path):
    _store, _ledger, first = fenced(tmp_path)
    first.look()
    _store, _ledger, second = fenced(tmp_path, holder="b")
    assert (first.term, second.term) == (1, 2)
    second.look()
    with pytest.raises(lease.Superseded, match=r"a newer piece holds the run \(term 2: Slurm job 7 on b\)"):
        first.look()
    assert first.superseded() and not second.superseded()
    CheckpointStore(RunFolder(tmp_path), MARKER).remove_all()
    with pytest.raises(lease.Superseded, match="is gone"):
        second.look()


def published_by_two_terms(tmp_path) -> tuple[CheckpointStore, CheckpointStore]:
    """checkpoint-10 published by term 1, then checkpoint-20 by term 2 (in tmp_path / "shared"): their stores."""
    scratch, shared = tmp_path / "scratch", tmp_path / "shared"
    shared.mkdir()
    older, _ledger, _gate = fenced(shared)
    older.mirror(make_checkpoint(scratch / "old", 10))
    newer, _ledger, _gate = fenced(shared, holder="b")
    newer.mirror(make_checkpoint(scratch / "new", 20))
    return older, newer


def test_a_superseded_store_publishes_nothing_and_touches_none_of_the_newer_pieces_checkpoints(tmp_path):
    """The older piece's checkpoint copied whole under its partial name is not renamed into place once
    a newer term exists: neither over the newer piece's checkpoint of the same step, nor a new one,
    and it prunes nothing. Each published checkpoint says its term (contents.json, published.jsonl)."""
    older, newer = published_by_two_terms(tmp_path)
    scratch, shared = tmp_path / "scratch", tmp_path / "shared"
    before = {path: path.read_bytes() for path in shared.rglob("*") if path.is_file()}
    for step in (20, 30):
        with pytest.raises(lease.Superseded):
            older.mirror(make_checkpoint(scratch / "old", step))
    assert {path: path.read_bytes() for path in shared.rglob("*") if path.is_file()} == before
    assert [step for step, _ in newer.complete()] == [20]
    assert json.loads((shared / "checkpoint-20" / "contents.json").read_text())["term"] == 2
    assert [line["term"] for line in newer.published()] == [1, 2]


def test_a_superseded_piece_notes_its_end_beside_its_term_and_the_ledger_reads_it(tmp_path):
    """Its ledger writes are refused (pieces.json is the newer piece's), its end is noted in its own
    file, and every reader of the ledger sees it superseded at its last checkpoint."""
    store, ledger, _gate = fenced(tmp_path)
    with pytest.raises(lease.Superseded), ledger.piece(store) as entry:
        store.mirror(make_checkpoint(tmp_path / "scratch", 40))
        _newer_store, newer_ledger, _newer_gate = fenced(tmp_path, holder="b")
        with newer_ledger.piece(_newer_store):
            pass
        entry.resumed_from_step = 20
        ledger.record(entry)
    old, newer = RunLedger(RunFolder(tmp_path)).pieces()
    assert (old.outcome, old.term, old.reached_step, newer.term) == ("superseded", 1, 40, 2)
    assert old.ended_at and old.last_checkpoint_at
    assert newer.outcome == "finished"


def publish_late_by_hand(shared, scratch, step, term):
    """What a piece of `term` frozen between its look at the fence and its rename leaves once it runs
    on: its checkpoint renamed into place and noted in published.jsonl after a newer term began."""
    late = make_checkpoint(scratch / f"late-{step}", step)
    checkpoints.write_contents(late, term)
    shutil.copytree(late, shared / late.name)
    with open(shared / checkpoints.PUBLISHED_FILE, "a") as out:
        out.write(json.dumps({"checkpoint": late.name, "at": time.time(), "term": term}) + "\n")


def test_a_checkpoint_an_older_term_published_after_a_newer_term_began_is_not_resumed_from(tmp_path):
    """The fencing token checked where it is used: restore takes the newest checkpoint of the newer
    term, the late one is set aside as checkpoint-30.stale and named with why (the piece keeps
    that in its entry: set_aside), and the ledger's reading of published.jsonl leaves its line out."""
    older, newer = published_by_two_terms(tmp_path)
    scratch, shared = tmp_path / "scratch", tmp_path / "shared"
    publish_late_by_hand(shared, scratch, 30, term=1)
    assert [step for step, _ in newer.complete()] == [20, 30]  # in place, and newest by its step

    assert newer.newest().name == "checkpoint-20"
    assert newer.restore_newest_to(tmp_path / "restored").name == "checkpoint-20"
    assert [line["checkpoint"] for line in newer.published()] == ["checkpoint-10", "checkpoint-20"]
    next_piece, _ledger, _gate = fenced(shared, holder="c")
    intact, set_aside = next_piece.newest_intact()
    assert intact.name == "checkpoint-20"
    assert set_aside == {"checkpoint-30": "published by term 1 after term 2 began"}
    assert (shared / "checkpoint-30.stale" / "damage.txt").read_text() == "published by term 1 after term 2 began\n"
    # What term 1 published before term 2 began is trusted: restored where it is the newest.
    assert CheckpointStore(RunFolder(tmp_path / "none"), MARKER).newest() is None
    assert older.too_late(shared / "checkpoint-20") is None


def test_a_checkpoint_whose_piece_was_killed_between_its_rename_and_its_line_is_set_aside_for_the_one_before(
    tmp_path,
):
    """A piece SIGKILLed just after a checkpoint's rename leaves it with no line in published.jsonl:
    no time to tell it from a frozen piece's late one, so the next piece resumes from the one before
    and says why."""
    scratch, shared = tmp_path / "scratch", tmp_path / "shared"
    shared.mkdir()
    killed, _ledger, _gate = fenced(shared)
    killed.mirror(make_checkpoint(scratch, 10))
    untimed = make_checkpoint(scratch, 20)
    checkpoints.write_contents(untimed, killed.term)
    shutil.copytree(untimed, shared / untimed.name)  # renamed into place; the kill came before its line

    assert killed.newest().name == "checkpoint-20"  # while no newer piece holds the run: its own
    next_piece, _ledger, _gate = fenced(shared, holder="b")
    intact, set_aside = next_piece.newest_intact()
    assert intact.name == "checkpoint-10"
    assert set_aside == {
        "checkpoint-20": "published by term 1 with no time noted (its piece ended or froze first); term 2 began"
    }


def test_a_piece_end_an_older_term_wrote_after_a_newer_term_began_reads_as_superseded(tmp_path):
    store, ledger, _gate = fenced(tmp_path)
    with ledger.piece(store):
        pass
    _store, newer_ledger, _gate = fenced(tmp_path, holder="b")
    (finished,) = newer_ledger.pieces()
    assert finished.outcome == "finished"  # ended before term 2 began: trusted
    late = {**ledger_module.plain(finished), "outcome": "paused"}
    late["ended_at"] = time.strftime(ledger_module.TIME_FORMAT, time.localtime(time.time() + 2))
    (tmp_path / ledger_module.PIECES_FILE).write_text(json.dumps([late]))
    assert [entry.outcome for entry in newer_ledger.pieces()] == ["superseded"]
