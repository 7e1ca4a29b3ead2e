"""What a sink's calls run, for test_crash_points.py: this module plays the connector's code."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

from laminar_sdk import crash_point

LIBC = ctypes.CDLL(ctypes.util.find_library("c"))


def publish(path: Path) -> None:
    """Two transactions and a rename, with a marked point between the transactions."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE IF NOT EXISTS t (x)")
    db.close()
    db = sqlite3.connect(path)
    ids = sorted({2, 1})  # the interpreter's own computation: no point
    db.execute("INSERT INTO t VALUES (?)", (ids[0],))
    db.commit()
    crash_point("first-committed")
    db.execute("INSERT INTO t VALUES (?)", (ids[1],))
    db.commit()
    db.close()
    os.replace(path, path.with_suffix(".done"))


def put_in_lmdb(environment: Any) -> None:
    """A ctypes call (no profiler event) and an extension whose types call themselves builtins."""
    count = len(dict.fromkeys([1, 2]))  # no point
    LIBC.getpid()
    with environment.begin(write=True) as transaction:
        transaction.put(b"k", str(count).encode())


def insert_twice(path: Path) -> None:
    """One instruction run twice in a call: each run is a point of its own."""
    db = sqlite3.connect(path)
    for value in (1, 2):
        db.execute("INSERT INTO t VALUES (?)", (value,))
        db.commit()
    db.close()


def writer(wake: threading.Event, jobs: list[Path], done: threading.Event) -> None:
    """A thread the sink starts before its call, publishing when woken."""
    wake.wait()
    publish(jobs.pop())
    done.set()


def line_of(text: str) -> int:
    """The line of this module that holds ``text``."""
    lines = Path(__file__).read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if text in line)


async def commit_in_an_executor(db: sqlite3.Connection) -> None:
    """Hands a C function itself to the loop's executor: no frame of this module runs there."""
    db.execute("INSERT INTO t VALUES (1)")
    await asyncio.to_thread(db.commit)


async def publish_in_a_task(path: Path) -> None:
    """A task the sink starts and waits for: its work runs apart from the call's own task."""
    await asyncio.get_running_loop().create_task(_publish_later(path))


async def _publish_later(path: Path) -> None:
    publish(path)


async def publish_in_a_task_through_an_executor(path: Path) -> None:
    """A task the sink starts hands the work to the loop's executor, and the call waits."""
    await asyncio.get_running_loop().create_task(_publish_in_an_executor(path))


async def _publish_in_an_executor(path: Path) -> None:
    await asyncio.to_thread(publish, path)
