"""Fault injection: errors and crashes around a sink's protocol calls, and inside them.

The points inside a call are the ones its author marked with :func:`laminar_sdk.crash_point`,
and the ones the kit finds by itself: while a sink call runs, every C-level call that makes
something durable — a SQLite ``commit`` (or the end of ``with connection``), an ``fsync``, a
``rename`` or ``replace`` — is a point just before it (named ``sqlite3.Connection.commit#2``:
its second such call in the call). The kit watches the thread that makes the call and the
threads of the event loop's default executor (:func:`with_watched_threads`), where
``asyncio.to_thread`` and ``run_in_executor(None, ...)`` run the blocking I/O of async code.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import functools
import sys
import threading
import types
from collections import Counter
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NoReturn, TypeVar

import pyarrow as pa

from laminar_sdk import (
    ConnectorError,
    DistributedCommitSink,
    ForwardingSink,
    ProtocolStep,
    SimulatedCrash,
    SinkConnector,
    WriteResult,
    injecting_crash_points,
)

INSIDE = "inside "
"""How the ``where`` of a crash point inside a call starts: ``inside commit_epoch: NAME``."""

_DURABLE_CALLS = {
    ("sqlite3", "commit"),
    ("sqlite3", "__exit__"),
    ("posix", "fsync"),
    ("posix", "fdatasync"),
    ("posix", "rename"),
    ("posix", "replace"),
}
"""C functions (module of their owner, name) that make something durable: points before them."""


def _durable_call(function: object) -> str | None:
    owner = getattr(function, "__self__", None)
    name = getattr(function, "__name__", "")
    if isinstance(owner, types.ModuleType):
        module = owner.__name__
    else:
        module = type(owner).__module__ if owner is not None else ""
    if (module, name) not in _DURABLE_CALLS:
        return None
    owner_name = "" if isinstance(owner, types.ModuleType) else f"{type(owner).__name__}."
    return f"{module}.{owner_name}{name}"


T = TypeVar("T")

_WATCHERS: list[Callable[[object], None]] = []
"""What the innermost block of :meth:`FaultPlan.inside` now running does with a C call made
in its thread or in a watched executor thread (none outside such a block)."""


def _profile_watched(frame: types.FrameType, event: str, function: object) -> None:
    del frame
    if event == "c_call" and _WATCHERS:
        _WATCHERS[-1](function)


def _run_watched(job: list[Callable[[], T]]) -> T:
    # The job is taken out of the list the thread pool's work item holds, so that once the
    # call is over no reference to it (and to the sink behind it) is left in this thread.
    function = job.pop()
    if not _WATCHERS:  # submitted outside a sink call: nothing to watch for
        return function()
    previous = sys.getprofile()
    sys.setprofile(_profile_watched)
    try:
        return function()
    except SimulatedCrash as crash:
        # The process "died" here. The futures holding the crash outlive the call, and the
        # loop may go on before this thread is done: neither may keep the crashed instance
        # alive (an open database connection would go on holding its locks, which a killed
        # process releases), so the crash leaves without this call's frames.
        del function
        raise crash.with_traceback(None) from None
    finally:
        sys.setprofile(previous)


class _WatchedExecutor(concurrent.futures.ThreadPoolExecutor):
    """A thread pool whose work :meth:`FaultPlan.inside` watches as it does the calling thread."""

    def submit(
        self, fn: Callable[..., T], /, *args: object, **kwargs: object
    ) -> concurrent.futures.Future[T]:
        job: list[Callable[[], T]] = [functools.partial(fn, *args, **kwargs)]
        return super().submit(_run_watched, job)


async def with_watched_threads(scenario: Awaitable[T]) -> T:
    """Await ``scenario`` with the running loop's executor threads watched for crash points.

    Every scenario of sink calls runs in it, so that it is in place before the loop runs any
    call: a sink that does its durable I/O in ``asyncio.to_thread`` (the loop's default
    executor) then has its crash points found and fired there, as in the calling thread.
    """
    executor = _WatchedExecutor(thread_name_prefix="laminar-conformance")
    asyncio.get_running_loop().set_default_executor(executor)
    return await scenario


class Fault(enum.Enum):
    """What happens around one call."""

    NONE = "none"
    ERROR_BEFORE = "error-before"
    """The call fails without doing anything (the request was lost)."""
    ERROR_AFTER = "error-after"
    """The call does its work, then fails (the reply was lost)."""
    CRASH_BEFORE = "crash-before"
    """The process dies just before the call."""
    CRASH_AFTER = "crash-after"
    """The process dies just after the call returned."""
    KILL = "kill"
    """The process is killed with SIGKILL at a step (in a child process the kit starts): what
    it held in memory — unflushed buffers, a writer thread's queue — is gone."""

    def __repr__(self) -> str:
        return f"Fault.{self.name}"

    @property
    def is_crash(self) -> bool:
        """Whether the process dies (rather than the call failing)."""
        return self in (Fault.CRASH_BEFORE, Fault.CRASH_AFTER, Fault.KILL)

    @property
    def call_happens(self) -> bool:
        """Whether the call itself runs."""
        return self in (Fault.NONE, Fault.ERROR_AFTER, Fault.CRASH_AFTER)


