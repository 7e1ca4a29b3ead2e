"""Fixtures shared by the reference connectors' tests."""

from __future__ import annotations

import pytest

from laminar_sdk.reference import _generator


class GeneratorClock:
    """Stands in for the generator's ``time`` module: it moves only when a test moves it.

    A paced generator's rows fall due with the wall clock, so a test that slept and then
    counted them depended on how promptly a loaded machine ran it.
    """

    def __init__(self) -> None:
        self.now_ns = 1_700_000_000 * 1_000_000_000

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` on."""
        self.now_ns += round(seconds * 1_000_000_000)

    def time(self) -> float:
        """Seconds since the epoch, as ``time.time``."""
        return self.now_ns / 1_000_000_000

    def time_ns(self) -> int:
        """Nanoseconds since the epoch, as ``time.time_ns``."""
        return self.now_ns


@pytest.fixture
def generator_clock(monkeypatch: pytest.MonkeyPatch) -> GeneratorClock:
    """The generator's clock, stopped until the test advances it."""
    clock = GeneratorClock()
    monkeypatch.setattr(_generator, "time", clock)
    return clock
