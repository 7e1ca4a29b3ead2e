"""A pipeline the kit runs on Spark, in a child process it can kill: what it is, and the run.

A :class:`SparkPipeline` is plain data (JSON on disk for the child). :func:`run_in_child`
starts ``python -m laminar_conformance._spark_child PIPELINE.json`` with an optional crash
point in its environment, waits for it, cleans up every process it left, and says whether the
crash fired (the hook's crash record). Nothing here imports ``pyspark``.

A restart can be started *standing by* (:func:`start_child` with ``standby=True``) while the
run before it is still going: its driver starts (the JVM, the Spark session), warms up with a
pipeline of the reference connectors in a directory of its own (most of a short run's time is
a new driver's first micro-batch), and waits, reading nothing of the pipeline's state, until
:meth:`RunningChild.release` starts its query with its crash point. Recovery is then what it
would be in a driver started after the kill: the killed driver's state is on disk or lost.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Mapping, MutableMapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from laminar_conformance.services import die_with_parent
from laminar_sdk import spark_temporary_files_in
from laminar_sdk.faults import (
    CRASH_AT_FILE_PREFIX,
    CRASH_AT_VARIABLE,
    CRASH_RECORD_VARIABLE,
    EPOCH_WRITER_KILLED,
    KILL_EPOCH_WRITER_VARIABLE,
)

CHILD_MODULE = "laminar_conformance._spark_child"
"""The module the child process runs: ``python -m laminar_conformance._spark_child FILE``."""

STANDBY_FLAG = "--standby"
"""The child's flag: build and warm up the Spark session, then wait for ``go [CRASH]`` on
standard input. The child sets the crash point itself, once its warm-up is over."""
RELEASE = "go"
"""The first word of the line that releases a standby child; its crash point may follow."""

SPARK_PYTHON_VARIABLE = "LAMINAR_SPARK_PYTHON"
"""The Python interpreter the Spark children run with (``--spark-python``), when not this one."""
SPARK_CONNECT_VARIABLE = "LAMINAR_SPARK_CONNECT"
"""Set (to ``1``) when each Spark child runs its pipeline from a Spark Connect client, against
a Connect server of its own (``--spark-connect``), instead of in a classic driver."""


def spark_python() -> str:
    """The Python that runs the Spark children: ``$LAMINAR_SPARK_PYTHON``, or this one.

    Another environment's interpreter runs the kit's pipelines on that environment's PySpark
    (and pyarrow, and the plugin installed there).
    """
    return os.environ.get(SPARK_PYTHON_VARIABLE) or sys.executable


# The SDK's names for these (laminar_sdk.spark) import pyspark; the kit reads its values
# without it. A test checks that they agree.

TAKE_RECORDS = "take-records"
"""Transform: replace each ``id`` by the record whose :data:`RECORD_KEY` it is, in a Parquet
file (a sink under test receives records in its own schema, built by its test context)."""

RECORD_KEY = "__laminar_conformance_id"
"""The column of the records file that holds the id each record carries."""

CONTEXT_IDS = "context-ids"
"""Transform: each record to an ``ids`` row, with a pickled ``ids(records)`` callable (a
source under test's records, counted id by id by the memory sink)."""


class _Record(Protocol):
    """A Spark ``Row``: what a Python UDF receives for a struct."""

    def asDict(self, recursive: bool = False) -> dict[str, Any]:  # noqa: N802 - Spark's name
        """The record's fields by name."""
        ...


def record_id(
    ids: Callable[[pa.RecordBatch], Sequence[int]], schema: bytes, record: _Record
) -> int:
    """The id a source's test context reads from one record, as a batch of one row.

    The Python UDF of :data:`CONTEXT_IDS`, run on Spark's executors (defined here, not in
    the child's ``__main__``, so that Spark ships it by reference).

    :param ids: the test context's ``ids``.
    :param schema: the records' Arrow schema, serialized.
    """
    batch = pa.RecordBatch.from_pylist([record.asDict(recursive=True)], schema=_schema(schema))
    (found,) = ids(batch)
    return int(found)


@functools.cache
def _schema(serialized: bytes) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(serialized))


