"""When a piece saves: every_minutes of training, stretched so that checkpoints never take more than
1 % of it, and every_steps where set (scratchflow.schedule)."""

from __future__ import annotations

from scratchflow.schedule import CheckpointInterval, CheckpointSchedule


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def train_and_save(
    schedule: CheckpointSchedule, clock: Clock, steps: int, step_seconds: float, save: float, publish: float
):
    """`steps` steps of `step_seconds`, saving where the schedule says (taking `save` seconds on
    scratch and `publish` to shared storage): the steps saved at."""
    saved = []
    for step in range(1, steps + 1):
        clock.now += step_seconds
        if schedule.due(step):
            clock.now += save
            started = clock.now
            clock.now += publish
            schedule.published(step, started)
            saved.append(step)
    return saved


def test_a_checkpoint_is_due_every_interval_of_training_and_its_cost_is_kept():
    clock = Clock()
    schedule = CheckpointSchedule(CheckpointInterval(minutes=1), clock)
    saved = train_and_save(schedule, clock, steps=400, step_seconds=1.0, save=0.2, publish=0.3)
    # From the first step's end, 60 s of steps; the save's 0.5 s counts towards the next interval no more.
    assert saved == [61, 121, 181, 241, 301, 361]
    first = schedule.costs[0]
    assert (first.step, first.save_seconds, first.publish_seconds) == (61, 0.2, 0.3)
    assert not schedule.stretched


def test_checkpoints_that_would_cost_more_than_a_hundredth_of_training_come_less_often():
    """A save of 3 s every 60 s would be 5 %: the next comes after 300 s of training, 1 %."""
    clock = Clock()
    schedule = CheckpointSchedule(CheckpointInterval(minutes=1), clock)
    saved = train_and_save(schedule, clock, steps=1000, step_seconds=1.0, save=2.0, publish=1.0)
    assert saved == [61, 361, 661, 961] and schedule.stretched
    trained = 1000.0
    assert sum(cost.save_seconds + cost.publish_seconds for cost in schedule.costs) / trained <= 0.012


def test_every_steps_saves_as_well_and_resets_the_clock():
    clock = Clock()
    schedule = CheckpointSchedule(CheckpointInterval(minutes=1, steps=25), clock)
    saved = train_and_save(schedule, clock, steps=100, step_seconds=2.0, save=0.0, publish=0.0)
    assert saved == [25, 50, 75, 100], "every 25 steps (50 s) comes before every minute"


def test_a_save_the_task_makes_unasked_costs_its_publication_alone():
    """A program saving on its own (the command task): the piece never learns when it began."""
    clock = Clock()
    schedule = CheckpointSchedule(CheckpointInterval(minutes=1), clock)
    clock.now += 5
    schedule.published(40, clock.now - 0.25)
    assert (schedule.costs[0].save_seconds, schedule.costs[0].publish_seconds) == (None, 0.25)


def test_the_clock_starts_at_the_first_steps_end_not_at_the_pieces_start_up():
    """Loading data and model for ten minutes is no training a kill would lose: no checkpoint after
    the first step for it."""
    clock = Clock()
    schedule = CheckpointSchedule(CheckpointInterval(minutes=1), clock)
    clock.now += 600  # the task's start-up, before its first step ends
    saved = train_and_save(schedule, clock, steps=70, step_seconds=1.0, save=0.0, publish=0.0)
    assert saved == [61]


def test_the_train_log_names_the_next_checkpoint_by_time_and_by_steps_where_set():
    """The line the log writes after each checkpoint says what `due` will do, not the minutes alone."""
    clock = Clock()
    by_time = CheckpointSchedule(CheckpointInterval(minutes=10), clock)
    assert by_time.next_checkpoint(37) == "the next after 10.00 minutes of training"
    by_steps = CheckpointSchedule(CheckpointInterval(minutes=10, steps=25), clock)
    assert (
        by_steps.next_checkpoint(25) == "the next at step 50 or after 10.00 minutes of training, whichever comes first"
    )
    assert by_steps.next_checkpoint(37).startswith("the next at step 50 or"), "a stop's checkpoint, between two"
    stretched = CheckpointSchedule(CheckpointInterval(minutes=1), clock)
    train_and_save(stretched, clock, steps=61, step_seconds=1.0, save=2.0, publish=1.0)
    assert stretched.next_checkpoint(61) == (
        "the next after 5.00 minutes of training (100 times this one's cost: checkpoints stay under 1 % of training)"
    )
