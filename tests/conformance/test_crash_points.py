"""Crash points inside a sink's calls: the public marker, and how the kit finds and fires them.

The kit finds a point wherever the connector's own code called out of Python, whatever the
library: these tests call C through a method (``sqlite3``), a module function (``os``),
``ctypes`` (reported by no profiler event), and an extension type that calls itself
``builtins`` (``lmdb``), and check that the interpreter's own computation is no point.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import lmdb
import pytest
import sink_code
from laminar_conformance._call_sites import _EXECUTOR, CallWatcher, ConnectorCode, FrameTracer
from laminar_conformance._faults import (
    Fault,
    FaultPlan,
    FaultPoint,
    KillNotReached,
    TraceEvent,
    with_watched_threads,
)
from laminar_conformance._figures import Figures
from laminar_conformance._inside_crashes import chosen_points, crash_at_chosen_points, site_of
from laminar_conformance._profiles import PROFILES
from sink_code import (
    commit_in_an_executor,
    insert_twice,
    line_of,
    publish,
    publish_in_a_task,
    publish_in_a_task_through_an_executor,
    put_in_lmdb,
    writer,
)

from laminar_sdk import crash_point
from laminar_sdk.faults import SimulatedCrash, injecting_crash_points

SINK_CODE = ConnectorCode.files([sink_code.__file__])
"""The "connector": its calls out of Python are the sites."""


def test_a_crash_point_does_nothing_without_an_injector():
    assert crash_point("anything") is None


def test_an_injector_sees_every_marked_point_and_is_removed_after_its_block():
    seen: list[str] = []
    with injecting_crash_points(seen.append):
        crash_point("rows-published")
        crash_point("marker-written")
    crash_point("after the block")
    assert seen == ["rows-published", "marker-written"]


FIRST_COMMIT = f"db.commit() at sink_code.py:{line_of('db.commit()')} in publish"
REPLACE = f"os.replace() at sink_code.py:{line_of('os.replace(path')} in publish"


def inside(call: str, what: str) -> str:
    return f"inside {call}: {what}"


def reached_before(plan: FaultPlan) -> list[str]:
    """The points a plan reached, as the crash before each."""
    return sorted(where for where, fault in plan.reached_inside if fault is Fault.CRASH_BEFORE)


def test_a_clean_run_finds_every_call_out_of_python_and_the_marked_points(tmp_path):
    plan = FaultPlan([], discovering=True)
    with plan.inside("commit_epoch", 4, SINK_CODE):
        publish(tmp_path / "a.db")
    points = reached_before(plan)
    assert inside("commit_epoch", FIRST_COMMIT) in points
    assert inside("commit_epoch", REPLACE) in points
    assert inside("commit_epoch", "first-committed") in points
    # Three statements, both commits, connects and closes, the rename, with's enter and exit.
    assert sum("db.commit()" in point for point in points) == 2
    assert len(points) == 13, points
    assert not any("sorted" in point for point in points), points
    # Every point found is one to crash before and after, but a marked one only before.
    assert len(plan.reached_inside) == 2 * 12 + 1
    assert plan.reached_inside[inside("commit_epoch", FIRST_COMMIT), Fault.CRASH_AFTER] == {4}


@pytest.mark.parametrize(
    ("where", "fault", "rows"),
    [
        ("first-committed", Fault.CRASH_BEFORE, [1]),
        (FIRST_COMMIT, Fault.CRASH_BEFORE, []),
        (FIRST_COMMIT, Fault.CRASH_AFTER, [1]),
        (REPLACE, Fault.CRASH_BEFORE, [1, 2]),
    ],
)
def test_a_planned_crash_fires_just_before_or_just_after_its_point(tmp_path, where, fault, rows):
    path = tmp_path / "a.db"
    plan = FaultPlan([FaultPoint(inside("commit_epoch", where), fault, 4)])
    with (
        pytest.raises(SimulatedCrash, match=fault.value),
        plan.inside("commit_epoch", 4, SINK_CODE),
    ):
        publish(path)
    assert [row[0] for row in sqlite3.connect(path).execute("SELECT x FROM t")] == rows
    assert not path.with_suffix(".done").exists()


def test_the_hooks_are_removed_after_a_crash(tmp_path):
    plan = FaultPlan([FaultPoint(inside("pre_commit", "first-committed"), Fault.CRASH_BEFORE, 0)])
    with pytest.raises(SimulatedCrash), plan.inside("pre_commit", 0, SINK_CODE):
        publish(tmp_path / "a.db")
    assert sys.getprofile() is None
    assert sys.gettrace() is None


def test_a_call_no_profiler_reports_is_a_point_and_pure_calls_are_not(tmp_path):
    # ctypes calls report no profiler event; lmdb's types call themselves `builtins`.
    environment = lmdb.open(str(tmp_path / "kv"))
    plan = FaultPlan([], discovering=True)
    with plan.inside("commit_epoch", 0, SINK_CODE):
        put_in_lmdb(environment)
    environment.close()
    labels = {point.split(": ", 1)[1].split(" at ")[0] for point in reached_before(plan)}
    assert {
        "LIBC.getpid()",
        "environment.begin()",
        "transaction.put()",
        "with environment.begin(write=True) as transaction (enter)",
        "with environment.begin(write=True) as transaction (exit)",
    } <= labels, labels
    assert not any(pure in label for label in labels for pure in ("len", "dict")), labels


def test_each_run_of_an_instruction_in_a_call_is_a_point_of_its_own(tmp_path):
    sqlite3.connect(tmp_path / "a.db").execute("CREATE TABLE t (x)").connection.close()
    plan = FaultPlan([], discovering=True)
    with plan.inside("commit_epoch", 0, SINK_CODE):
        insert_twice(tmp_path / "a.db")
    commits = [point for point in reached_before(plan) if "db.commit()" in point]
    assert len(commits) == 2
    assert commits[1].endswith("(run 2)")
    second = FaultPoint(commits[1], Fault.CRASH_BEFORE, 0)
    with pytest.raises(SimulatedCrash), FaultPlan([second]).inside("commit_epoch", 0, SINK_CODE):
        insert_twice(tmp_path / "a.db")
    rows = sqlite3.connect(tmp_path / "a.db").execute("SELECT x FROM t").fetchall()
    assert rows == [(1,), (2,), (1,)]


def test_calls_in_the_event_loops_executor_threads_are_points_too(tmp_path):
    plan = FaultPlan([], discovering=True)

    async def commit_epoch_in_a_thread() -> None:
        with plan.inside("commit_epoch", 4, SINK_CODE):
            await asyncio.to_thread(publish, tmp_path / "a.db")

    asyncio.run(with_watched_threads(commit_epoch_in_a_thread()))
    assert inside("commit_epoch", FIRST_COMMIT) in reached_before(plan)
    assert not plan.in_own_threads


def test_an_executor_job_handed_over_by_a_task_the_sink_started_is_apart_as_the_task(tmp_path):
    # The job runs when the task does, which the scheduler decides: only a real kill there.
    plan = FaultPlan([], discovering=True)

    async def commit_epoch() -> None:
        with plan.inside("commit_epoch", 4, SINK_CODE):
            await publish_in_a_task_through_an_executor(tmp_path / "a.db")

    asyncio.run(with_watched_threads(commit_epoch()))
    handed_over = {point for point in plan.reached_inside if "create_task()" not in point[0]}
    assert handed_over, "the executor's job reaches points"
    assert handed_over == plan.in_own_tasks
    assert not plan.in_own_threads


def test_the_await_of_a_c_function_handed_to_an_executor_is_a_point(tmp_path):
    db = sqlite3.connect(tmp_path / "a.db", check_same_thread=False)
    db.execute("CREATE TABLE t (x)")
    plan = FaultPlan([], discovering=True)

    async def commit_epoch() -> None:
        with plan.inside("commit_epoch", 0, SINK_CODE):
            await commit_in_an_executor(db)

    asyncio.run(with_watched_threads(commit_epoch()))
    assert any("asyncio.to_thread()" in point for point in reached_before(plan))


def test_a_planned_crash_fires_in_an_executor_thread_and_later_calls_are_still_watched(tmp_path):
    path = tmp_path / "a.db"
    planned = FaultPoint(inside("commit_epoch", FIRST_COMMIT), Fault.CRASH_AFTER, 4)
    plan = FaultPlan([planned], discovering=True)

    async def crash_then_commit_again() -> None:
        with (
            pytest.raises(SimulatedCrash, match="db.commit"),
            plan.inside("commit_epoch", 4, SINK_CODE),
        ):
            await asyncio.to_thread(publish, path)
        with plan.inside("commit_epoch", 5, SINK_CODE):  # the recovered instance
            await asyncio.to_thread(publish, tmp_path / "b.db")

    asyncio.run(with_watched_threads(crash_then_commit_again()))
    assert [row[0] for row in sqlite3.connect(path).execute("SELECT x FROM t")] == [1]
    assert plan.reached_inside[inside("commit_epoch", FIRST_COMMIT), Fault.CRASH_AFTER] == {4, 5}
    assert sys.getprofile() is None


def test_points_in_a_thread_the_sink_started_are_found_but_only_a_kill_fires_there(tmp_path):
    jobs: list[Path] = []
    wake, done = threading.Event(), threading.Event()

    planned = FaultPoint(inside("commit_epoch", "first-committed"), Fault.CRASH_BEFORE, 0)
    plan = FaultPlan([planned])

    async def commit_epoch() -> None:
        thread = threading.Thread(target=writer, args=(wake, jobs, done))
        thread.start()
        with plan.inside("commit_epoch", 0, SINK_CODE):
            jobs.append(tmp_path / "a.db")
            wake.set()
            await asyncio.to_thread(done.wait)
        thread.join()

    asyncio.run(with_watched_threads(commit_epoch(), own_threads=True))
    found = {where for where, _ in plan.in_own_threads}
    assert (
        inside("commit_epoch", FIRST_COMMIT + " <- writer:" + str(line_of("publish(jobs"))) in found
    )
    # A simulated crash cannot stop a call from another thread: the writer ran to its end.
    assert (tmp_path / "a.done").exists()
    assert not plan.fired


def test_points_in_a_task_the_sink_started_are_found_but_only_a_kill_fires_there(tmp_path):
    in_task = f"{FIRST_COMMIT} <- _publish_later:{line_of('publish(path)')}"
    planned = FaultPoint(inside("commit_epoch", in_task), Fault.CRASH_AFTER, 0)
    plan = FaultPlan([planned], discovering=True)

    async def commit_epoch() -> None:
        with plan.inside("commit_epoch", 0, SINK_CODE):
            await publish_in_a_task(tmp_path / "a.db")

    asyncio.run(commit_epoch())
    assert (planned.where, Fault.CRASH_AFTER) in plan.in_own_tasks
    assert not plan.in_own_threads
    # Raised in the task, a crash would end the task and leave the call waiting on it: the
    # call ran to its end, and the point is kept for a real kill.
    assert (tmp_path / "a.done").exists()
    assert not plan.fired
    chosen = chosen_points(plan, PROFILES["quick"], 1)
    task_points = [point for point, kill in chosen if point.where == planned.where]
    assert task_points
    assert all(kill for point, kill in chosen if (point.where, point.fault) in plan.in_own_tasks)


def test_every_site_is_chosen_once_at_its_first_run_before_the_runs_of_a_loop(tmp_path):
    plan = FaultPlan([], discovering=True)
    with sqlite3.connect(tmp_path / "a.db") as db:
        db.execute("CREATE TABLE t (x)")
    db.close()
    with plan.inside("commit_epoch", 1, SINK_CODE):
        insert_twice(tmp_path / "a.db")
    sites = {site_of(where) for where, _ in plan.reached_inside}
    budget = dataclasses.replace(PROFILES["quick"], inside_crashes=1, inside_kills=0)
    chosen = [point.where for point, _ in chosen_points(plan, budget, 1)]
    # One point a site, at its first run, although the budget is one case.
    assert sorted(chosen) == sorted(sites)
    assert not any("(run 2)" in str(where) for where in chosen)
    assert any(str(where).endswith("(run 2)") for where, _ in plan.reached_inside)


def test_calls_are_not_traced_when_nothing_is_to_be_found_or_fired(tmp_path):
    plan = FaultPlan([FaultPoint(inside("commit_epoch", FIRST_COMMIT), Fault.CRASH_BEFORE, 9)])
    with plan.inside("commit_epoch", 4, SINK_CODE):  # the planned crash is in epoch 9
        assert sys.gettrace() is None
        publish(tmp_path / "a.db")
    assert [where for where, _ in plan.reached_inside] == [
        inside("commit_epoch", "first-committed")
    ]


def test_what_an_executor_job_does_outside_the_sinks_code_marks_the_site_that_handed_it_over():
    # `await asyncio.to_thread(conn.commit)`: no frame of the sink's code runs in the thread,
    # so what the job does out of Python belongs to the site awaiting it.
    def nothing(*_: object) -> None:
        return None

    watcher = CallWatcher(SINK_CODE, lambda site: False, nothing, nothing, nothing)
    awaiting = FrameTracer(watcher)

    def job() -> None:
        _EXECUTOR.flag, _EXECUTOR.submitter = True, awaiting
        watcher.left_python(sys._getframe())

    worker = threading.Thread(target=job)
    worker.start()
    worker.join()
    assert awaiting.impure


@pytest.mark.parametrize("in_own_task", [True, False], ids=["own-task", "calling-thread"])
def test_a_kill_the_child_did_not_reach_fails_only_at_a_point_of_the_calling_thread(in_own_task):
    # When a task or thread of the connector's own runs is the scheduler's choice: a child
    # run that did not reach such a point is no verdict; the calling thread's points always
    # come, so missing one is the kit's error.
    found = FaultPlan([], discovering=True)
    point = (
        inside("checkpoint", "consumer.poll() at _client.py:279 in consume_ready"),
        Fault.CRASH_BEFORE,
    )
    found.reached_inside[point] = {3}
    if in_own_task:
        found.in_own_tasks.add(point)
    found.trace.append(TraceEvent(0, "checkpoint", 3, "ok"))
    figures = Figures()

    def check_run(points: list[FaultPoint], killed_at: FaultPoint | None) -> list[FaultPoint]:
        if killed_at is not None:
            raise KillNotReached(f"the child process meant to be killed at {killed_at} ended")
        return points

    if in_own_task:
        crash_at_chosen_points(found, PROFILES["quick"], 1, figures, check_run)
        assert "crashed at 0 in process and 0 killed" in figures.crash_points
    else:
        with pytest.raises(AssertionError, match="killed with SIGKILL in a child process"):
            crash_at_chosen_points(found, PROFILES["quick"], 1, figures, check_run)


def test_the_fork_server_of_real_kills_ends_with_the_process_and_leaves_no_pipe_open():
    script = "from laminar_conformance._kill import _zygote\n_zygote(())\n"
    ended = subprocess.run(
        [sys.executable, "-X", "dev", "-c", script], capture_output=True, text=True, check=False
    )
    assert ended.returncode == 0, ended.stderr
    assert "ResourceWarning" not in ended.stderr, ended.stderr
