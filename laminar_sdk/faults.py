"""Fault injection for test kits: crashes in process, and pipelines killed at crash points.

Nothing here runs in production: the runtime reaches this module through one seam, which
returns at once unless a fault is configured. Test kits (the conformance kit, the SDK's own
tests, a plugin's crash tests) use it in two ways.

**In process.** :class:`SimulatedCrash` is the stand-in for ``kill -9`` inside a process: the
epoch coordinator lets it through without rolling back or closing anything. A kit raises it
from a coordinator :data:`~laminar_sdk.StepObserver`, or from an injector it installs with
:func:`injecting_crash_points`, which is called at each :func:`laminar_sdk.crash_point` a
connector marks.

**Killing a Spark pipeline.** Set :data:`CRASH_AT_VARIABLE` to ``STEP:EPOCH`` — or
``STEP:EPOCH:WHEN`` for the steps that kill *during* a call — in the environment of the process
that starts the Spark session: Spark's driver JVM and its Python workers inherit it. (``@FILE``
instead reads the point from ``FILE`` whenever a connector is opened or committed: a driver can
then start, and even run other queries, before its crash point is chosen.) When the pipeline
reaches the point, the Python worker that reached it SIGKILLs the driver JVM (found among its
ancestors), then itself: the whole pipeline stops as after ``kill -9``, with no rollback, close
or Spark commit log entry (the other Python workers exit when their connection to the JVM
breaks). Restarting the query from the same checkpoint location must then deliver every record
exactly once (at least once with at-least-once delivery). Linux only (the JVM is found through
``/proc``), and ``local`` masters only (on a cluster, the JVM above a task's worker is an
executor's).

The crash points (the table in docs/epoch-protocol.md), by ``STEP`` (``EPOCH`` is Spark's batch id):

==  =====================  =================================================================
 1  ``write``              before a batch is written (``write_batch``; a distributed sink's
                           write task: before each batch it hands to ``stage``)
 2  ``pre-commit``         after the last write, before ``pre_commit`` (distributed: after
                           ``stage`` took the last batch)
 3  ``pre-commit-inside``  *during* ``pre_commit`` (distributed: while ``stage`` makes the
                           task's staging durable, after it took the last batch)
 4  ``manifest``           after ``pre_commit``, before the epoch's manifest is durable
 5  ``commit``             after the manifest is durable, before ``commit_epoch``
 6  ``commit-inside``      *during* ``commit_epoch`` / ``commit_aggregated``
 7  ``committed-manifest`` after ``commit_epoch``, before the manifest says committed
 8  ``done``               after the manifest says committed, before Spark's commit log (Spark
                           re-runs the micro-batch)
 9  ``source-read``        *during* the source's reads of the micro-batch: ``restore`` and
                           ``poll_batch``, or ``read_range`` in a task
10  ``checkpoint-write``   *while the checkpoint store writes* the epoch's manifest (pending,
                           then committed) and the latest pointer; the write is torn
==  =====================  =================================================================

Points 1, 2, 4, 5, 7 and 8 fall between two calls and are observed through the coordinator's
:class:`ProtocolStep` callbacks (:func:`crash_observer`), like 6 and 10, whose calls the
callbacks bracket. Points 3 and 9 are inside calls the coordinator does not bracket: the bridge
wraps the connectors it opens (:func:`watched_sink`, :func:`watched_source`) — with no
cooperation from the plugin, and no wrapper at all when the variable does not name such a
point.

``WHEN`` places the kill inside the call (default ``1``):

- ``K``: just before the K-th *event* of the call. An event is an I/O operation Python audits
  (:func:`sys.addaudithook`): a file opened for writing, renamed, linked, removed or
  truncated, a directory made or removed, a socket connected or sent on — for a source also a
  file opened for reading or a directory listed — a crash point the connector marks
  (:func:`laminar_sdk.crash_point`: the only events of I/O done in C, such as a database
  client's), or the return of a call (each ``restore`` / ``poll_batch`` of a source's read,
  each batch ``read_range`` yields). When the call ends
  before its K-th event, the kill comes right after it.
- ``Nms``: N milliseconds after the call started, or right after it when it ends sooner — for
  connectors whose I/O Python cannot see (a network client written in C).

For ``checkpoint-write`` the events are the store's writes while it saves the pending manifest
and moves the latest pointer, the end of that, then its writes while it saves the committed
manifest, and the end of that. The kill tears the write it interrupts: a file being published
(renamed or linked into place) is cut to half its length first and published so, and a file
opened for writing just before is cut to half — the torn manifest or latest pointer a store
without atomic writes, or a file system losing unsynced data, leaves behind. Recovery must
pass over it.

For ``source-read``, ``EPOCH`` is the micro-batch's batch id in a Spark task (``read_range``).
Spark's planning process, which polls a source that is not range-readable and writes each
micro-batch to the read log while the source is open (a kill at the read's end comes after the
log entry is durable, before Spark's offset log names it), is not told batch ids: there ``EPOCH``
counts the reads that process made, from 0 — equal to the batch id in a query's first run, and
``EPOCH`` minus the batches in Spark's offset log after a restart.

:data:`CRASH_RECORD_VARIABLE` names a file the hook appends a line of JSON to before it kills:
which point fired, in which process, at which event, and what it tore — proof for a test that
the crash happened where it asked.

:data:`KILL_WRITER_VARIABLE` kills one write task's Python worker instead, in the middle of its
write.

These exist for the conformance kit and the SDK's own tests; nothing reads the variables unless
a laminar connector is opened or committed, and a production environment never sets them.
"""