@dataclass(frozen=True, slots=True)
class IdsTransform:
    """A stage between the source and the sink that turns ids into records or back.

    :param kind: :data:`TAKE_RECORDS` or :data:`CONTEXT_IDS`.
    :param path: the file the transform reads on the executors.
    """

    kind: str
    path: str


@dataclass(frozen=True, slots=True)
class SparkPipeline:
    """A laminar source, an optional Arrow transform and a laminar sink, on Spark.

    It runs with ``trigger(availableNow=True)`` until the source has nothing more.

    :param source: the source connector's registered name.
    :param source_options: its configuration.
    :param sink: the sink connector's registered name.
    :param sink_options: its configuration.
    :param checkpoint_location: Spark's ``checkpointLocation`` (the laminar manifests are kept
        in its ``laminar`` directory): running the pipeline again resumes from it.
    :param delivery: ``exactly-once`` or ``at-least-once``.
    :param max_records_per_batch: the most records one micro-batch reads.
    :param transform: the stage between source and sink, if any.
    :param master: the Spark master URL.
    :param timeout_s: how long the query may run.
    :param epoch_writer_kills: where the epoch writer (a one-instance sink's, see
        :data:`~laminar_sdk.faults.KILL_EPOCH_WRITER_VARIABLE`) kills itself, as that
        variable takes them; ``""``: nowhere.
    """

    source: str
    source_options: Mapping[str, str]
    sink: str
    sink_options: Mapping[str, str]
    checkpoint_location: str
    delivery: str = "exactly-once"
    max_records_per_batch: int = 100
    transform: IdsTransform | None = None
    master: str = "local[2]"
    timeout_s: float = 300.0
    epoch_writer_kills: str = ""

    def to_json(self) -> str:
        """The pipeline as JSON, for the child process."""
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SparkPipeline:
        """The pipeline :meth:`to_json` wrote."""
        data: dict[str, Any] = json.loads(text)
        transform = data.pop("transform", None)
        return cls(**data, transform=None if transform is None else IdsTransform(**transform))

    def spark_batches(self, kind: str) -> list[int]:
        """The batch ids in Spark's ``offsets`` (planned) or ``commits`` (done) log."""
        directory = Path(self.checkpoint_location) / kind
        names = os.listdir(directory) if directory.is_dir() else []
        return sorted(int(name) for name in names if name.isdigit())


@dataclass(frozen=True, slots=True)
class ChildRun:
    """How one run of a pipeline in a child process ended.

    :param returncode: the child's exit status (0: the query finished).
    :param crashes: what the crash hook recorded before it killed the pipeline, one entry per
        kill (normally none or one).
    :param log: where the child's output is.
    :param seconds: how long the child ran.
    :param timed_out: whether the kit killed the child for running too long.
    :param stopped: why the kit killed the child before its end, certain it had failed (see
        :meth:`RunningChild.wait`), or ``""``.
    :param writer_kills: what the epoch writer recorded before it killed itself (the
        pipeline goes on without it).
    """

    returncode: int
    crashes: tuple[Mapping[str, Any], ...]
    log: Path
    seconds: float
    timed_out: bool = False
    stopped: str = ""
    writer_kills: tuple[Mapping[str, Any], ...] = ()

    @property
    def crashed(self) -> bool:
        """Whether the crash hook killed the pipeline."""
        return bool(self.crashes)

    def output(self) -> str:
        """The child's output (``""`` when there is none, or it cannot be read)."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, characters: int = 3000) -> str:
        """The end of the child's output, for a failure message."""
        try:
            text = self.log.read_text(errors="replace")[-characters:]
        except OSError as error:
            return f"(no output: {error})"
        return text or f"(nothing: its log {self.log} is empty)"


def faulthandler_on(environment: Mapping[str, str]) -> dict[str, str]:
    """``environment`` with Python's ``faulthandler`` on, in the child and the processes it starts.

    A Python process that dies of a signal (a fault in a C extension, the JVM's) then prints
    every thread's Python traceback to its standard error, which the kit shows.
    """
    return {**environment, "PYTHONFAULTHANDLER": "1"}


