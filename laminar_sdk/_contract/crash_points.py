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