from __future__ import annotations

import asyncio
import enum
import json
import os
import re
import signal
import sys
import threading
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pyarrow as pa

from laminar_sdk._contract.checkpoint import SourceCheckpoint
from laminar_sdk._contract.config import ConnectorConfig
from laminar_sdk._contract.connector import SinkConnector, SourceConnector
from laminar_sdk._contract.crash_points import (
    CRASH_AT_FILE_PREFIX,
    CRASH_AT_VARIABLE,
    CRASH_RECORD_VARIABLE,
    KILL_EPOCH_WRITER_VARIABLE,
    KILL_WRITER_VARIABLE,
    CrashPointInjector,
    crash_point,
    injecting_crash_points,
    install_crash_point_injector,
)
from laminar_sdk._contract.errors import ConfigurationError
from laminar_sdk._contract.forwarding import ForwardingSink
from laminar_sdk._contract.parallel import (
    DistributedCommitSink,
    PartitionRange,
    RangeReadableSource,
)
from laminar_sdk._contract.schema import (
    SchemaEvolvable,
    SchemaInferable,
    SchemaProvider,
    SchemaRegistryAware,
)
from laminar_sdk._contract.types import (
    ConnectorMetrics,
    HealthStatus,
    SourceBatch,
)
from laminar_sdk._runtime.coordinator import ProtocolStep, SimulatedCrash, StepObserver
from laminar_sdk._spark.processes import spark_jvm

__all__ = [
    "CRASH_AT_FILE_PREFIX",
    "CRASH_AT_VARIABLE",
    "CRASH_RECORD_VARIABLE",
    "EPOCH_WRITER_KILLED",
    "KILL_EPOCH_WRITER_VARIABLE",
    "KILL_WRITER_VARIABLE",
    "CrashPoint",
    "CrashPointInjector",
    "CrashStep",
    "SimulatedCrash",
    "configured_crash_point",
    "crash_observer",
    "crash_point",
    "crash_recorded",
    "epoch_writer_killer",
    "injecting_crash_points",
    "kill_pipeline",
    "kill_writer_once",
    "watched_sink",
    "watched_source",
]

T = TypeVar("T")

Kill = Callable[[], NoReturn]
"""What ends the pipeline: :func:`kill_pipeline`, or for a test of the hook, a stand-in."""