WATCH_INTERVAL_S = 2.0
"""How often a running child's progress is looked at for a failure already certain."""

Crash = str | Callable[[], str | None] | None
"""A run's crash point as ``LAMINAR_SPARK_CRASH_AT`` takes it, ``None`` for none, or a callable
that says it when the run's query starts (a point that depends on what the runs before it did)."""


class RunningChild:
    """A pipeline running in a child process (see :func:`start_child`); :meth:`wait` for it."""

    def __init__(
        self,
        pipeline: SparkPipeline,
        directory: Path,
        name: str,
        *,
        crash: Crash,
        python_path: tuple[str, ...],
        standby: bool = False,
    ) -> None:
        self._spec = spec = directory / f"{name}.json"
        self._log = directory / f"{name}.log"
        self._record = directory / f"{name}.crash"
        self._writer_kills = directory / f"{name}.writer-kills"
        self._crash = crash
        self._temporary = directory / f"{name}.tmp"
        self._timeout_s = pipeline.timeout_s + 120
        spec.write_text(pipeline.to_json(), encoding="utf-8")
        self._writer_kills.write_text(pipeline.epoch_writer_kills)
        self._record.unlink(missing_ok=True)
        shutil.rmtree(self._temporary, ignore_errors=True)
        self._temporary.mkdir()
        environment = spark_temporary_files_in(self._temporary, faulthandler_on(os.environ))
        environment.pop(CRASH_AT_VARIABLE, None)
        environment[CRASH_RECORD_VARIABLE] = str(self._record)
        # A file, so that a child started standing by is given its pipeline's kills later.
        environment[KILL_EPOCH_WRITER_VARIABLE] = f"{CRASH_AT_FILE_PREFIX}{self._writer_kills}"
        if SPARK_PYTHON_VARIABLE in environment:
            environment["PYSPARK_PYTHON"] = spark_python()  # its workers too
        if standby:
            # The child writes the file once released: no crash point while it warms up.
            crash_at = directory / f"{name}.crash-at"
            crash_at.unlink(missing_ok=True)
            environment[CRASH_AT_VARIABLE] = f"{CRASH_AT_FILE_PREFIX}{crash_at}"
        elif (point := _crash_point(crash)) is not None:
            environment[CRASH_AT_VARIABLE] = point
        if python_path:
            inherited = [environment["PYTHONPATH"]] if environment.get("PYTHONPATH") else []
            environment["PYTHONPATH"] = os.pathsep.join([*python_path, *inherited])
        self._started = time.monotonic()
        self._standing_by = standby
        with self._log.open("wb") as output:
            self._process = subprocess.Popen(
                [
                    spark_python(),
                    "-m",
                    CHILD_MODULE,
                    *([STANDBY_FLAG] if standby else []),
                    str(spec),
                ],
                stdin=subprocess.PIPE if standby else subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=environment,
                cwd=directory,  # Python workers import from their working directory first
                start_new_session=True,  # its own process group: one kill reaches the JVM too
                preexec_fn=die_with_parent,  # noqa: PLW1509 - only prctl, no locks or imports
            )

    def release(self, pipeline: SparkPipeline | None = None, crash: Crash = None) -> None:
        """Start the query of a child started with ``standby=True`` (nothing otherwise).

        Its timeout and :attr:`ChildRun.seconds` count from here. A child whose driver died
        while standing by is reported by :meth:`wait` as it ended.

        :param pipeline: the pipeline to run instead of the one the child was started with
            (same master: its driver is running) — for a driver started before its pipeline
            was known.
        :param crash: the crash point, for a child started without one.
        """
        if not self._standing_by:
            return
        self._standing_by = False
        if crash is not None:
            self._crash = crash
        if pipeline is not None:
            self._spec.write_text(pipeline.to_json(), encoding="utf-8")
            self._writer_kills.write_text(pipeline.epoch_writer_kills)
            self._timeout_s = pipeline.timeout_s + 120
        point = _crash_point(self._crash)
        order = f"{RELEASE} {point}\n" if point else f"{RELEASE}\n"
        self._started = time.monotonic()
        stdin = self._process.stdin  # a pipe: the child was started standing by
        with contextlib.suppress(BrokenPipeError):
            stdin.write(order.encode())  # type: ignore[union-attr]
        with contextlib.suppress(BrokenPipeError):
            stdin.close()  # type: ignore[union-attr]

    def kill(self) -> None:
        """SIGKILL the child and every process it started (its Spark driver, Python workers).

        A kill at a moment the caller picks, not at a crash point: :meth:`wait` still reports
        the run (``crashed`` is false, as the crash hook did not fire).
        """
        _kill_group(self._process.pid)

    def wait(self, failed: Callable[[], str] | None = None) -> ChildRun:
        """Wait for the child (killing it when it overruns its timeout), then clean up.

        A child standing by is released first.

        :param failed: asked every :data:`WATCH_INTERVAL_S` while the child runs: why the run
            has certainly failed already (``""``: it has not). The child is then killed, and
            the run says why (:attr:`ChildRun.stopped`), instead of running to its timeout.
        """
        self.release()
        timed_out, stopped = False, ""
        deadline = self._started + self._timeout_s
        interval = self._timeout_s if failed is None else WATCH_INTERVAL_S
        returncode: int | None = None
        try:
            while returncode is None:
                left = max(0.0, deadline - time.monotonic())
                try:
                    returncode = self._process.wait(min(left, interval))
                except subprocess.TimeoutExpired:
                    timed_out = time.monotonic() >= deadline
                    stopped = "" if timed_out or failed is None else failed()
                    if timed_out or stopped:
                        _kill_group(self._process.pid)
                        returncode = self._process.wait()
        finally:
            _kill_group(self._process.pid)  # Python workers orphaned by a killed JVM, if any
            shutil.rmtree(self._temporary, ignore_errors=True)  # what a killed JVM left
        recorded: tuple[Mapping[str, Any], ...] = ()
        if self._record.exists():
            lines = self._record.read_text(encoding="utf-8").splitlines()
            recorded = tuple(json.loads(line) for line in lines if line.strip())
        crashes = tuple(kill for kill in recorded if kill.get("at") != EPOCH_WRITER_KILLED)
        writer_kills = tuple(kill for kill in recorded if kill.get("at") == EPOCH_WRITER_KILLED)
        seconds = time.monotonic() - self._started
        return ChildRun(returncode, crashes, self._log, seconds, timed_out, stopped, writer_kills)


