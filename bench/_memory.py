"""The peak memory of the Python processes a benchmark's Spark session starts."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


class PeakRss:
    """The peak resident set (``VmHWM``) of this process and every process under it, sampled.

    A process's high-water mark only grows, so sampling it every ``interval_s`` misses a peak
    only in a process that lives less than that.
    """

    def __init__(self, interval_s: float = 0.05) -> None:
        self._interval_s = interval_s
        self.peaks: dict[int, tuple[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def by_role(self) -> dict[str, int]:
        """The highest peak of each kind of Python process (its module or script)."""
        roles: dict[str, int] = {}
        for role, peak in self.peaks.values():
            roles[role] = max(peak, roles.get(role, 0))
        return roles

    def _sample(self) -> None:
        while not self._stop.wait(self._interval_s):
            for pid in _descendants(os.getpid()):
                role = _python_role(pid)
                peak = _high_water_mark(pid)
                if role is not None and peak is not None:
                    known = self.peaks.get(pid, (role, 0))
                    self.peaks[pid] = (role, max(known[1], peak))


def _descendants(root: int) -> Iterator[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    todo = [root]
    while todo:
        pid = todo.pop()
        yield pid
        todo += children.get(pid, [])


def _python_role(pid: int) -> str | None:
    try:
        argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().decode().split("\0")
    except OSError:
        return None
    if pid == os.getpid():
        return "the driver's own Python process (this script)"
    if "python" not in Path(argv[0]).name:
        return None
    return " ".join(part for part in argv[1:4] if part) or argv[0]


def _high_water_mark(pid: int) -> int | None:
    try:
        for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def print_peaks(rss: PeakRss, file: TextIO = sys.stdout) -> None:
    """Each kind of Python process's peak, largest first."""
    for role, peak in sorted(rss.by_role().items(), key=lambda item: -item[1]):
        print(f"  {peak / 2**20:8.0f} MiB  {role}", file=file, flush=True)
