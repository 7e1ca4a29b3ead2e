"""The epoch writer: a one-instance sink written while its micro-batch's tasks still run.

Without it, a one-instance commit (see :mod:`~laminar_sdk._spark.writer`) starts only when
every write task of the micro-batch has ended — Spark calls ``commit`` then — and writes the
whole micro-batch to the sink alone, with the next micro-batch waiting: Kafka's transactional
produce took ~28 s of a 90 s Kafka-to-Kafka run that way. The epoch writer is a process on
the driver's machine, one per query and sink configuration, that keeps the sink open across
micro-batches and is told of each batch a task has written to its hand-off file
(:class:`TaskStream`), which it reads from there (the page cache: no batch crosses the socket),
so that the sink writes the epoch while the tasks still read and convert theirs. When Spark
calls ``commit``, the epoch is mostly written; the commit asks the writer to finish it
(:func:`finished_by_writer`): ``pre_commit``, the manifest (the decision), ``commit_epoch``.

It is an accelerator that may vanish at any moment, never a second source of truth:

- Every task still writes its hand-off file, the commit's own source. The writer reads each
  batch from it; when a task cannot reach the writer, or a send fails, the task goes on with
  its file alone.
- The writer finishes an epoch only when the commit asks, and only when it took exactly the
  tasks the commit messages name, each whole: a failed task attempt that streamed part of the
  epoch, a task that never reached it or a stream cut off make it roll its epoch back and
  decline. The commit then runs the epoch itself from the hand-off files, as it does without
  a writer, after recovery (which finishes an epoch whose commit was decided, and rolls back
  one that was not). The same happens when the writer is not there, or dies while the commit
  waits for it (its connection ends).
- The manifest stays the only commit decision, written by one process at a time: the commit
  waits for the writer's answer for as long as its connection lives, and runs the epoch
  itself only once the writer has answered or is gone. A writer killed anywhere is a crash
  at one of the points the protocol survives; ``LAMINAR_SPARK_KILL_EPOCH_WRITER`` kills it at
  chosen steps, for tests (:data:`~laminar_sdk.faults.KILL_EPOCH_WRITER_VARIABLE`).
- The writer starts each epoch with recovery, given Spark's batch id as the proof of what
  Spark committed (a task of micro-batch ``N`` runs only once Spark's commit log holds every
  batch before it), and skips an epoch committed before, dropping its batches.

Its lifetime: the first write task that finds no writer starts one, under a lock file so that
two tasks start one writer. The writer listens on a Unix socket in the driver's hand-off
directory (mode 0700, this user's alone; :mod:`~laminar_sdk._spark.handoff`) and receives its
options — which may hold secrets — on its standard input, never on its command line. It
leaves the session and the process tree of the task that started it. It dies the moment Spark's
JVM does (SIGKILL, as after a crash: nothing rolled back or closed, since a restarted query may
be recovering already), and exits after :data:`IDLE_EXIT_S` seconds without a connection,
rolling back an epoch it holds (one no commit asked for). ``laminar.epoch.writer=false`` turns
it off.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from laminar_sdk._contract.connector import SinkConnector
from laminar_sdk._runtime.coordinator import EpochCoordinator, EpochResult
from laminar_sdk._spark import fault_seam
from laminar_sdk._spark.connectors import opened_sink
from laminar_sdk._spark.options import BridgeOptions, checkpointer_of
from laminar_sdk._spark.processes import JVM_PID_VARIABLE, process_alive

logger = logging.getLogger("laminar_sdk.spark")

IDLE_EXIT_S = 120.0
"""How long a writer waits for its next connection before it exits."""

_START_TIMEOUT_S = 30.0
_WATCH_INTERVAL_S = 1.0
_QUEUED_BATCHES = 8
_MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes on Linux (104 on macOS), with its NUL

_FRAME = struct.Struct("<cQ")
_OFFSET = struct.Struct("<Q")
_HEADER, _BATCH, _END, _REPLY = b"H", b"B", b"E", b"R"


@dataclass(frozen=True, slots=True)
class WriterStart:
    """What a writer process is started with, on its standard input (pickled).

    :param options: the sink's options (they may hold secrets: never on a command line).
    :param schema: the sink's Arrow schema, which every batch has.
    :param query_id: Spark's query id, recorded in manifests.
    :param socket: where the writer listens.
    :param jvm: the pid of the Spark JVM it serves, or ``None`` when it is not known.
    """

    options: BridgeOptions
    schema: pa.Schema
    query_id: str
    socket: str
    jvm: int | None


@dataclass(frozen=True, slots=True)
class WriterAddress:
    """Where the writer of one query's sink, so configured, listens; and its start-up lock."""

    socket: str
    lock: str

    @classmethod
    def of(cls, root: str, query_id: str, options: BridgeOptions) -> WriterAddress:
        """The address in the hand-off directory ``root``.

        The name is a digest of the query id and the sink's options (which determine its
        schema), so a query restarted with other sink options never reaches a writer holding
        the old ones.
        """
        configuration = {
            "query": query_id,
            "connector": options.connector,
            "plugin": options.plugin,
            "properties": sorted(options.properties.items()),
            "delivery": str(options.delivery),
            "checkpoint": [options.checkpoint_location, options.checkpoint_store],
            "checkpoint_options": sorted(options.checkpoint_options.items()),
        }
        key = hashlib.sha256(json.dumps(configuration).encode()).hexdigest()[:16]
        return cls(os.path.join(root, f"w-{key}.sock"), os.path.join(root, f"w-{key}.lock"))


