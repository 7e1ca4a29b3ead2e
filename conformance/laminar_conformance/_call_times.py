"""How long the connector's own calls take during a check: what makes a slow check slow.

The kit times each ``open`` of a connector and each protocol call it makes; ``laminar
conformance run`` reads the times after every check and, when the check was slow, names the
calls that took most of it with their median, so an author knows what to make faster (or why
their quick profile takes minutes) without profiling the kit.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CallTime:
    """The calls of one name during a check."""

    call: str
    count: int
    median_s: float
    total_s: float

    def __str__(self) -> str:
        return (
            f"{self.call} was called {self.count} times, median {self.median_s * 1000:.0f} ms "
            f"({self.total_s:.1f} s in all)"
        )


class CallTimes:
    """The durations of connector calls, by call, since they were last taken."""

    def __init__(self) -> None:
        self._seconds: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def timing(self, call: str) -> Iterator[None]:
        """Time the block as one call of ``call`` (``sink open()``, ``commit_epoch``)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.record(call, time.perf_counter() - started)

    def record(self, call: str, seconds: float) -> None:
        """Add one call of ``call`` that took ``seconds``."""
        with self._lock:
            self._seconds.setdefault(call, []).append(seconds)

    def take(self) -> list[CallTime]:
        """Every call timed since the last take, the longest in all first; then forget them."""
        with self._lock:
            taken, self._seconds = self._seconds, {}
        times = [
            CallTime(call, len(seconds), statistics.median(seconds), sum(seconds))
            for call, seconds in taken.items()
        ]
        return sorted(times, key=lambda time: time.total_s, reverse=True)


CALL_TIMES = CallTimes()
"""The calls of the check now running (the kit runs one check at a time per process)."""
