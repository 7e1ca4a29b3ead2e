"""Fault injection: errors and crashes around a connector's protocol calls, and inside them.

The points inside a call are the ones its author marked with :func:`laminar_sdk.crash_point`,
and the ones the kit finds by tracing the call (:mod:`laminar_conformance._call_sites`): before
and after each instruction of the connector's own code that left Python — a driver's commit,
an ``fsync``, a C extension's function, whatever its name — named by its source and place
(``inside commit_epoch: db.commit() at sink.py:42``). The kit traces the thread that makes
the call, the threads of the event loop's default executor (:func:`with_watched_threads`),
where ``asyncio.to_thread`` and ``run_in_executor(None, ...)`` run the blocking I/O of async
code, and threads the connector starts itself (where only a real kill can crash).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import functools
import gc
import sys
import threading
import types
import warnings
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn, TypeVar

import pyarrow as pa

from laminar_conformance._call_sites import (
    _EXECUTOR,
    Apart,
    CallWatcher,
    ConnectorCode,
    FrameTracer,
    Site,
    innermost_site,
)
from laminar_sdk import (
    ConnectorError,
    DistributedCommitSink,
    ForwardingSink,
    ProtocolStep,
    SinkConnector,
    SourceBatch,
    SourceCheckpoint,
    SourceConnector,
    WriteResult,
)
from laminar_sdk.faults import SimulatedCrash, injecting_crash_points

if TYPE_CHECKING:
    from _typeshed import TraceFunction

INSIDE = "inside "
"""How the ``where`` of a crash point inside a call starts: ``inside commit_epoch: NAME``."""

T = TypeVar("T")

_WATCHERS: list[CallWatcher] = []
"""The watchers of the :meth:`FaultPlan.inside` blocks now running, innermost last."""


def _profile_watched(frame: types.FrameType, event: str, arg: object) -> None:
    if _WATCHERS:
        _WATCHERS[-1].profile(frame, event, arg)


def _trace_watched(frame: types.FrameType, event: str, arg: object) -> TraceFunction | None:
    del event, arg
    return _WATCHERS[-1].trace(frame) if _WATCHERS else None


@contextlib.contextmanager
def _watching_this_thread() -> Iterator[None]:
    previous = sys.getprofile(), sys.gettrace()
    sys.setprofile(_profile_watched)
    sys.settrace(_trace_watched)
    try:
        yield
    finally:
        sys.setprofile(previous[0])
        sys.settrace(previous[1])


def _run_watched(
    job: list[Callable[[], T]], submitter: FrameTracer | None, handed_over_by: Apart | None
) -> T:
    # The job is taken out of the list the thread pool's work item holds, so that once the
    # call is over no reference to it (and to the sink behind it) is left in this thread.
    function = job.pop()
    if not _WATCHERS:  # submitted outside a sink call: nothing to watch for
        return function()
    _EXECUTOR.flag, _EXECUTOR.submitter, _EXECUTOR.apart = True, submitter, handed_over_by
    try:
        with _watching_this_thread():
            return function()
    except SimulatedCrash as crash:
        # The process "died" here. The futures holding the crash outlive the call, and the
        # loop may go on before this thread is done: neither may keep the crashed instance
        # alive (an open database connection would go on holding its locks, which a killed
        # process releases), so the crash leaves without this call's frames.
        del function
        raise crash.with_traceback(None) from None
    finally:
        _EXECUTOR.flag, _EXECUTOR.submitter, _EXECUTOR.apart = False, None, None


class _WatchedExecutor(concurrent.futures.ThreadPoolExecutor):
    """A thread pool whose work :meth:`FaultPlan.inside` watches as it does the calling thread."""

    def submit(
        self, fn: Callable[..., T], /, *args: object, **kwargs: object
    ) -> concurrent.futures.Future[T]:
        job: list[Callable[[], T]] = [functools.partial(fn, *args, **kwargs)]
        # What the job does belongs to the connector's site that handed it over (``await
        # asyncio.to_thread(connection.commit)`` has no frame of the connector in the thread).
        # A job handed over by a task the connector started runs when that task does.
        watcher = _WATCHERS[-1] if _WATCHERS else None
        submitter = innermost_site(watcher)
        handed_over_by = None if watcher is None else watcher.apart()
        return super().submit(_run_watched, job, submitter, handed_over_by)


async def with_watched_threads(scenario: Awaitable[T], *, own_threads: bool = False) -> T:
    """Await ``scenario`` with the threads a sink call may use watched for crash points.

    Every scenario of sink calls runs in it, so that it is in place before the loop runs any
    call: a sink that does its I/O in ``asyncio.to_thread`` (the loop's default executor) then
    has its crash points found and fired there, as in the calling thread.

    :param own_threads: also hook every thread started in the scenario (from the sink's
        ``open`` on), so that the points in threads the sink starts itself are found too. Only
        for the scenarios that look for points: the hooks slow every Python call in those
        threads.
    """
    executor = _WatchedExecutor(thread_name_prefix="laminar-conformance")
    asyncio.get_running_loop().set_default_executor(executor)
    if not own_threads:
        return await scenario
    previous = threading.getprofile(), threading.gettrace()
    threading.setprofile(_profile_watched)
    threading.settrace(_trace_watched)
    try:
        return await scenario
    finally:
        threading.setprofile(previous[0])
        threading.settrace(previous[1])


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


def release_crashed_run(crash: SimulatedCrash) -> None:
    """Let go of what a crashed run held, before the next opens anything.

    What a killed process held goes with it (open connections, database locks): the crash's
    frames, which hold the dead instances, are dropped — the finished tasks and futures it
    went through (a call in an executor thread, the coordinator's timeout) still hold the
    exception — and collected.
    """
    crash.with_traceback(None)
    gc.collect()


@contextlib.contextmanager
def collecting_only_what_it_makes() -> Iterator[None]:
    """Run a check whose crashed runs :func:`release_crashed_run` collects, cheaply.

    What lived before the check (the modules, pytest's and Hypothesis's state) cannot be what
    a crashed run left: it is frozen (:func:`gc.freeze`) for the check, so each collection
    only looks at what the check made — under a millisecond instead of about 100 ms a crash
    in a process that has imported pyarrow, Hypothesis and a driver. A process that froze
    objects itself is left as it is.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def dropping_what_crashes_left() -> Iterator[None]:
    """Run runs that crash in process in this block, and collect what they left at its end.

    A coroutine a simulated crash left unstarted (made, then crashed before it was awaited or
    made a task) is dropped without Python's "never awaited" warning, whenever the dead
    instance is collected: a killed process leaves no warning either.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)
        try:
            yield
        finally:
            gc.collect()


class KillNotReached(AssertionError):
    """The child process ran its epochs to their end without reaching its kill.

    For a point the connector's calling thread reaches, a kit error; for one reached in a task
    or thread the connector starts itself, the scheduler's choice (see
    :func:`~laminar_conformance._inside_crashes.crash_at_chosen_points`).
    """


class FaultPlan:
    """Faults to inject, each the first time its point is reached.

    :param points: the faults; two at the same point fire on successive visits.
    :param crash: what a crash does, given what crashed where (default:
        :func:`simulated_crash`; in a child process the kit kills, the process's own kill).
    :param discovering: find every crash point the calls reach (tracing them all, slowly);
        otherwise calls are traced only where a crash inside them is planned.
    """

    def __init__(
        self,
        points: Iterable[FaultPoint],
        crash: Callable[[str], NoReturn] = simulated_crash,
        *,
        discovering: bool = False,
    ) -> None:
        self._pending = list(points)
        self.crash = crash
        self.fired: list[FaultPoint] = []
        self.reached_inside: dict[tuple[str, Fault], set[int]] = {}
        """The crash points inside calls this plan's runs reached (where, and a crash before
        or after it), with their epochs."""
        self.in_own_threads: set[tuple[str, Fault]] = set()
        """Those of :attr:`reached_inside` reached in a thread the connector started, where
        only a real kill crashes the process."""
        self.in_own_tasks: set[tuple[str, Fault]] = set()
        """Those reached in an asyncio task the connector started: a crash raised there
        would end the task, not the call waiting for it, so only a real kill crashes there."""
        self.trace: list[TraceEvent] = []
        """Every call and fault of the runs, in order: the timeline of a failure."""
        self.instance = -1
        """The sink instance the calls now go to (see :meth:`new_instance`)."""
        self.discovering = discovering

    def new_instance(self) -> None:
        """Calls from now on go to a new sink instance (after a crash, or a new task)."""
        self.instance += 1

    def record(self, what: str, epoch: int, outcome: str) -> None:
        """Add an event to :attr:`trace`."""
        self.trace.append(TraceEvent(self.instance, what, epoch, outcome))

    @property
    def kills(self) -> bool:
        """Whether a crash is a real kill of the process (so it works in any thread)."""
        return self.crash is not simulated_crash

    @contextlib.contextmanager
    def inside(self, call: str, epoch: int, code: ConnectorCode) -> Iterator[None]:
        """Crash where a crash is planned at a point inside ``call`` of ``epoch``, in this block.

        The points are the marked ones (:func:`laminar_sdk.crash_point`) and those before and
        after each site of ``code`` that leaves Python (see the module), traced only when
        discovering or when a crash inside ``call`` of ``epoch`` is planned.
        """
        prefix = f"{INSIDE}{call}: "
        planned = [
            point.where
            for point in self._pending
            if isinstance(point.where, str) and point.where.startswith(prefix)
            if point.epoch == epoch
        ]

        def wanted(site: Site) -> bool:
            if not planned or (watcher.apart() and not self.kills):
                return False
            place = prefix + site.place
            return any(where.startswith(place) for where in planned)

        def crash_if_planned(where: str, fault: Fault) -> None:
            if self.take(where, epoch, fault) is Fault.NONE:
                return
            self.record(call, epoch, f"{fault.value} {where}")
            self.crash(f"injected {fault.value} {where} of epoch {epoch}")

        def marked(name: str) -> None:
            point = (prefix + name, Fault.CRASH_BEFORE)
            self.reached_inside.setdefault(point, set()).add(epoch)
            apart = watcher.apart()
            self._note_apart(point, apart)
            if self.kills or not apart:
                crash_if_planned(*point)

        def before(site: Site) -> None:
            crash_if_planned(f"{prefix}{site}", Fault.CRASH_BEFORE)

        def after(site: Site) -> None:
            crash_if_planned(f"{prefix}{site}", Fault.CRASH_AFTER)

        def visited(site: Site, apart: Apart | None) -> None:
            for fault in (Fault.CRASH_BEFORE, Fault.CRASH_AFTER):
                point = (f"{prefix}{site}", fault)
                self.reached_inside.setdefault(point, set()).add(epoch)
                self._note_apart(point, apart)

        watcher = CallWatcher(code, wanted, before, after, visited)
        if not (self.discovering or planned):
            with injecting_crash_points(marked):  # no tracing: nothing to find or fire
                yield
            return
        _WATCHERS.append(watcher)
        try:
            with _watching_this_thread(), injecting_crash_points(marked):
                yield
        finally:
            _WATCHERS.remove(watcher)

    def _note_apart(self, point: tuple[str, Fault], apart: Apart | None) -> None:
        if apart == "thread":
            self.in_own_threads.add(point)
        elif apart == "task":
            self.in_own_tasks.add(point)

    def __len__(self) -> int:
        """How many faults are still to fire."""
        return len(self._pending)

    def take(self, where: ProtocolStep | str, epoch: int, fault: Fault | None = None) -> Fault:
        """The fault planned for this visit of ``where`` in ``epoch`` (``NONE`` if none).

        :param fault: only that fault (a crash before or after a point inside a call).
        """
        for point in self._pending:
            if (point.where, point.epoch) == (where, epoch) and fault in (None, point.fault):
                self._pending.remove(point)
                self.fired.append(point)
                return point.fault
        return Fault.NONE

    async def call(
        self, where: str, epoch: int, code: ConnectorCode, call: Callable[[], Awaitable[object]]
    ) -> None:
        """Run the sink call ``where`` of ``epoch`` with its planned fault, on the timeline.

        Crash points inside it, in ``code``, are reached as :meth:`inside` says.
        """

        async def inside() -> None:
            with self.inside(where, epoch, code):
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
        self._code = ConnectorCode.of(staging)

    async def stage(self, epoch: int, task: str, batches: AsyncIterable[pa.RecordBatch]) -> str:
        """``stage``, with its planned fault."""
        descriptors: list[str] = []

        async def stage() -> None:
            descriptors.append(await self._staging.stage(epoch, task, batches))

        await self._plan.call("stage", epoch, self._code, stage)
        return descriptors[0]

    async def commit_aggregated(self, epoch: int, descriptors: Sequence[str]) -> None:
        """``commit_aggregated``, with its planned fault."""
        commit = self._staging.commit_aggregated
        await self._plan.call(
            "commit_aggregated", epoch, self._code, lambda: commit(epoch, descriptors)
        )


class FaultySink(ForwardingSink):
    """Wraps an opened sink, injecting the faults a :class:`FaultPlan` holds into its calls."""

    def __init__(self, sink: SinkConnector, plan: FaultPlan) -> None:
        super().__init__(sink)
        self._plan = plan
        self._epoch = -1
        innermost = sink
        while isinstance(innermost, ForwardingSink):
            innermost = innermost.wrapped
        self._code = ConnectorCode.of(innermost)
        plan.new_instance()

    async def begin_epoch(self, epoch: int) -> None:
        """``begin_epoch``, with its planned fault."""
        self._epoch = epoch
        await self._plan.call(
            "begin_epoch", epoch, self._code, lambda: self.wrapped.begin_epoch(epoch)
        )

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        """``write_batch``, with its planned fault."""
        results: list[WriteResult] = []

        async def write() -> None:
            results.append(await self.wrapped.write_batch(batch))

        await self._plan.call("write_batch", self._epoch, self._code, write)
        return results[0]

    async def pre_commit(self, epoch: int) -> None:
        """``pre_commit``, with its planned fault."""
        await self._plan.call(
            "pre_commit", epoch, self._code, lambda: self.wrapped.pre_commit(epoch)
        )

    async def commit_epoch(self, epoch: int) -> None:
        """``commit_epoch``, with its planned fault."""
        await self._plan.call(
            "commit_epoch", epoch, self._code, lambda: self.wrapped.commit_epoch(epoch)
        )

    async def rollback_epoch(self, epoch: int) -> None:
        """``rollback_epoch``, with its planned fault."""
        await self._plan.call(
            "rollback_epoch", epoch, self._code, lambda: self.wrapped.rollback_epoch(epoch)
        )

    def as_distributed_commit(self) -> DistributedCommitSink | None:
        """The wrapped sink's distributed commit, with the planned faults, if it offers one."""
        staging = self.wrapped.as_distributed_commit()
        return None if staging is None else FaultyDistributedCommit(staging, self._plan)


class FaultySource:
    """An opened source's protocol calls in ``epoch``, with a :class:`FaultPlan`'s crashes inside.

    Only what a run of epochs calls is here (``restore``, ``poll_batch``, ``checkpoint`` and
    ``close``): the kit's runner is its one user.
    """

    def __init__(self, source: SourceConnector, plan: FaultPlan, epoch: int) -> None:
        self.wrapped = source
        self._plan = plan
        self._epoch = epoch
        self._code = ConnectorCode.of(source)
        plan.new_instance()

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        """``restore``, with the crashes planned inside it."""
        restore = self.wrapped.restore
        await self._plan.call("restore", self._epoch, self._code, lambda: restore(checkpoint))

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        """``poll_batch``, with the crashes planned inside it."""
        polled: list[SourceBatch | None] = []

        async def poll() -> None:
            polled.append(await self.wrapped.poll_batch(max_records))

        await self._plan.call("poll_batch", self._epoch, self._code, poll)
        return polled[0]

    def checkpoint(self) -> SourceCheckpoint:
        """``checkpoint``, with the crashes planned inside it."""
        with self._plan.inside("checkpoint", self._epoch, self._code):
            taken = self.wrapped.checkpoint()
        self._plan.record("checkpoint", self._epoch, "ok")
        return taken

    async def close(self) -> None:
        """The source's ``close`` (no fault: a crashed instance is never closed)."""
        await self.wrapped.close()
