"""What a crashed in-process run held is let go before the next run opens, as after a kill."""

from __future__ import annotations

import asyncio
import gc
import weakref
from pathlib import Path

import pytest
from laminar_conformance._faults import (
    Fault,
    FaultPlan,
    FaultPoint,
    collecting_only_what_it_makes,
    with_watched_threads,
)
from laminar_conformance._reference_contexts import MemorySinkContext
from laminar_conformance.sink import _run_staged_through_faults, _run_through_faults

from laminar_sdk import ConnectorConfig, ConnectorError
from laminar_sdk.reference import MemorySink

_LOCKED: set[str] = set()
"""Destinations an open instance holds, as a lock file or a database lock would be held."""


class LockingSink(MemorySink):
    """The memory sink, holding its destination from ``open`` until closed (or collected).

    A second instance on a held destination fails to open: a process killed while holding a
    lock releases it, so in process the kit must drop a crashed instance before the next.
    """

    async def open(self, config: ConnectorConfig) -> None:
        await super().open(config)
        path = config.require("path")
        if path in _LOCKED:
            raise ConnectorError(f"{path} is locked by another instance")
        _LOCKED.add(path)
        self._unlock = weakref.finalize(self, _LOCKED.discard, path)

    async def close(self) -> None:
        self._unlock()
        await super().close()


class Session:
    """What the kit's runs use of a session: new instances, and batches of ids."""

    def __init__(self, workdir: Path) -> None:
        self.context = MemorySinkContext(workdir)

    async def open(self) -> LockingSink:
        sink = LockingSink()
        await sink.open(self.context.config())
        return sink


EPOCHS = [[[1, 2], [3]], [[4], [5, 6]], [[7]]]


FAULTS = [Fault.ERROR_BEFORE, Fault.ERROR_AFTER, Fault.CRASH_BEFORE, Fault.CRASH_AFTER]


@pytest.mark.parametrize("fault", FAULTS, ids=lambda fault: fault.value)
@pytest.mark.parametrize("call", ["stage", "commit_aggregated"])
def test_a_staged_run_that_failed_holds_nothing_when_the_next_opens(tmp_path, call, fault):
    session = Session(tmp_path)
    plan = FaultPlan([FaultPoint(call, fault, 1)])

    restarts = asyncio.run(
        with_watched_threads(_run_staged_through_faults(session, tmp_path / "ckpt", EPOCHS, plan))
    )

    assert restarts == int(fault.is_crash)
    assert sorted(session.context.committed_ids()) == [1, 2, 3, 4, 5, 6, 7]


def test_a_run_that_crashed_holds_nothing_when_the_next_opens(tmp_path):
    session = Session(tmp_path)
    plan = FaultPlan([FaultPoint("commit_epoch", Fault.CRASH_BEFORE, 1)])

    restarts = asyncio.run(
        with_watched_threads(_run_through_faults(session, tmp_path / "ckpt", EPOCHS, plan))
    )

    assert restarts == 1
    assert sorted(session.context.committed_ids()) == [1, 2, 3, 4, 5, 6, 7]


def test_a_run_that_crashed_in_a_check_holds_nothing_when_the_next_opens(tmp_path):
    # As every check runs: what lived before it is frozen, and collections look only at what
    # the check made; the crashed instance (made in the check) must still be let go.
    session = Session(tmp_path)
    plan = FaultPlan([FaultPoint("commit_epoch", Fault.CRASH_BEFORE, 1)])

    with collecting_only_what_it_makes():
        assert gc.get_freeze_count() > 0
        restarts = asyncio.run(
            with_watched_threads(_run_through_faults(session, tmp_path / "ckpt", EPOCHS, plan))
        )

    assert restarts == 1
    assert sorted(session.context.committed_ids()) == [1, 2, 3, 4, 5, 6, 7]
    assert gc.get_freeze_count() == 0


def test_a_process_that_froze_objects_itself_keeps_them_frozen():
    gc.freeze()
    try:
        with collecting_only_what_it_makes():
            pass
        # Not the count before: a frozen object that another thread frees meanwhile leaves the
        # permanent generation (CI saw one fewer). gc.unfreeze() would leave none.
        assert gc.get_freeze_count() > 0, "the process's own freeze was undone"
    finally:
        gc.unfreeze()