def start_child(
    pipeline: SparkPipeline,
    directory: Path,
    name: str,
    *,
    crash: Crash = None,
    python_path: tuple[str, ...] = (),
    standby: bool = False,
) -> RunningChild:
    """Start ``pipeline`` in a child process, to be killed by the crash hook at ``crash``.

    The child runs in ``directory``, where its files go (``NAME.json``, ``NAME.log``,
    ``NAME.crash``), so nothing lands in the caller's working directory. Every process the
    child started (its Spark driver, Python workers) is killed when it ends, and the child
    dies with this process. Their temporary files go to ``NAME.tmp`` there
    (:func:`spark_temporary_files_in`), removed when the child has ended, killed or not.
    Start several and wait for each to overlap their JVMs' start-up — from this thread: a
    Spark session of this process breaks when children are started from other threads
    (Python data sources are not found in it any more).

    :param crash: a crash point, as ``LAMINAR_SPARK_CRASH_AT`` takes it, or a callable
        that says it when the query starts.
    :param python_path: directories the child and Spark's workers import from first.
    :param standby: start the child's Spark driver now, warm it up with a query of the
        reference connectors in a directory of its own, and start the pipeline's query only
        at :meth:`RunningChild.release` (or :meth:`~RunningChild.wait`), its crash point set
        then: start the restart of a run that is to be killed while that run goes on, and
        the restart takes seconds instead of a driver's start-up. The child reads nothing of
        the pipeline's checkpoint before its release.
    """
    return RunningChild(
        pipeline, directory, name, crash=crash, python_path=python_path, standby=standby
    )