class CrashStep(enum.Enum):
    """The ten crash points, in their order, by the names the hook accepts.

    The points between two calls are the coordinator's :class:`~laminar_sdk.ProtocolStep`
    values; the four others fall inside a call.
    """

    WRITE = ProtocolStep.WRITE.value
    PRE_COMMIT = ProtocolStep.PRE_COMMIT.value
    PRE_COMMIT_INSIDE = "pre-commit-inside"
    MANIFEST = ProtocolStep.MANIFEST.value
    COMMIT = ProtocolStep.COMMIT.value
    COMMIT_INSIDE = "commit-inside"
    COMMITTED_MANIFEST = ProtocolStep.COMMITTED_MANIFEST.value
    DONE = ProtocolStep.DONE.value
    SOURCE_READ = "source-read"
    CHECKPOINT_WRITE = "checkpoint-write"

    @property
    def number(self) -> int:
        """The crash point's number (1 to 10, as docs/epoch-protocol.md lists them)."""
        return list(CrashStep).index(self) + 1

    @property
    def inside_a_call(self) -> bool:
        """Whether the kill comes during a call, placed by ``WHEN`` (points 3, 6, 9, 10)."""
        return self in _INSIDE

    @property
    def protocol_step(self) -> ProtocolStep | None:
        """The coordinator's step this point is, for the points between two calls."""
        try:
            return ProtocolStep(self.value)
        except ValueError:
            return None


_INSIDE = frozenset(
    {
        CrashStep.PRE_COMMIT_INSIDE,
        CrashStep.COMMIT_INSIDE,
        CrashStep.SOURCE_READ,
        CrashStep.CHECKPOINT_WRITE,
    }
)
_WHEN = re.compile(r"(?P<event>[1-9][0-9]*)|(?P<ms>[0-9]+)ms")


@dataclass(frozen=True, slots=True)
class CrashPoint:
    """Where to kill a pipeline: a step of micro-batch ``epoch``.

    For the points inside a call, the kill comes at the call's ``event``-th event, or
    ``after_ms`` milliseconds into it when that is given.

    ``str()`` is the value :data:`CRASH_AT_VARIABLE` takes, and :meth:`parse` reads it back.
    """

    step: CrashStep
    epoch: int
    event: int = 1
    after_ms: int | None = None

    def __post_init__(self) -> None:
        if self.epoch < 0 or self.event < 1 or (self.after_ms is not None and self.after_ms < 0):
            raise ConfigurationError(
                f"crash point {self.step.value}: epoch must be >= 0, event >= 1, after_ms >= 0; "
                f"got {self.epoch}, {self.event}, {self.after_ms}",
                key=CRASH_AT_VARIABLE,
            )

    def __str__(self) -> str:
        text = f"{self.step.value}:{self.epoch}"
        if self.after_ms is not None:
            return f"{text}:{self.after_ms}ms"
        if self.step.inside_a_call and self.event != 1:
            return f"{text}:{self.event}"
        return text

    @classmethod
    def parse(cls, text: str, given_as: str = CRASH_AT_VARIABLE) -> CrashPoint:
        """The crash point ``STEP:EPOCH[:WHEN]`` names (see the module documentation).

        :param given_as: where ``text`` came from, for the error (an option such as
            ``--spark-crashes``; default :data:`CRASH_AT_VARIABLE`).
        :raises ConfigurationError: naming ``given_as`` and the accepted form.
        """
        parts = text.split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError(text)
            step, epoch = CrashStep(parts[0]), int(parts[1])
            when = parts[2] if len(parts) == 3 else None
            match = _WHEN.fullmatch(when or "1")
            if match is None or (when is not None and not step.inside_a_call):
                raise ValueError(text)
            if match["ms"] is not None:
                return cls(step, epoch, after_ms=int(match["ms"]))
            return cls(step, epoch, event=int(match["event"]))
        except (ValueError, ConfigurationError):
            steps = ", ".join(step.value for step in CrashStep)
            inside = ", ".join(step.value for step in CrashStep if step.inside_a_call)
            raise ConfigurationError(
                f"{given_as} {text!r}: expected STEP:EPOCH with STEP one of {steps}; "
                f"{inside} also take :K (the K-th event of the call, K >= 1) or :Nms",
                key=given_as,
            ) from None

    @classmethod
    def parse_schedule(cls, text: str, given_as: str) -> tuple[CrashPoint, ...]:
        """The crash points of ``STEP:EPOCH[:WHEN],...``, in order.

        :raises ConfigurationError: naming ``given_as`` and the first malformed point.
        """
        return tuple(cls.parse(point.strip(), given_as) for point in text.split(","))


