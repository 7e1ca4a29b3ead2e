"""Opening and closing connectors inside Spark's Python workers, and running their coroutines.

Spark calls the bridge synchronously; connectors are asynchronous. A call that needs one
coroutine runs it with :func:`run`, on the process's bridge loop; what must outlive one call —
a source kept open across Spark's planning calls, a stream of batches Spark pulls one at a
time — runs on an ``asyncio.Runner`` that the bridge keeps for it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

from laminar_sdk._contract.connector import SinkConnector, SourceConnector
from laminar_sdk._contract.state import StateStore, connector_space
from laminar_sdk._spark import fault_seam
from laminar_sdk._spark.options import BridgeOptions, checkpointer_of

logger = logging.getLogger("laminar_sdk.spark")

T = TypeVar("T")


@contextlib.asynccontextmanager
async def opened_source(options: BridgeOptions) -> AsyncIterator[SourceConnector]:
    """The source ``options`` name, opened for the block and closed after it.

    Its configuration carries its :class:`StateStore` when the options name a laminar
    checkpoint location. It is the plugin's own instance, unless a test kit asks for a kill
    during its reads (:func:`laminar_sdk._spark.fault_seam.opened_source`).

    :raises ConfigurationError: for bad configuration.
    :raises PluginError: when the plugin's factory or ``open`` fails, naming it.
    """
    opened, _ = await options.registry().open_source(
        options.connector, options.properties, state_store=connector_state_store(options)
    )
    source = fault_seam.opened_source(opened)
    try:
        yield source
    finally:
        await _close(source, options)


@contextlib.asynccontextmanager
async def opened_sink(options: BridgeOptions) -> AsyncIterator[SinkConnector]:
    """The sink ``options`` name, opened for the block and closed after it (see above).

    It is the plugin's own instance, unless a test kit asks for a kill inside its
    ``pre_commit`` or ``stage`` (:func:`laminar_sdk._spark.fault_seam.opened_sink`).
    """
    opened, _ = await options.registry().open_sink(
        options.connector, options.properties, state_store=connector_state_store(options)
    )
    sink = fault_seam.opened_sink(opened)
    try:
        yield sink
    finally:
        await _close(sink, options)


def connector_state_store(options: BridgeOptions) -> StateStore | None:
    """The connector's own :class:`StateStore` in the laminar checkpoint location, if any."""
    if options.checkpoint_location is None:
        return None
    return checkpointer_of(options).state_store(
        connector_space(str(options.role), options.connector)
    )


class KeptSource:
    """A source opened once and kept open, with the event loop it was opened in.

    For calls Spark makes one after another in one long-lived process (the planning of
    micro-batches): opening the source once saves a connection per call. Every call runs on
    the same loop, so a client bound to its loop keeps working. :meth:`close` it when done.

    :raises ConfigurationError: for bad configuration.
    :raises PluginError: when the plugin's factory or ``open`` fails, naming it.
    """

    def __init__(self, options: BridgeOptions) -> None:
        self._runner = asyncio.Runner()
        self._stack = contextlib.AsyncExitStack()
        try:
            self.source = self._runner.run(self._stack.enter_async_context(opened_source(options)))
        except BaseException:
            self._runner.close()
            raise

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` (a call on :attr:`source`) on the source's loop."""
        return self._runner.run(coroutine)

    def close(self) -> None:
        """Close the source (a failure is logged, not raised) and the loop."""
        try:
            self._runner.run(self._stack.aclose())
        finally:
            self._runner.close()


_RUNNERS: dict[int, asyncio.Runner] = {}
"""The bridge loop of this process, by process id (a forked child makes its own)."""


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to its end, as ``asyncio.run`` does, on this process's bridge loop.

    Spark calls the bridge again and again in the same Python worker: a commit per
    micro-batch, a plan per trigger. ``asyncio.run`` made a new event loop for every call, and
    with it new threads for the blocking calls of checkpoint stores and connectors
    (``asyncio.to_thread``), joined again when the call ended — about 20 ms of a 1-row
    micro-batch's commit on a loaded 2-core machine. One loop per process keeps its threads.
    As ``asyncio.run`` does, it cancels the tasks the coroutine leaves behind.
    """
    runner = _RUNNERS.get(os.getpid())
    if runner is None:
        _RUNNERS.clear()
        runner = _RUNNERS[os.getpid()] = asyncio.Runner()
        atexit.register(runner.close)
    try:
        return runner.run(coroutine)
    finally:
        _cancel_left_behind(runner.get_loop())


def _cancel_left_behind(loop: asyncio.AbstractEventLoop) -> None:
    tasks = asyncio.all_tasks(loop)
    if tasks:
        for task in tasks:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


def iterate(items: AsyncIterator[T]) -> Iterator[T]:
    """``items`` as a plain iterator: each item is awaited when the consumer asks for it.

    Nothing is read ahead, so memory holds one item at a time. When the consumer stops early,
    ``items`` is closed (its ``finally`` blocks and context managers run).
    """
    with asyncio.Runner() as runner:
        try:
            while (step := runner.run(_next(items))) is not None:
                yield step[0]
        finally:
            runner.run(_close_iterator(items))


async def _next(items: AsyncIterator[T]) -> tuple[T] | None:
    """``(item,)``, or ``None`` at the end (an item may itself be ``None``)."""
    try:
        return (await anext(items),)
    except StopAsyncIteration:
        return None


async def _close_iterator(items: AsyncIterator[T]) -> None:
    close = getattr(items, "aclose", None)
    if close is not None:
        await close()


async def _close(connector: SourceConnector | SinkConnector, options: BridgeOptions) -> None:
    # A failing close must not fail a micro-batch whose work is done (or hide why it failed).
    try:
        await connector.close()
    except Exception:
        logger.exception("closing %s connector %r failed", options.role, options.connector)
