"""When a piece saves a checkpoint: by time, as labs count lost work, never at a cost above 1 % of
training; by steps as well where the config asks (short runs, tests); and always when asked to stop
(scratchflow.signals) and after the last step (the task's contract).

A step interval is right for one model on one device and wrong on the next (the demo's 20 steps
took half a GPU's training loop: benchmarks/README.md, section 15); minutes are what a kill loses
whatever the device. The interval is not part of a run's identity: a run resumes exactly from any
step, so where its checkpoints fall changes no result."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# The most of a piece's training time its checkpoints may take: the interval stretches past
# `every_minutes` when the last checkpoint took longer than this share of it.
SAVING_SHARE = 0.01


@dataclass(frozen=True)
class CheckpointInterval:
    """The config's checkpointing.every_minutes and every_steps."""

    minutes: float = 10.0
    steps: int | None = None  # also every this many steps; None: by time alone

    @classmethod
    def of(cls, checkpointing: dict[str, Any]) -> CheckpointInterval:
        """The config's checkpointing: section's."""
        return cls(checkpointing["every_minutes"], checkpointing["every_steps"])


@dataclass(frozen=True)
class CheckpointCost:
    """What one checkpoint cost its piece's training, in seconds: writing it on scratch (from the end
    of its step, when the task learnt it was due, to the task handing it over; None where the
    task's program saves on its own) and publishing it to shared storage."""

    step: int
    save_seconds: float | None
    publish_seconds: float


@dataclass
class CheckpointSchedule:
    """One training process's clock of checkpoints. Every process of a piece keeps one and asks it at
    the same steps; they agree on its answer (scratchflow.piece)."""

    interval: CheckpointInterval
    clock: Callable[[], float] = time.monotonic
    costs: list[CheckpointCost] = field(default_factory=list)

    def __post_init__(self) -> None:
        # When the last checkpoint was published; until then the end of the piece's first step (its
        # start-up, loading data and model, is no training a kill would lose).
        self.last_saved_at: float | None = None
        self.step_ended_at: float | None = None  # when the task last asked, at a step's end
        self.asked = 0  # how often the task asked whether a checkpoint was due

    @property
    def seconds(self) -> float:
        """Seconds of training between two checkpoints: every_minutes, or a hundred times what the
        last checkpoint cost if that is longer."""
        last = self.costs[-1] if self.costs else None
        cost = (last.save_seconds or 0.0) + last.publish_seconds if last else 0.0
        return max(self.interval.minutes * 60, cost / SAVING_SHARE)

    def step_ended(self) -> None:
        """The task asks at a step's end (whether to stop, or to save): a save starts here."""
        self.step_ended_at = self.clock()
        if self.last_saved_at is None:
            self.last_saved_at = self.step_ended_at

    @property
    def stretched(self) -> bool:
        """Whether the 1 % bound sets the interval, not every_minutes."""
        return self.seconds > self.interval.minutes * 60

    def due(self, step: int) -> bool:
        """Whether the checkpoint at the end of `step` is due: every `interval.steps` steps, or once
        `seconds` have passed since the last."""
        self.step_ended()
        self.asked += 1
        if self.interval.steps is not None and step % self.interval.steps == 0:
            return True
        assert self.step_ended_at is not None and self.last_saved_at is not None
        return self.step_ended_at - self.last_saved_at >= self.seconds

    def next_checkpoint(self, step: int) -> str:
        """When the checkpoint after the one of `step` is due, as the train log says it: `due`'s rule."""
        by_time = f"after {self.seconds / 60:.2f} minutes of training"
        if self.stretched:
            by_time += f" ({1 / SAVING_SHARE:.0f} times this one's cost: checkpoints stay under 1 % of training)"
        if self.interval.steps is None:
            return f"the next {by_time}"
        next_step = (step // self.interval.steps + 1) * self.interval.steps
        return f"the next at step {next_step} or {by_time}, whichever comes first"

    def published(self, step: int, publish_started_at: float) -> CheckpointCost:
        """The checkpoint of `step` is on shared storage, its publication begun at
        `publish_started_at` (this clock's): what it cost, kept; the interval counts from now."""
        now = self.clock()
        saved_from = self.step_ended_at
        save_seconds = publish_started_at - saved_from if saved_from is not None else None
        cost = CheckpointCost(step, _rounded(save_seconds), round(now - publish_started_at, 3))
        self.costs.append(cost)
        self.last_saved_at, self.step_ended_at = now, None
        return cost


def _rounded(seconds: float | None) -> float | None:
    return round(seconds, 3) if seconds is not None else None
