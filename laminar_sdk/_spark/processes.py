"""The Spark JVM a Python process of the bridge serves, found from within that process.

Spark's Python workers descend from the JVM (the daemon it forks them from is its child); the
epoch writer (:mod:`~laminar_sdk._spark.epoch_writer`) leaves that tree on purpose and is told
the JVM's pid in :data:`JVM_PID_VARIABLE` instead. Linux only: the JVM is found through
``/proc``; elsewhere nothing is found.
"""

from __future__ import annotations

import os
from pathlib import Path

JVM_PID_VARIABLE = "LAMINAR_SPARK_JVM_PID"
"""The pid of the Spark JVM a process serves, set for a process outside the JVM's tree."""


def spark_jvm() -> int | None:
    """The pid of the Spark JVM this process serves; ``None`` when none is found."""
    given = os.environ.get(JVM_PID_VARIABLE)
    if given:
        return int(given)
    return java_ancestor(os.getppid())


def java_ancestor(pid: int) -> int | None:
    """The nearest process named ``java`` among ``pid`` and its ancestors."""
    while pid > 1:
        proc = Path("/proc", str(pid))
        try:
            if (proc / "comm").read_text().strip() == "java":
                return pid
            # The parent pid is the 2nd field after the parenthesised command name.
            pid = int((proc / "stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            return None
    return None


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs, by ``/proc`` (a zombie counts as gone)."""
    try:
        state = Path("/proc", str(pid), "stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