def configured_crash_point(environ: Mapping[str, str] | None = None) -> CrashPoint | None:
    """The crash point :data:`CRASH_AT_VARIABLE` names, or ``None`` when it is not set.

    :raises ConfigurationError: when the variable (or the file it names) is malformed.
    """
    found = _variable_text(CRASH_AT_VARIABLE, environ)
    return None if found is None else CrashPoint.parse(*found)


def _variable_text(variable: str, environ: Mapping[str, str] | None) -> tuple[str, str] | None:
    """``variable``'s value, or with ``@FILE`` that file's content; and where it came from.

    ``None`` when it is not set, or names a file that is missing or empty.
    """
    value = (os.environ if environ is None else environ).get(variable)
    if not value:
        return None
    if not value.startswith(CRASH_AT_FILE_PREFIX):
        return value, variable
    path = Path(value.removeprefix(CRASH_AT_FILE_PREFIX))
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return (text, f"{variable} (the file {path})") if text else None


def kill_writer_once(environ: Mapping[str, str] | None = None) -> None:
    """SIGKILL this Python worker if :data:`KILL_WRITER_VARIABLE` names a marker not yet made."""
    marker = (os.environ if environ is None else environ).get(KILL_WRITER_VARIABLE)
    if not marker:
        return
    try:
        descriptor = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(descriptor)
    os.kill(os.getpid(), signal.SIGKILL)


EPOCH_WRITER_KILLED = "the epoch writer"
"""What a :data:`CRASH_RECORD_VARIABLE` line says was killed (``"at"``) when the epoch writer
killed itself, not the pipeline."""


def epoch_writer_killer(environ: Mapping[str, str] | None = None) -> StepObserver | None:
    """The observer that SIGKILLs this process (an epoch writer) where asked; else ``None``.

    :data:`KILL_EPOCH_WRITER_VARIABLE` names the steps and epochs, or ``@FILE`` a file that
    does (none while it is missing or empty); each kill is recorded in
    :data:`CRASH_RECORD_VARIABLE`'s file, when it names one, first.

    :raises ConfigurationError: when the steps are malformed, or name a point inside a call.
    """
    found = _variable_text(KILL_EPOCH_WRITER_VARIABLE, environ)
    if found is None:
        return None
    points = CrashPoint.parse_schedule(*found)
    kills: dict[tuple[ProtocolStep, int], CrashPoint] = {}
    for point in points:
        step = point.step.protocol_step
        if step is None:
            raise ConfigurationError(
                f"{KILL_EPOCH_WRITER_VARIABLE}: {point} falls inside a call; the epoch writer "
                "is killed between two calls only",
                key=KILL_EPOCH_WRITER_VARIABLE,
            )
        kills[step, point.epoch] = point

    def observe(reached: ProtocolStep, epoch: int) -> None:
        point = kills.get((reached, epoch))
        if point is not None:
            _record(point, EPOCH_WRITER_KILLED, None)
            os.kill(os.getpid(), signal.SIGKILL)

    return observe


