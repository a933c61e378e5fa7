"""How long each phase of a job took (stage, train, sync, cleanup, ...): the timings its record keeps,
so that the lifecycle's overhead is seen beside the training itself."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class PhaseTimer:
    """Wall-clock seconds per lifecycle phase (stage, train, sync, cleanup, ...)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - start, 3)