def one_after_another(
    pipeline: SparkPipeline,
    directory: Path,
    runs: Sequence[tuple[str, Crash]],
    *,
    python_path: tuple[str, ...] = (),
    standing_by: MutableMapping[str, RunningChild] | None = None,
) -> Generator[RunningChild, None, None]:
    """Run ``pipeline`` once per ``(name, crash)`` of ``runs``, each after the one before it.

    Yields each run's child with its query started; wait for it (or kill it) before taking
    the next. While a run goes on, the next run's driver starts standing by (see
    :func:`start_child`), so that a restart after a kill does not wait for a driver to start;
    a callable crash is called when its run's query starts. A child this starts standing by
    is killed when the iteration stops (close the iterator, ``contextlib.closing``, when
    stopping early).

    :param standing_by: children started earlier, standing by, for some of the runs (by run
        name, without a crash point), released with ``pipeline`` and the run's crash instead of
        starting those runs. Each is taken out of the mapping when its run starts; whoever
        started them kills the ones left there.
    """
    ready = {} if standing_by is None else standing_by

    def start(index: int, *, standby: bool) -> RunningChild:
        name, crash = runs[index]
        if name in ready:
            return ready.pop(name)
        return start_child(
            pipeline, directory, name, crash=crash, python_path=python_path, standby=standby
        )

    following: RunningChild | None = None
    try:
        for index in range(len(runs)):
            child = following or start(index, standby=False)
            following = None
            child.release(pipeline, runs[index][1])
            if index + 1 < len(runs):
                following = start(index + 1, standby=True)
            yield child
    finally:
        if following is not None:
            following.kill()
            following.wait()


def run_in_child(
    pipeline: SparkPipeline,
    directory: Path,
    name: str,
    *,
    crash: str | None = None,
    python_path: tuple[str, ...] = (),
) -> ChildRun:
    """Run ``pipeline`` in a child process and wait for it (see :func:`start_child`)."""
    return start_child(pipeline, directory, name, crash=crash, python_path=python_path).wait()


def run_pipeline_file(
    pipeline_file: Path, log: Path, *, crash: str | None = None, timeout_s: float = 600
) -> int:
    """``laminar run PIPELINE_FILE`` in a child process group, killed at ``crash`` if given.

    Its output goes to ``log``; the crash hook records the kill in ``log`` with the suffix
    ``.crash``. The run's Spark temporary files go to ``log`` with the suffix ``.tmp``,
    removed when it ends, and every process it started (a killed JVM's Python workers) is
    killed then. An inherited ``LAMINAR_SPARK_CRASH_AT`` is dropped.

    :param crash: a crash point, as ``LAMINAR_SPARK_CRASH_AT`` takes it.
    :returns: the run's exit status (not 0 when it was killed).
    :raises subprocess.TimeoutExpired: when it runs longer than ``timeout_s``.
    """
    temporary = log.with_suffix(".tmp")
    temporary.mkdir()
    environment = spark_temporary_files_in(
        temporary, faulthandler_on({**os.environ, "PYSPARK_PYTHON": spark_python()})
    )
    environment.pop(CRASH_AT_VARIABLE, None)
    environment[CRASH_RECORD_VARIABLE] = str(log.with_suffix(".crash"))
    if crash is not None:
        environment[CRASH_AT_VARIABLE] = crash
    with log.open("wb") as output:
        process = subprocess.Popen(
            [spark_python(), "-m", "laminar_sdk", "run", str(pipeline_file)],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=environment,
            cwd=pipeline_file.parent,
            start_new_session=True,
        )
        try:
            return process.wait(timeout=timeout_s)
        finally:
            _kill_group(process.pid)
            shutil.rmtree(temporary)


def _crash_point(crash: Crash) -> str | None:
    return crash() if callable(crash) else crash


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
