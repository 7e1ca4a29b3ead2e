"""Crash points: the places inside a connector's own calls where a crash matters.

A call such as ``commit_epoch`` may do several things that must all happen or none — publish
rows in one transaction and record the epoch in another, rename staged files one by one. The
runtime can only crash *between* calls; a crash *inside* one is where such a sink loses or
doubles data. Mark those places::

    from laminar_sdk import crash_point

    async def commit_epoch(self, epoch):
        self._db.execute("INSERT INTO rows SELECT * FROM staged WHERE epoch = ?", (epoch,))
        self._db.commit()
        crash_point("rows-published")        # a crash here must not lose the marker's meaning
        self._db.execute("INSERT INTO epochs VALUES (?)", (epoch,))
        self._db.commit()

In production :func:`crash_point` reads one module global and returns: nothing is installed.
The conformance kit installs an injector that first records every point a run reaches, then
crashes at each of them in turn (in process, as ``kill -9`` would: no rollback, no close) and
checks that a restarted pipeline still delivers every record exactly once. FoundationDB's
``BUGGIFY`` is the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

# The variables that ask the Spark bridge's crash hooks (laminar_sdk.faults) for a kill: here,
# apart from the hooks, so that the bridge can look them up without importing the hooks.

CRASH_AT_VARIABLE = "LAMINAR_SPARK_CRASH_AT"
"""``STEP:EPOCH[:WHEN]``: kill the pipeline at crash point ``STEP`` of micro-batch ``EPOCH``.

Or ``@FILE``: the crash point is the content of ``FILE``, read each time a connector is opened
or committed (none while ``FILE`` is missing or empty) — for a driver started before its crash
point is known, as the conformance kit's restarts standing by are."""

CRASH_AT_FILE_PREFIX = "@"
"""Before a path, in :data:`CRASH_AT_VARIABLE`: read the crash point from that file."""

CRASH_RECORD_VARIABLE = "LAMINAR_SPARK_CRASH_RECORD"
"""A file's path: before it kills, the crash hook appends a line of JSON saying what it did."""

KILL_WRITER_VARIABLE = "LAMINAR_SPARK_KILL_WRITER"
"""A marker file's path: the first write task to find the file absent creates it and SIGKILLs
its own Python worker in the middle of its write (a crashed executor worker, which Spark must
retry without the epoch committing anything twice)."""

KILL_EPOCH_WRITER_VARIABLE = "LAMINAR_SPARK_KILL_EPOCH_WRITER"
"""``STEP:EPOCH[,STEP:EPOCH...]``: the Spark bridge's epoch writer (the process that writes a
one-instance sink's micro-batches while their tasks run) SIGKILLs itself, and only itself, at
each of these steps between two calls (``write``, ``pre-commit``, ``manifest``, ``commit``,
``committed-manifest``, ``done``): the commit waiting for it must finish the micro-batch
without it, exactly once. Or ``@FILE``: the steps are the content of ``FILE``, read at each
micro-batch (none while it is missing or empty)."""

CrashPointInjector = Callable[[str], None]
"""Called with the name of each crash point reached; raising from it crashes the caller there."""

_injector: CrashPointInjector | None = None


def crash_point(name: str) -> None:
    """Mark a place inside a connector call where a crash must be survivable.

    :param name: what has just happened, unique within the connector (``rows-published``).
    """
    if _injector is not None:
        _injector(name)


def install_crash_point_injector(injector: CrashPointInjector | None) -> CrashPointInjector | None:
    """Make ``injector`` the one :func:`crash_point` calls (``None``: none); return the last."""
    global _injector
    previous, _injector = _injector, injector
    return previous


@contextlib.contextmanager
def injecting_crash_points(injector: CrashPointInjector) -> Iterator[None]:
    """Call ``injector`` at every :func:`crash_point` reached in this block (for test kits)."""
    previous = install_crash_point_injector(injector)
    try:
        yield
    finally:
        install_crash_point_injector(previous)