def kill_pipeline() -> NoReturn:
    """SIGKILL the Spark driver JVM this Python process serves, then this process."""
    jvm = spark_jvm()
    if jvm is not None:
        os.kill(jvm, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL cannot be caught")  # pragma: no cover


# Windows: the calls a kill falls inside, and the events counted in them. ---------------------

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_WRITES = frozenset(
    {
        "os.rename",  # also os.replace and Path.rename
        "os.link",
        "os.symlink",
        "os.remove",  # also os.unlink
        "os.rmdir",
        "os.mkdir",
        "os.truncate",
        "socket.connect",
        "socket.sendto",
        "socket.sendmsg",
    }
)
_READS = frozenset({"os.listdir", "os.scandir"})
_PUBLISHES = frozenset({"os.rename", "os.link"})

_active: _Window | None = None
_audit_installed = False
_reads_in_process = 0


def _marked(name: str) -> None:
    window = _active
    if window is not None:
        window.event(f"at crash point {name}")


def _audit(event: str, args: tuple[Any, ...]) -> None:
    window = _active
    if window is None:
        return
    # An "open" of a descriptor (os.fdopen) wraps a file opened before: not an operation.
    if event in _WRITES or event in _READS or (event == "open" and _is_path(args[0])):
        window.audited(event, args)


def _is_path(value: object) -> bool:
    return isinstance(value, str | bytes | os.PathLike)


class _Window:
    """The calls one crash point kills inside: counts their events and fires at the chosen one.

    Audit events count only while the window is *open* (a call in it runs); ``end`` is the
    last event. The audit hook is installed in the process the first time a window opens.
    """

    def __init__(self, point: CrashPoint, kill: Kill, *, reads: bool, tear: bool) -> None:
        self._point = point
        self._kill = kill
        self._reads = reads
        self._tear = tear
        self._lock = threading.Lock()
        self._events = 0
        self._written: str | None = None
        self._timer: threading.Timer | None = None
        self.fired = False

    def open(self) -> None:
        """Count events from now on (a call in the window started)."""
        global _active, _audit_installed  # noqa: PLW0603 - one audit hook per process
        if not _audit_installed:
            sys.addaudithook(_audit)
            install_crash_point_injector(_marked)
            _audit_installed = True
        _active = self
        if self._point.after_ms is not None and self._timer is None:
            self._timer = threading.Timer(self._point.after_ms / 1000, self._fire, ("timer",))
            self._timer.daemon = True
            self._timer.start()

    def pause(self) -> None:
        """Stop counting audit events (no call in the window runs now)."""
        global _active  # noqa: PLW0603
        if _active is self:
            _active = None

    def event(self, what: str) -> None:
        """Count a non-audited event (a call returned); fire when it is the chosen one."""
        if self._counts():
            self._fire(what)

    def end(self, what: str) -> None:
        """The window's last event: fire now unless it fired already."""
        self.pause()
        self._fire(what)

    def audited(self, event: str, args: tuple[Any, ...]) -> None:
        """An audited operation is about to run in the process."""
        if self.fired:
            return  # the kill is under way: its own file operations are not events
        writes = event in _WRITES or (event == "open" and _open_writes(args))
        if not writes and not self._reads:
            return
        if self._counts():
            self._fire(f"before {event} {_describe(args)}", operation=(event, args))
        elif event == "open" and writes:
            self._written = os.fsdecode(args[0])

    def _counts(self) -> bool:
        with self._lock:
            if self.fired or self._point.after_ms is not None:
                return False
            self._events += 1
            return self._events >= self._point.event

    def _fire(self, what: str, *, operation: tuple[str, tuple[Any, ...]] | None = None) -> None:
        with self._lock:
            if self.fired:
                return
            self.fired = True
        self.pause()
        if self._timer is not None:
            self._timer.cancel()
        torn = self._tear_write(operation) if self._tear else None
        _record(self._point, what, torn)
        self._kill()

    def _tear_write(self, operation: tuple[str, tuple[Any, ...]] | None) -> str | None:
        """Cut the file being written to half, and publish it so if it was being published."""
        torn = []
        written = self._written
        if written is not None and os.path.isfile(written) and os.path.getsize(written):
            torn.append(_halve(written))
        if operation is not None:
            event, args = operation
            if event in _PUBLISHES and _plain_paths(args) and os.path.isfile(args[0]):
                source, target = os.fsdecode(args[0]), os.fsdecode(args[1])
                if source != written:
                    torn.append(_halve(source))
                (os.replace if event == "os.rename" else os.link)(source, target)
                torn.append(f"published as {target}")
        return "; ".join(torn) or None


def _plain_paths(args: tuple[Any, ...]) -> bool:
    """Whether a rename's or link's audit arguments are two paths, not relative to a descriptor."""
    return (
        len(args) >= 2
        and all(_is_path(path) for path in args[:2])
        and all(fd in (None, -1) for fd in args[2:4])
    )


def _describe(args: tuple[Any, ...]) -> str:
    return " -> ".join(os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in args[:2])


def _open_writes(args: tuple[Any, ...]) -> bool:
    flags = args[2] if len(args) >= 3 else None
    return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)


