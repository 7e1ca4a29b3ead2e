"""Crash points inside a sink's calls: the public marker, and how the kit finds and fires them."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys

import pytest
from laminar_conformance._faults import Fault, FaultPlan, FaultPoint, with_watched_threads

from laminar_sdk import SimulatedCrash, crash_point, injecting_crash_points


def test_a_crash_point_does_nothing_without_an_injector():
    assert crash_point("anything") is None


def test_an_injector_sees_every_marked_point_and_is_removed_after_its_block():
    seen: list[str] = []
    with injecting_crash_points(seen.append):
        crash_point("rows-published")
        crash_point("marker-written")
    crash_point("after the block")
    assert seen == ["rows-published", "marker-written"]


def publish(path) -> None:
    """Two transactions and a rename, with a marked point between the transactions."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE IF NOT EXISTS t (x)")
    db.close()
    db = sqlite3.connect(path)
    db.execute("INSERT INTO t VALUES (1)")
    db.commit()
    crash_point("first-committed")
    db.execute("INSERT INTO t VALUES (2)")
    db.commit()
    db.close()
    os.replace(path, path.with_suffix(".done"))


POINTS_OF_PUBLISH = [
    "inside commit_epoch: first-committed",
    "inside commit_epoch: posix.replace#1",
    "inside commit_epoch: sqlite3.Connection.__exit__#1",
    "inside commit_epoch: sqlite3.Connection.commit#1",
    "inside commit_epoch: sqlite3.Connection.commit#2",
]
"""The points :func:`publish` reaches inside a ``commit_epoch``, sorted."""


def test_a_clean_run_records_the_marked_points_and_the_durable_c_calls(tmp_path):
    plan = FaultPlan([])
    with plan.inside("commit_epoch", 4):
        publish(tmp_path / "a.db")
    assert sorted(plan.reached_inside) == POINTS_OF_PUBLISH
    assert plan.reached_inside["inside commit_epoch: first-committed"] == {4}


@pytest.mark.parametrize(
    ("point", "rows"),
    [("first-committed", [1]), ("sqlite3.Connection.commit#2", [1]), ("posix.replace#1", [1, 2])],
)
def test_a_planned_crash_fires_just_before_its_point(tmp_path, point, rows):
    path = tmp_path / "a.db"
    plan = FaultPlan([FaultPoint(f"inside commit_epoch: {point}", Fault.CRASH_BEFORE, 4)])
    with pytest.raises(SimulatedCrash, match=point), plan.inside("commit_epoch", 4):
        publish(path)
    assert [row[0] for row in sqlite3.connect(path).execute("SELECT x FROM t")] == rows
    assert not path.with_suffix(".done").exists()


def test_the_profile_hook_is_removed_after_a_crash(tmp_path):
    plan = FaultPlan([FaultPoint("inside pre_commit: first-committed", Fault.CRASH_BEFORE, 0)])
    with pytest.raises(SimulatedCrash), plan.inside("pre_commit", 0):
        publish(tmp_path / "a.db")
    assert sys.getprofile() is None


def test_durable_calls_in_the_event_loops_executor_threads_are_points_too(tmp_path):
    plan = FaultPlan([])

    async def commit_epoch_in_a_thread() -> None:
        with plan.inside("commit_epoch", 4):
            await asyncio.to_thread(publish, tmp_path / "a.db")

    asyncio.run(with_watched_threads(commit_epoch_in_a_thread()))
    assert sorted(plan.reached_inside) == POINTS_OF_PUBLISH


def test_a_planned_crash_fires_in_an_executor_thread_and_later_calls_are_still_watched(tmp_path):
    path = tmp_path / "a.db"
    point = "sqlite3.Connection.commit#2"
    plan = FaultPlan([FaultPoint(f"inside commit_epoch: {point}", Fault.CRASH_BEFORE, 4)])

    async def crash_then_commit_again() -> None:
        with pytest.raises(SimulatedCrash, match=point), plan.inside("commit_epoch", 4):
            await asyncio.to_thread(publish, path)
        with plan.inside("commit_epoch", 5):  # the recovered instance
            await asyncio.to_thread(publish, tmp_path / "b.db")

    asyncio.run(with_watched_threads(crash_then_commit_again()))
    assert [row[0] for row in sqlite3.connect(path).execute("SELECT x FROM t")] == [1]
    assert not path.with_suffix(".done").exists()
    assert plan.reached_inside[f"inside commit_epoch: {point}"] == {4, 5}
    assert sys.getprofile() is None