class InjectedFault(ConnectorError):
    """A transient failure the conformance kit injected: a lost request or reply."""

    transient = True


SINK_CALLS = ("begin_epoch", "write_batch", "pre_commit", "commit_epoch", "rollback_epoch")
"""The sink calls the kit injects faults into."""

DISTRIBUTED_CALLS = ("stage", "commit_aggregated")
"""The calls of a distributed-commit sink the kit injects faults into."""


@dataclass(frozen=True, slots=True)
class FaultPoint:
    """One fault: ``fault`` at ``where`` (a protocol step or a sink call) in ``epoch``.

    At a :class:`ProtocolStep` only a crash is meaningful (the coordinator is between calls).
    """

    where: ProtocolStep | str
    fault: Fault
    epoch: int

    def __str__(self) -> str:
        if isinstance(self.where, ProtocolStep):
            how = "kill -9" if self.fault is Fault.KILL else "crash"
            return f"{how} at step {self.where.value} of epoch {self.epoch}"
        return f"{self.fault.value} {self.where} of epoch {self.epoch}"


def every_fault_point(epoch: int) -> list[FaultPoint]:
    """Every crash point of docs/epoch-protocol.md's list, and every error the runtime must handle.

    A crash at each :class:`ProtocolStep`, a crash before and after every sink call, an error
    before every sink call, and an error after every call the runtime may repeat or undo
    (not ``begin_epoch``: the contract does not require it to be idempotent).
    """
    points = [FaultPoint(step, Fault.CRASH_BEFORE, epoch) for step in ProtocolStep]
    for call in SINK_CALLS:
        faults = [Fault.CRASH_BEFORE, Fault.CRASH_AFTER, Fault.ERROR_BEFORE]
        if call != "begin_epoch":
            faults.append(Fault.ERROR_AFTER)
        points += [FaultPoint(call, fault, epoch) for fault in faults]
    return points


def every_distributed_fault_point(epoch: int) -> list[FaultPoint]:
    """Every fault the distributed path (write tasks staging, one commit) must survive.

    A crash at each :class:`ProtocolStep` (in a write task at ``write`` and ``pre-commit``),
    and a crash or an error before and after ``stage`` and ``commit_aggregated`` (both may
    be repeated: a failed task is retried, a commit finished by recovery).
    """
    points = [FaultPoint(step, Fault.CRASH_BEFORE, epoch) for step in ProtocolStep]
    faults = [Fault.CRASH_BEFORE, Fault.CRASH_AFTER, Fault.ERROR_BEFORE, Fault.ERROR_AFTER]
    for call in DISTRIBUTED_CALLS:
        points += [FaultPoint(call, fault, epoch) for fault in faults]
    return points


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One protocol call or step of a run, on one sink instance, and what happened there."""

    instance: int
    """The sink instance, counted from 0; a new one after each crash."""
    what: str
    """The call (``write_batch``) or the coordinator's step (``step commit``)."""
    epoch: int
    outcome: str
    """``ok``, or the fault injected there (``crash-before``, ``error-after``, ``crash inside
    commit_epoch: NAME``)."""