def _halve(path: str) -> str:
    size = os.path.getsize(path)
    os.truncate(path, size // 2)
    return f"{path} cut to {size // 2} of {size} bytes"


def _record(point: CrashPoint, what: str, torn: str | None) -> None:
    path = os.environ.get(CRASH_RECORD_VARIABLE)
    if not path:
        return
    line = json.dumps({"crash": str(point), "pid": os.getpid(), "at": what, "torn": torn})
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(descriptor, (line + "\n").encode())
    finally:
        os.close(descriptor)


def crash_recorded(point: CrashPoint, record: Path) -> bool:
    """Whether ``record`` (a :data:`CRASH_RECORD_VARIABLE` file) says the hook killed at ``point``.

    A missing file, or one torn by the kill, records nothing.
    """
    try:
        lines = record.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return False
    for line in lines:
        try:
            if json.loads(line).get("crash") == str(point):
                return True
        except ValueError:
            continue
    return False


# The coordinator's callbacks: points 1, 2, 4-8 and 10. -------------------------------------


def crash_observer(
    environ: Mapping[str, str] | None = None, *, kill: Kill | None = None
) -> StepObserver | None:
    """The coordinator observer :data:`CRASH_AT_VARIABLE` asks for, or ``None``.

    ``None`` also when the point is reached in a connector call the bridge wraps instead
    (``pre-commit-inside``, ``source-read``).

    :param kill: what ends the pipeline (default :func:`kill_pipeline`; a test of the hook
        passes a stand-in).
    :raises ConfigurationError: when the variable is malformed.
    """
    point = configured_crash_point(environ)
    if point is None:
        return None
    ends: Kill = kill or kill_pipeline
    step = point.step.protocol_step
    if step is not None:

        def observe(reached: ProtocolStep, epoch: int) -> None:
            if reached is step and epoch == point.epoch:
                _record(point, f"step {reached.value}", None)
                ends()

        return observe
    if point.step is CrashStep.COMMIT_INSIDE:
        return _BracketObserver(
            point,
            _Window(point, ends, reads=False, tear=False),
            opens={ProtocolStep.COMMIT},
            closes={ProtocolStep.COMMITTED_MANIFEST: "commit_epoch returned"},
        )
    if point.step is CrashStep.CHECKPOINT_WRITE:
        return _BracketObserver(
            point,
            _Window(point, ends, reads=False, tear=True),
            opens={ProtocolStep.MANIFEST, ProtocolStep.COMMITTED_MANIFEST},
            closes={
                ProtocolStep.COMMIT: "the pending manifest and latest pointer were saved",
                ProtocolStep.DONE: "the committed manifest was saved",
            },
        )
    return None


class _BracketObserver:
    """Opens a window at the steps before the calls it brackets, closes it at the steps after.

    Counting starts only at the first opening step of the epoch in this process, so recovery
    finishing the epoch in another process is not mistaken for the bracketed calls.
    """

    def __init__(
        self,
        point: CrashPoint,
        window: _Window,
        *,
        opens: set[ProtocolStep],
        closes: Mapping[ProtocolStep, str],
    ) -> None:
        self._point = point
        self._window = window
        self._opens = opens
        self._closes = closes
        self._last = max(closes, key=_order)
        self._started = False

    def __call__(self, step: ProtocolStep, epoch: int) -> None:
        if epoch != self._point.epoch:
            return
        if step in self._opens and (self._started or step is min(self._opens, key=_order)):
            self._started = True
            self._window.open()
        elif step in self._closes and self._started:
            if step is self._last:
                self._window.end(self._closes[step])
            else:
                self._window.pause()
                self._window.event(self._closes[step])


def _order(step: ProtocolStep) -> int:
    return list(ProtocolStep).index(step)


# Wrapped connectors: points 3 and 9. ------------------------------------------------------


def watched_source(
    source: SourceConnector,
    environ: Mapping[str, str] | None = None,
    *,
    kill: Kill | None = None,
) -> SourceConnector:
    """``source``, or a wrapper of it that kills the pipeline during a read.

    The wrapper is returned when :data:`CRASH_AT_VARIABLE` names ``source-read``: it kills
    during the source's reads of that micro-batch. The bridge passes every source it opens
    through this function.

    :param kill: what ends the pipeline (default :func:`kill_pipeline`; a test of the hook
        passes a stand-in).
    :raises ConfigurationError: when the variable is malformed.
    """
    point = configured_crash_point(environ)
    if point is None or point.step is not CrashStep.SOURCE_READ:
        return source
    return _WatchedSource(source, point, kill or kill_pipeline)


def watched_sink(
    sink: SinkConnector,
    environ: Mapping[str, str] | None = None,
    *,
    kill: Kill | None = None,
) -> SinkConnector:
    """``sink``, or a wrapper of it that kills the pipeline during a ``pre_commit``.

    The wrapper is returned when :data:`CRASH_AT_VARIABLE` names ``pre-commit-inside``: it
    kills during that epoch's ``pre_commit`` (for a distributed-commit sink, while a write
    task's ``stage`` makes its staging durable). The bridge passes every sink it opens
    through this function.

    :param kill: what ends the pipeline (default :func:`kill_pipeline`; a test of the hook
        passes a stand-in).
    :raises ConfigurationError: when the variable is malformed.
    """
    point = configured_crash_point(environ)
    if point is None or point.step is not CrashStep.PRE_COMMIT_INSIDE:
        return sink
    return _WatchedSink(sink, point, kill or kill_pipeline)


def _spark_task() -> tuple[bool, int | None]:
    """Whether this runs in a Spark task, and the task's micro-batch id if it has one."""
    from pyspark import TaskContext  # noqa: PLC0415 - only where a crash point is set

    from laminar_sdk._spark.writer import BATCH_ID_PROPERTY  # noqa: PLC0415 - imports pyspark

    context = TaskContext.get()
    if context is None:
        return False, None
    batch_id = context.getLocalProperty(BATCH_ID_PROPERTY)
    return True, None if batch_id is None else int(batch_id)


class _WatchedSource(SourceConnector):
    """A source whose reads of one micro-batch end in a kill (see :func:`watched_source`).

    A *read* is everything this instance does between its first ``restore`` or
    ``poll_batch`` and ``close``; the bridge opens a source for each.
    """

    def __init__(self, source: SourceConnector, point: CrashPoint, kill: Kill) -> None:
        self._source = source
        self._point = point
        self._kill = kill
        self._window: _Window | None = None
        self._counted = False

    def _read_window(self) -> _Window | None:
        global _reads_in_process  # noqa: PLW0603 - the planning process counts its reads
        if not self._counted:
            self._counted = True
            in_task, batch_id = _spark_task()
            epoch = batch_id if in_task else _reads_in_process
            if not in_task:
                _reads_in_process += 1
            if epoch == self._point.epoch:
                self._window = _Window(self._point, self._kill, reads=True, tear=False)
        return self._window

    async def _watched(self, call: str, awaitable: Awaitable[T]) -> T:
        window = self._read_window()
        if window is None:
            return await awaitable
        window.open()
        try:
            result = await awaitable
        finally:
            window.pause()
        window.event(f"{call} returned")
        return result

    async def open(self, config: ConnectorConfig) -> None:
        """Open the wrapped source."""
        await self._source.open(config)

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        """The wrapped source's ``poll_batch``, watched."""
        return await self._watched("poll_batch", self._source.poll_batch(max_records))

    def schema(self) -> pa.Schema:
        """The wrapped source's schema."""
        return self._source.schema()

    def checkpoint(self) -> SourceCheckpoint:
        """The wrapped source's checkpoint."""
        return self._source.checkpoint()

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        """The wrapped source's ``restore``, watched."""
        await self._watched("restore", self._source.restore(checkpoint))

    async def close(self) -> None:
        """End the read (killing now, if it did not yet), then close the wrapped source."""
        if self._window is not None:
            self._window.end("the read ended")
        await self._source.close()

    async def health_check(self) -> HealthStatus:
        """The wrapped source's health."""
        return await self._source.health_check()

    def metrics(self) -> ConnectorMetrics:
        """The wrapped source's metrics."""
        return self._source.metrics()

    def data_ready_notify(self) -> asyncio.Event | None:
        """The wrapped source's event."""
        return self._source.data_ready_notify()

    def as_schema_provider(self) -> SchemaProvider | None:
        """The wrapped source's capability."""
        return self._source.as_schema_provider()

    def as_schema_inferable(self) -> SchemaInferable | None:
        """The wrapped source's capability."""
        return self._source.as_schema_inferable()

    def as_schema_registry_aware(self) -> SchemaRegistryAware | None:
        """The wrapped source's capability."""
        return self._source.as_schema_registry_aware()

    def as_schema_evolvable(self) -> SchemaEvolvable | None:
        """The wrapped source's capability."""
        return self._source.as_schema_evolvable()

    def as_range_readable(self) -> RangeReadableSource | None:
        """The wrapped source's range reads, watched in Spark tasks."""
        ranges = self._source.as_range_readable()
        return None if ranges is None else _WatchedRanges(ranges, self._point, self._kill)

    def supports_replay(self) -> bool:
        """Whether the wrapped source replays."""
        return self._source.supports_replay()

    def checkpoint_requested(self) -> threading.Event | None:
        """The wrapped source's flag."""
        return self._source.checkpoint_requested()


class _WatchedRanges(RangeReadableSource):
    """Range reads of a source; ``read_range`` in a task of the chosen micro-batch is killed."""

    def __init__(self, ranges: RangeReadableSource, point: CrashPoint, kill: Kill) -> None:
        self._ranges = ranges
        self._point = point
        self._kill = kill

    async def plan_end(self, start: SourceCheckpoint, max_records: int | None) -> SourceCheckpoint:
        """The wrapped source's ``plan_end``."""
        return await self._ranges.plan_end(start, max_records)

    def read_range(self, partition_range: PartitionRange) -> AsyncIterator[pa.RecordBatch]:
        """The wrapped source's ``read_range``, watched in a task of the chosen micro-batch."""
        in_task, batch_id = _spark_task()
        batches = self._ranges.read_range(partition_range)
        if not in_task or batch_id != self._point.epoch:
            return batches
        return self._watched(batches, _Window(self._point, self._kill, reads=True, tear=False))

    @staticmethod
    async def _watched(
        batches: AsyncIterator[pa.RecordBatch], window: _Window
    ) -> AsyncIterator[pa.RecordBatch]:
        window.open()
        async for batch in batches:
            window.pause()  # what the consumer does with the batch is not the read's doing
            window.event("read_range returned a batch")
            yield batch
            window.open()
        window.end("read_range ended")


class _WatchedSink(ForwardingSink):
    """A sink whose ``pre_commit`` of the chosen epoch ends in a kill (see :func:`watched_sink`)."""

    def __init__(self, sink: SinkConnector, point: CrashPoint, kill: Kill) -> None:
        super().__init__(sink)
        self._point = point
        self._kill = kill

    async def pre_commit(self, epoch: int) -> None:
        """The wrapped sink's ``pre_commit``; the chosen epoch's is killed inside."""
        if epoch != self._point.epoch:
            await self.wrapped.pre_commit(epoch)
            return
        window = _Window(self._point, self._kill, reads=False, tear=False)
        window.open()
        try:
            await self.wrapped.pre_commit(epoch)
        finally:
            window.end("pre_commit returned")

    def as_distributed_commit(self) -> DistributedCommitSink | None:
        """The wrapped sink's distributed commit, whose ``stage`` is watched."""
        distributed = self.wrapped.as_distributed_commit()
        if distributed is None:
            return None
        return _WatchedStaging(distributed, self._point, self._kill)


class _WatchedStaging(DistributedCommitSink):
    """A distributed commit whose ``stage`` of the chosen epoch is killed after the last batch.

    That part of ``stage`` is what pre-commits a write task's share of the epoch.
    """

    def __init__(self, distributed: DistributedCommitSink, point: CrashPoint, kill: Kill) -> None:
        self._distributed = distributed
        self._point = point
        self._kill = kill

    async def stage(self, epoch: int, task: str, batches: AsyncIterable[pa.RecordBatch]) -> str:
        """The wrapped ``stage``; in the chosen epoch, killed after the last batch."""
        if epoch != self._point.epoch:
            return await self._distributed.stage(epoch, task, batches)
        window = _Window(self._point, self._kill, reads=False, tear=False)

        async def taken() -> AsyncIterator[pa.RecordBatch]:
            async for batch in batches:
                yield batch
            window.open()  # every batch is taken: what follows makes the staging durable

        try:
            return await self._distributed.stage(epoch, task, taken())
        finally:
            window.end("stage returned")

    async def commit_aggregated(self, epoch: int, descriptors: Sequence[str]) -> None:
        """The wrapped ``commit_aggregated``."""
        await self._distributed.commit_aggregated(epoch, descriptors)
