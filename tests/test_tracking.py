"""Training curves on shared storage: continuous across pieces, read back as TensorBoard shows them."""

import pytest
from conftest import drawn_figure
from scratchflow.tracking import (
    duration,
    learning_curves,
    open_writer,
    plot_curves,
    progress_line,
    read_curves,
)


def log_piece(directory, resumed_from_step, steps, scale):
    writer = open_writer(directory, resumed_from_step)
    for step in steps:
        writer.add_scalar("train/loss", scale / step, step)
    writer.close()


def test_a_resumed_piece_continues_the_curve_and_replaces_the_steps_it_trains_again(tmp_path):
    # The first piece logged up to step 30, but its last checkpoint was at step 20.
    log_piece(tmp_path, None, range(1, 31), scale=1.0)
    log_piece(tmp_path, 20, range(21, 41), scale=2.0)

    (curve,) = read_curves(tmp_path).values()

    assert [step for step, _ in curve] == list(range(1, 41)), "one point per step, none twice"
    assert curve[19][1] == pytest.approx(1.0 / 20), "the first piece's steps up to its checkpoint stay"
    assert curve[20][1] == pytest.approx(2.0 / 21), "the second piece's steps replace the lost ones"


def test_a_run_started_again_from_nothing_starts_a_new_curve(tmp_path):
    log_piece(tmp_path, None, range(1, 31), scale=1.0)
    log_piece(tmp_path, None, range(1, 11), scale=3.0)

    (curve,) = read_curves(tmp_path).values()

    assert [step for step, _ in curve] == list(range(1, 11))
    assert curve[0][1] == pytest.approx(3.0)


def test_a_run_without_event_files_has_no_curves(tmp_path):
    assert read_curves(tmp_path / "absent") == {}


def test_losses_come_first_and_speed_figures_are_not_curves():
    tags = {
        "eval/accuracy": [],
        "train/train_runtime": [],
        "eval/loss": [],
        "train/epoch": [],
        "eval/samples_per_second": [],
        "train/loss": [],
        "train/learning_rate": [],
    }
    assert learning_curves(tags) == ["train/loss", "eval/loss", "eval/accuracy", "train/learning_rate"]


def test_a_progress_line_says_where_training_is_how_fast_and_how_long_it_has_left():
    line = progress_line(30, 280, 0.53124, 95.14, 200)
    assert line == "step 30/280 (11%), loss 0.5312, 95.1 samples/s, 3 min 20 s left"


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(12.4, "12 s"), (200, "3 min 20 s"), (3900, "1 h 05 min"), (float("inf"), "unknown")],
)
def test_durations_read_as_a_person_says_them(seconds, said):
    assert duration(seconds) == said


def test_the_figure_is_drawn_with_curves_and_without(tmp_path):
    log_piece(tmp_path / "tb", None, range(1, 11), scale=1.0)
    plot_curves({"run-a": read_curves(tmp_path / "tb"), "run-b": {}}, tmp_path / "curves.png", "t", "run-a")
    plot_curves({"run-c": {}}, tmp_path / "empty.png", "nothing logged")
    # A panel of 4.2 x 3.4 inches at 100 dpi per curve worth one (or for the note that there is none).
    assert drawn_figure(tmp_path / "curves.png")[1] == 340
    assert drawn_figure(tmp_path / "empty.png") == (420, 340)