def simulated_crash(message: str) -> NoReturn:
    """Crash the runtime in process, as a killed process stops: raise :class:`SimulatedCrash`."""
    raise SimulatedCrash(message)


class FaultPlan:
    """Faults to inject, each the first time its point is reached.

    :param points: the faults; two at the same point fire on successive visits.
    :param crash: what a crash does, given what crashed where (default:
        :func:`simulated_crash`; in a child process the kit kills, the process's own kill).
    """

    def __init__(
        self, points: Iterable[FaultPoint], crash: Callable[[str], NoReturn] = simulated_crash
    ) -> None:
        self._pending = list(points)
        self.crash = crash
        self.fired: list[FaultPoint] = []
        self.reached_inside: dict[str, set[int]] = {}
        """The crash points inside calls this plan's runs reached, with their epochs."""
        self.trace: list[TraceEvent] = []
        """Every call and fault of the runs, in order: the timeline of a failure."""
        self.instance = -1
        """The sink instance the calls now go to (see :meth:`new_instance`)."""

    def new_instance(self) -> None:
        """Calls from now on go to a new sink instance (after a crash, or a new task)."""
        self.instance += 1

    def record(self, what: str, epoch: int, outcome: str) -> None:
        """Add an event to :attr:`trace`."""
        self.trace.append(TraceEvent(self.instance, what, epoch, outcome))

    @contextlib.contextmanager
    def inside(self, call: str, epoch: int) -> Iterator[None]:
        """Crash where a crash is planned at a point inside ``call`` of ``epoch``, in this block.

        The points are the marked ones (:func:`laminar_sdk.crash_point`) and those before each
        C call that makes something durable (see the module).
        """
        durable_calls: Counter[str] = Counter()
        counting = threading.Lock()  # the calling thread and executor threads may count at once

        def reached(name: str) -> None:
            where = f"{INSIDE}{call}: {name}"
            self.reached_inside.setdefault(where, set()).add(epoch)
            if self.take(where, epoch).is_crash:
                self.record(call, epoch, f"crash {where}")
                self.crash(f"injected crash {where} of epoch {epoch}")

        def on_c_call(function: object) -> None:
            name = _durable_call(function)
            if name is not None:
                with counting:
                    durable_calls[name] += 1
                    count = durable_calls[name]
                reached(f"{name}#{count}")

        previous = sys.getprofile()
        _WATCHERS.append(on_c_call)
        sys.setprofile(_profile_watched)  # this thread too
        try:
            with injecting_crash_points(reached):
                yield
        finally:
            sys.setprofile(previous)
            _WATCHERS.remove(on_c_call)

    def __len__(self) -> int:
        """How many faults are still to fire."""
        return len(self._pending)

    def take(self, where: ProtocolStep | str, epoch: int) -> Fault:
        """The fault planned for this visit of ``where`` in ``epoch`` (``NONE`` if none)."""
        for point in self._pending:
            if (point.where, point.epoch) == (where, epoch):
                self._pending.remove(point)
                self.fired.append(point)
                return point.fault
        return Fault.NONE

    async def call(self, where: str, epoch: int, call: Callable[[], Awaitable[object]]) -> None:
        """Run the sink call ``where`` of ``epoch`` with its planned fault, on the timeline.

        Crash points inside it are reached as :meth:`inside` says.
        """

        async def inside() -> None:
            with self.inside(where, epoch):
                await call()

        fault = self.take(where, epoch)
        # Recorded once the call is over, where it started (a crash inside records its own).
        at, instance = len(self.trace), self.instance
        outcome = "ok" if fault is Fault.NONE else fault.value
        try:
            await inject(fault, where, epoch, inside, self.crash)
        except (SimulatedCrash, InjectedFault):
            if fault is Fault.NONE:
                outcome = ""  # a crash inside the call: recorded where it happened
            raise
        except Exception as error:
            outcome = f"raised {type(error).__name__}"
            raise
        finally:
            if outcome:
                self.trace.insert(at, TraceEvent(instance, where, epoch, outcome))

    def observe(self, step: ProtocolStep, epoch: int) -> None:
        """A coordinator observer: crash (or kill) where one is planned."""
        fault = self.take(step, epoch)
        if fault is not Fault.NONE:
            outcome = "crash: kill -9" if fault is Fault.KILL else "crash"
            self.record(f"step {step.value}", epoch, outcome)
            self.crash(f"injected {FaultPoint(step, fault, epoch)}")


