import json

import pytest
from scratchflow import checkpoints


def make_checkpoint(folder, step, complete=True):
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_text(f"weights {step}")
    if complete:
        (path / checkpoints.COMPLETION_FILE).write_text(json.dumps({"global_step": step}))
    return path


def test_the_newest_complete_checkpoint_wins_over_a_newer_half_written_one(tmp_path):
    make_checkpoint(tmp_path, 10)
    make_checkpoint(tmp_path, 20)
    make_checkpoint(tmp_path, 30, complete=False)
    (tmp_path / "checkpoint-latest").mkdir()
    assert checkpoints.newest_complete_checkpoint(tmp_path).name == "checkpoint-20"


def test_steps_are_compared_as_numbers(tmp_path):
    make_checkpoint(tmp_path, 9)
    make_checkpoint(tmp_path, 10)
    assert checkpoints.newest_complete_checkpoint(tmp_path).name == "checkpoint-10"


def test_no_checkpoint_means_a_fresh_start(tmp_path):
    assert checkpoints.newest_complete_checkpoint(tmp_path / "missing") is None


def test_a_folder_is_claimed_by_one_run_and_refused_to_another(tmp_path):
    folder = tmp_path / "abc"
    owner = {"run_id": "abc", "training": {"seed": 0}, "data_sha256": "1"}
    checkpoints.claim(folder, owner)
    checkpoints.claim(folder, owner)  # the same run again: resumes
    with pytest.raises(checkpoints.CheckpointMismatch, match="data_sha256") as refused:
        checkpoints.claim(folder, {**owner, "data_sha256": "2"})
    assert f"Delete {folder}" in str(refused.value)


def test_mirroring_keeps_only_the_newest(tmp_path):
    scratch, shared = tmp_path / "scratch", tmp_path / "shared"
    for step in (5, 10, 15):
        checkpoints.mirror(make_checkpoint(scratch, step), shared, keep=2)
    assert [step for step, _ in checkpoints.complete_checkpoints(shared)] == [10, 15]
    assert sorted(p.name for p in shared.iterdir()) == ["checkpoint-10", "checkpoint-15"]
    assert (shared / "checkpoint-15" / "model.safetensors").read_text() == "weights 15"


def test_release_removes_the_folder(tmp_path):
    folder = tmp_path / "abc"
    make_checkpoint(folder, 5)
    checkpoints.release(folder)
    assert list(tmp_path.iterdir()) == []
