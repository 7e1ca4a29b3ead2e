"""Timing several pipelines in turn, for the benchmarks in this directory."""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple


class Timing(NamedTuple):
    """One run of a pipeline: wall-clock seconds, and the CPU seconds the machine spent.

    ``cpu`` counts every process (the JVM, Spark's Python workers, anything else running),
    so it is the pipeline's only on an otherwise idle machine; ``None`` off Linux. On ``n``
    cores a run cannot take less than ``cpu / n`` seconds: a pipeline that needs more CPU
    than another is slower by at least that much once the cores are busy.
    """

    wall: float
    cpu: float | None


def busy_cpu_seconds() -> float | None:
    """CPU seconds all cores have spent busy since boot (Linux's ``/proc/stat``); else None."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def timed_in_turn(
    pipelines: Sequence[tuple[str, Callable[[], None]]], first: int = 0
) -> dict[str, Timing]:
    """Run each pipeline once, starting with the ``first``-th; its timing, by name.

    The order rotates with ``first``, so that none is always the one after the machine's
    quietest or busiest moment.
    """
    order = [*pipelines[first % len(pipelines) :], *pipelines[: first % len(pipelines)]]
    timings = {}
    for name, pipeline in order:
        cpu_before = busy_cpu_seconds()
        began = time.perf_counter()
        pipeline()
        wall = time.perf_counter() - began
        cpu_after = busy_cpu_seconds()
        cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
        timings[name] = Timing(wall, cpu)
    return {name: timings[name] for name, _ in pipelines}


def median_rounds(
    run: Callable[[int, Path], dict[str, Timing]], repeat: int, work: Path, rows: int
) -> dict[str, float]:
    """``run(round, directory)`` ``repeat`` times; each pipeline's median seconds, printed.

    Each round runs in a directory of its own under ``work``, removed after it; every round's
    times are printed as they come, then each median with its rows per second and the median
    CPU seconds the machine spent on it (with how many cores that kept busy on average).
    """
    print(f"warmed up; timing {repeat} run(s) of each", flush=True)
    rounds = []
    for number in range(repeat):
        directory = work / f"run-{number}"
        rounds.append(run(number, directory))
        shutil.rmtree(directory, ignore_errors=True)
        times = ", ".join(f"{name} {timing.wall:.2f} s" for name, timing in rounds[-1].items())
        print(f"run {number + 1}: {times}", flush=True)
    seconds = {name: statistics.median(r[name].wall for r in rounds) for name in rounds[0]}
    width = max(len(name) for name in seconds)
    for name, elapsed in seconds.items():
        cpus = [cpu for r in rounds if (cpu := r[name].cpu) is not None]
        busy = ""
        if cpus:
            cpu = statistics.median(cpus)
            busy = f"  CPU {cpu:6.2f} s ({cpu / elapsed:.1f} cores busy)"
        print(
            f"{name:>{width}}: {elapsed:7.2f} s (median)  {rows / elapsed / 1e6:6.2f} M rows/s"
            f"{busy}"
        )
    return seconds