async def inject(
    fault: Fault,
    where: str,
    epoch: int,
    call: Callable[[], Awaitable[object]],
    crash: Callable[[str], NoReturn] = simulated_crash,
) -> None:
    """Run ``call`` with ``fault`` around it.

    :param crash: what a crash does (see :class:`FaultPlan`).
    :raises SimulatedCrash: for a crash, by default.
    :raises InjectedFault: for an error.
    """
    if fault.call_happens:
        await call()
    if fault.is_crash:
        crash(f"injected {fault.value} {where} of epoch {epoch}")
    if fault is not Fault.NONE:
        raise InjectedFault(f"injected {fault.value} {where} of epoch {epoch}")


class FaultyDistributedCommit(DistributedCommitSink):
    """Wraps a sink's distributed commit, injecting a :class:`FaultPlan`'s faults into it."""

    def __init__(self, staging: DistributedCommitSink, plan: FaultPlan) -> None:
        self._staging = staging
        self._plan = plan

    async def stage(self, epoch: int, task: str, batches: AsyncIterable[pa.RecordBatch]) -> str:
        """``stage``, with its planned fault."""
        descriptors: list[str] = []

        async def stage() -> None:
            descriptors.append(await self._staging.stage(epoch, task, batches))

        await self._plan.call("stage", epoch, stage)
        return descriptors[0]

    async def commit_aggregated(self, epoch: int, descriptors: Sequence[str]) -> None:
        """``commit_aggregated``, with its planned fault."""
        commit = self._staging.commit_aggregated
        await self._plan.call("commit_aggregated", epoch, lambda: commit(epoch, descriptors))


class FaultySink(ForwardingSink):
    """Wraps an opened sink, injecting the faults a :class:`FaultPlan` holds into its calls."""

    def __init__(self, sink: SinkConnector, plan: FaultPlan) -> None:
        super().__init__(sink)
        self._plan = plan
        self._epoch = -1
        plan.new_instance()

    async def begin_epoch(self, epoch: int) -> None:
        """``begin_epoch``, with its planned fault."""
        self._epoch = epoch
        await self._plan.call("begin_epoch", epoch, lambda: self.wrapped.begin_epoch(epoch))

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        """``write_batch``, with its planned fault."""
        results: list[WriteResult] = []

        async def write() -> None:
            results.append(await self.wrapped.write_batch(batch))

        await self._plan.call("write_batch", self._epoch, write)
        return results[0]

    async def pre_commit(self, epoch: int) -> None:
        """``pre_commit``, with its planned fault."""
        await self._plan.call("pre_commit", epoch, lambda: self.wrapped.pre_commit(epoch))

    async def commit_epoch(self, epoch: int) -> None:
        """``commit_epoch``, with its planned fault."""
        await self._plan.call("commit_epoch", epoch, lambda: self.wrapped.commit_epoch(epoch))

    async def rollback_epoch(self, epoch: int) -> None:
        """``rollback_epoch``, with its planned fault."""
        await self._plan.call("rollback_epoch", epoch, lambda: self.wrapped.rollback_epoch(epoch))

    def as_distributed_commit(self) -> DistributedCommitSink | None:
        """The wrapped sink's distributed commit, with the planned faults, if it offers one."""
        staging = self.wrapped.as_distributed_commit()
        return None if staging is None else FaultyDistributedCommit(staging, self._plan)