@contextlib.contextmanager
def _socket_path(path: str) -> Iterator[str]:
    """``path`` as a Unix socket's address can hold it (108 bytes on Linux).

    A longer one is reached through ``/proc/self/fd`` and its directory, open meanwhile.
    """
    if len(os.fsencode(path)) <= _MAX_SOCKET_PATH:
        yield path
        return
    directory = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{directory}/{os.path.basename(path)}"
    finally:
        os.close(directory)


# The task's side. ------------------------------------------------------------------------


class TaskStream:
    """A write task's batches, sent to the epoch writer as the task writes them.

    Best effort: the first failure ends the stream (the commit then runs the epoch from the
    hand-off files), never the task.
    """

    def __init__(self, connection: socket.socket) -> None:
        self._connection: socket.socket | None = connection

    @classmethod
    def open(
        cls, address: WriterAddress, start: WriterStart, epoch: int, task: str, path: Path
    ) -> TaskStream | None:
        """A stream of task ``task``'s share of ``epoch``; the writer started if there is none.

        :param path: the task's hand-off file, which the writer reads the batches from.
        :returns: ``None`` when no writer can be reached or started (a warning says why).
        """
        connection = _connected(address.socket) or _started(address, start)
        if connection is None:
            return None
        stream = cls(connection)
        header = {"kind": "task", "epoch": epoch, "task": task, "path": str(path)}
        stream._send(_HEADER, json.dumps(header).encode())
        return stream

    def written(self, file: pa.NativeFile) -> None:
        """Tell the writer that the task's file holds whole batches up to ``file``'s position.

        The writer reads them from the file (the page cache): no batch is copied through the
        socket. It waits while the writer's queue is full.
        """
        self._send(_BATCH, _OFFSET.pack(file.tell()))

    def close(self, rows: int) -> None:
        """End the stream of ``rows`` rows, once the writer says it took all of it.

        The writer answers once it has queued the last batch: a stream it took is registered,
        whole, before the task's commit message leaves, and the commit finds it there.
        """
        self._send(_END, json.dumps({"rows": rows}).encode())
        connection, self._connection = self._connection, None
        if connection is None:
            return
        with connection, contextlib.suppress(OSError, ValueError):
            _received(connection)

    def abandon(self) -> None:
        """End the stream unfinished (the task failed): the writer will not commit its epoch."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def _send(self, tag: bytes, payload: bytes) -> None:
        if self._connection is None:
            return
        try:
            self._connection.sendall(_frame(tag, payload))
        except OSError as error:
            logger.info("the epoch writer took no more batches (%s): the commit writes them", error)
            self._connection.close()
            self._connection = None


def _connected(path: str) -> socket.socket | None:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with _socket_path(path) as reachable:
            connection.connect(reachable)
    except OSError:
        connection.close()
        return None
    return connection


def _started(address: WriterAddress, start: WriterStart) -> socket.socket | None:
    """Start the writer, unless another task did first; a connection to it."""
    try:
        with open(address.lock, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            connection = _connected(address.socket)
            if connection is not None:
                return connection
            with contextlib.suppress(FileNotFoundError):
                os.unlink(address.socket)  # a dead writer's
            if not _spawn(start):
                return None
            return _connected(address.socket)
    except OSError as error:
        logger.warning("cannot start an epoch writer in %s: %s", address.lock, error)
        return None


def _spawn(start: WriterStart) -> bool:
    """Run a writer process and wait until it listens; whether it does."""
    environment = dict(os.environ)
    if start.jvm is not None:
        environment[JVM_PID_VARIABLE] = str(start.jvm)
    process = subprocess.Popen(
        [sys.executable, "-m", __name__],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=environment,
        start_new_session=True,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    try:
        with process.stdin:
            process.stdin.write(pickle.dumps(start))
        with process.stdout:
            ready, _, _ = select.select([process.stdout], [], [], _START_TIMEOUT_S)
            line = process.stdout.readline() if ready else b""
        if line.strip() == b"listening":
            return True
        logger.warning(
            "the epoch writer did not start within %.0f s: the commit writes every batch",
            _START_TIMEOUT_S,
        )
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        return False
    except OSError as error:
        logger.warning("cannot start an epoch writer: %s", error)
        return False
    finally:
        process.wait()  # the writer forks away at once; this reaps the process it leaves


# The commit's side. -------------------------------------------------------------------------


def finished_by_writer(
    address: WriterAddress, epoch: int, tasks: dict[str, int]
) -> EpochResult | None:
    """Ask the writer to finish ``epoch`` from the streams of ``tasks`` (name → rows).

    Waits as long as the writer lives: the commit must not run the epoch while the writer
    may still be deciding it.

    :returns: what the writer did; ``None`` when the commit must run the epoch itself: there
        is no writer, it declined (it did not take exactly these tasks' batches), failed
        (recovery finishes or rolls back what it left) or died.
    """
    started = time.monotonic()
    connection = _connected(address.socket)
    if connection is None:
        return None
    with connection:
        try:
            header = {"kind": "commit", "epoch": epoch, "tasks": tasks}
            connection.sendall(_frame(_HEADER, json.dumps(header).encode()))
            reply = _received(connection)
        except (OSError, ValueError) as error:
            logger.warning(
                "the epoch writer ended before it answered for micro-batch %d (%s): "
                "running it here",
                epoch,
                error,
            )
            return None
    outcome = reply.get("outcome")
    if outcome in ("committed", "skipped"):
        return EpochResult(
            epoch,
            int(reply.get("rows", 0)),
            skipped=outcome == "skipped",
            commit_latency_s=time.monotonic() - started,
        )
    logger.info(
        "the epoch writer did not commit micro-batch %d (%s): running it here",
        epoch,
        reply.get("reason"),
    )
    return None


def drop_epoch(address: WriterAddress, epoch: int) -> None:
    """Tell the writer to roll back ``epoch``, which Spark aborts; best effort."""
    connection = _connected(address.socket)
    if connection is None:
        return
    with connection, contextlib.suppress(OSError, ValueError):
        connection.sendall(_frame(_HEADER, json.dumps({"kind": "drop", "epoch": epoch}).encode()))
        _received(connection)


def _frame(tag: bytes, payload: bytes) -> bytes:
    return _FRAME.pack(tag, len(payload)) + payload


def _received(connection: socket.socket) -> dict[str, Any]:
    """The writer's reply. :raises ValueError: when the connection ended first."""
    header = _read_exactly(connection, _FRAME.size)
    tag, length = _FRAME.unpack(header)
    if tag != _REPLY:
        raise ValueError(f"unexpected frame {tag!r}")
    reply: dict[str, Any] = json.loads(_read_exactly(connection, length))
    return reply


def _read_exactly(connection: socket.socket, size: int) -> bytes:
    parts = bytearray()
    while len(parts) < size:
        part = connection.recv(size - len(parts))
        if not part:
            raise ValueError("the writer's connection ended")
        parts += part
    return bytes(parts)


# The writer process. -------------------------------------------------------------------------


class _Declined(Exception):
    """Ends an epoch the writer will not commit; the coordinator rolls it back."""


_FINISH = object()
_DECLINE = object()


@dataclass
class _Epoch:
    """The epoch the writer is writing: the tasks streaming into it and its coordinator's run."""

    number: int
    run: asyncio.Task[EpochResult] | None = None
    streams: dict[str, int | None] = field(default_factory=dict)  # task -> rows once whole
    broken: str | None = None
    queue: asyncio.Queue[object] = field(default_factory=lambda: asyncio.Queue(_QUEUED_BATCHES))

    async def batches(self) -> AsyncIterator[pa.RecordBatch]:
        while (item := await self.queue.get()) is not _FINISH:
            if item is _DECLINE:
                raise _Declined(f"micro-batch {self.number} was not committed here")
            assert isinstance(item, pa.RecordBatch)
            yield item

    async def put(self, item: object) -> None:
        """Queue ``item``, unless the run ended (a skipped or failed epoch takes nothing)."""
        if self.run is None or self.run.done():
            return
        putting = asyncio.ensure_future(self.queue.put(item))
        await asyncio.wait({putting, self.run}, return_when=asyncio.FIRST_COMPLETED)
        putting.cancel()

    def mismatch(self, tasks: dict[str, int]) -> str | None:
        """Why the streams taken are not exactly ``tasks``, whole; ``None`` when they are."""
        if self.broken is not None:
            return self.broken
        if self.streams != tasks:
            taken = {name: rows for name, rows in self.streams.items() if rows is not None}
            return f"it took the whole streams of {taken}, the commit names {tasks}"
        return None


class EpochWriter:
    """The writer process's server: takes task streams, finishes epochs when asked."""

    def __init__(self, start: WriterStart) -> None:
        self._start = start
        self._name = start.options.connector
        self._sink_scope: contextlib.AsyncExitStack | None = None
        self._sink: SinkConnector | None = None
        self._epoch: _Epoch | None = None
        self._turn = asyncio.Lock()  # one change of epoch, or one commit, at a time
        self._last_seen = time.monotonic()
        self._connections = 0

    async def serve(self, listening: socket.socket) -> None:
        """Serve on ``listening`` until the JVM is gone or no one came for a while."""
        server = await asyncio.start_unix_server(self._connection, sock=listening)
        try:
            while not self._should_exit():
                await asyncio.sleep(_WATCH_INTERVAL_S)
        finally:
            server.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._start.socket)
            async with self._turn:
                await self._drop()
                await self._close_sink()

    def _should_exit(self) -> bool:
        jvm = self._start.jvm
        if jvm is not None and not process_alive(jvm):
            _die_with_jvm()
        idle = self._connections == 0 and time.monotonic() - self._last_seen > IDLE_EXIT_S
        return idle and not self._turn.locked()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        try:
            header = json.loads(await _read_frame(reader, _HEADER))
            kind, epoch = header["kind"], int(header["epoch"])
            if kind == "task":
                await self._take(epoch, str(header["task"]), str(header["path"]), reader, writer)
            elif kind == "commit":
                tasks = {str(name): int(rows) for name, rows in header["tasks"].items()}
                await _reply(writer, await self._commit(epoch, tasks))
            elif kind == "drop":
                async with self._turn:
                    if self._epoch is not None and self._epoch.number == epoch:
                        await self._drop()
                await _reply(writer, {"dropped": epoch})
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, KeyError) as error:
            logger.debug("epoch writer: a connection ended early: %s", error)
        finally:
            self._connections -= 1
            self._last_seen = time.monotonic()
            writer.close()

    async def _take(
        self,
        number: int,
        task: str,
        path: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        epoch = await self._epoch_for(number)
        if task in epoch.streams:
            epoch.broken = f"task {task} streamed twice"
        epoch.streams[task] = None
        try:
            await self._read_file(epoch, task, path, reader, writer)
        except BaseException:
            epoch.broken = epoch.broken or f"the stream of task {task} was cut off"
            raise

    async def _read_file(
        self,
        epoch: _Epoch,
        task: str,
        path: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """Queue each batch of the task's file as the task says it is written; answer its end.

        The file is opened at the first batch: the task makes it after it reached the writer.
        """
        file: pa.NativeFile | None = None
        try:
            while True:
                tag, payload = await _read_tagged(reader)
                if tag == _BATCH:
                    (written,) = _OFFSET.unpack(payload)
                    file = file or pa.OSFile(path)
                    while file.tell() < written:
                        message = pa.ipc.read_message(file)
                        if message.type == "record batch":
                            batch = pa.ipc.read_record_batch(message, self._start.schema)
                            await epoch.put(batch)
                elif tag == _END:
                    rows = int(json.loads(payload)["rows"])
                    epoch.streams[task] = rows
                    await _reply(writer, {"took": rows})
                    return
                else:
                    raise ValueError(f"unexpected frame {tag!r}")
        finally:
            if file is not None:
                file.close()

    async def _epoch_for(self, number: int) -> _Epoch:
        """The epoch being written when it is ``number``; else a new one (the old one dropped)."""
        async with self._turn:
            if self._epoch is not None and self._epoch.number == number:
                return self._epoch
            await self._drop()
            epoch = self._epoch = _Epoch(number)
            try:
                sink = await self._opened_sink()
                coordinator = EpochCoordinator(
                    checkpointer_of(self._start.options),
                    {self._name: sink},
                    observer=fault_seam.epoch_writer_observer(),
                    query_id=self._start.query_id,
                )
                await coordinator.recover(engine_epoch=number)
            except Exception as error:  # noqa: BLE001 - the commit, running the epoch, reports it
                epoch.broken = f"recovery before micro-batch {number} failed: {error}"
                await self._close_sink()
                return epoch
            epoch.run = asyncio.create_task(coordinator.run_epoch(number, epoch.batches(), {}))
            return epoch

    async def _commit(self, number: int, tasks: dict[str, int]) -> dict[str, object]:
        async with self._turn:
            epoch = self._epoch
            if epoch is None or epoch.number != number:
                return {"outcome": "declined", "reason": f"it took no task of epoch {number}"}
            reason = epoch.mismatch(tasks)
            if reason is not None:
                await self._drop()
                return {"outcome": "declined", "reason": reason}
            self._epoch = None
            await epoch.put(_FINISH)
            assert epoch.run is not None
            try:
                result = await epoch.run
            except Exception as error:  # noqa: BLE001 - the commit recovers and reports it
                await self._close_sink()
                return {"outcome": "failed", "reason": str(error)}
            outcome = "skipped" if result.skipped else "committed"
            return {"outcome": outcome, "rows": result.rows}

    async def _drop(self) -> None:
        """Roll back the epoch being written, if any, and close the sink.

        The commit is about to run the epoch with a sink of its own, which may fence this
        one (Kafka's transactional id): the next epoch opens a new one.
        """
        epoch, self._epoch = self._epoch, None
        if epoch is None:
            return
        if epoch.run is not None:
            await epoch.put(_DECLINE)
            try:
                await epoch.run
            except Exception:  # noqa: BLE001 - _Declined, or a failure: recovery cleans up
                logger.debug("epoch writer: micro-batch %d rolled back", epoch.number)
        await self._close_sink()

    async def _opened_sink(self) -> SinkConnector:
        if self._sink is None:
            scope = contextlib.AsyncExitStack()
            self._sink = await scope.enter_async_context(opened_sink(self._start.options))
            self._sink_scope = scope
        return self._sink

    async def _close_sink(self) -> None:
        scope, self._sink_scope, self._sink = self._sink_scope, None, None
        if scope is not None:
            with contextlib.suppress(Exception):
                await scope.aclose()


def _die_with_jvm() -> None:
    """SIGKILL this process: its JVM is gone, and a restarted query may be recovering already.

    Nothing is rolled back or closed — a process that outlived its query must not touch the
    sink while a new run's recovery does: the protocol survives a kill, not a latecomer.
    """
    os.kill(os.getpid(), signal.SIGKILL)


def _watch_jvm(jvm: int) -> None:
    """Kill this process the moment process ``jvm`` ends (Linux's pidfd), in a thread."""
    try:
        descriptor = os.pidfd_open(jvm)
    except (AttributeError, OSError):
        return  # no pidfd here: the serve loop's once-a-second check remains

    def wait() -> None:
        select.select([descriptor], [], [])
        _die_with_jvm()

    threading.Thread(target=wait, name="laminar-epoch-writer-jvm", daemon=True).start()


async def _read_tagged(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    tag, length = _FRAME.unpack(await reader.readexactly(_FRAME.size))
    return tag, await reader.readexactly(length)


async def _read_frame(reader: asyncio.StreamReader, expected: bytes) -> bytes:
    tag, payload = await _read_tagged(reader)
    if tag != expected:
        raise ValueError(f"expected frame {expected!r}, got {tag!r}")
    return payload


async def _reply(writer: asyncio.StreamWriter, reply: dict[str, object]) -> None:
    writer.write(_frame(_REPLY, json.dumps(reply).encode()))
    await writer.drain()


def _main() -> None:
    """The writer process: read the start, leave the starter's tree, listen, serve."""
    start: WriterStart = pickle.loads(sys.stdin.buffer.read())  # noqa: S301 - from our parent
    if os.fork():  # the starting task reaps this one; the writer is not its child
        os._exit(0)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with _socket_path(start.socket) as bindable:
        listening.bind(bindable)
    listening.listen(64)
    sys.stdout.write("listening\n")
    sys.stdout.flush()
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), sys.stdout.fileno())
    if start.jvm is not None:
        _watch_jvm(start.jvm)
    asyncio.run(EpochWriter(start).serve(listening))


if __name__ == "__main__":
    _main()
