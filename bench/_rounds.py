"""Timing several pipelines in turn, for the benchmarks in this directory."""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path


def timed_in_turn(
    pipelines: Sequence[tuple[str, Callable[[], None]]], first: int = 0
) -> dict[str, float]:
    """Run each pipeline once, starting with the ``first``-th; wall-clock seconds, by name.

    The order rotates with ``first``, so that none is always the one after the machine's
    quietest or busiest moment.
    """
    order = [*pipelines[first % len(pipelines) :], *pipelines[: first % len(pipelines)]]
    seconds = {}
    for name, pipeline in order:
        began = time.perf_counter()
        pipeline()
        seconds[name] = time.perf_counter() - began
    return {name: seconds[name] for name, _ in pipelines}


def median_rounds(
    run: Callable[[int, Path], dict[str, float]], repeat: int, work: Path, rows: int
) -> dict[str, float]:
    """``run(round, directory)`` ``repeat`` times; each pipeline's median seconds, printed.

    Each round runs in a directory of its own under ``work``, removed after it; every round's
    times are printed as they come, then each median with its rows per second.
    """
    print(f"warmed up; timing {repeat} run(s) of each", flush=True)
    rounds = []
    for number in range(repeat):
        directory = work / f"run-{number}"
        rounds.append(run(number, directory))
        shutil.rmtree(directory, ignore_errors=True)
        times = ", ".join(f"{name} {elapsed:.2f} s" for name, elapsed in rounds[-1].items())
        print(f"run {number + 1}: {times}", flush=True)
    seconds = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
    width = max(len(name) for name in seconds)
    for name, elapsed in seconds.items():
        print(f"{name:>{width}}: {elapsed:7.2f} s (median)  {rows / elapsed / 1e6:6.2f} M rows/s")
    return seconds
