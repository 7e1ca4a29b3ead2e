"""Running a pipeline file on Spark: what ``laminar run PIPELINE.toml`` does."""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import py4j
from py4j.protocol import Py4JJavaError, Py4JNetworkError
from pyspark.errors import PySparkException
from pyspark.sql.streaming.listener import StreamingQueryProgress
from pyspark.sql.streaming.query import StreamingQuery

from laminar_sdk._checkpointing.recovery import search_latest_valid
from laminar_sdk._pipeline_files.file import PipelineFile
from laminar_sdk._plugins.registry import ConnectorRegistry, ConnectorRole
from laminar_sdk._spark import fault_seam
from laminar_sdk._spark.options import checkpointer_of, parse_options
from laminar_sdk._spark.session import DRIVER_JAVA_OPTIONS, build_session

SOURCE_VIEW = "source"
"""The temporary view a pipeline's SQL transform reads the source from."""

DRIVER_LOST = (Py4JNetworkError, ConnectionError)
"""What a call into Spark raises once the driver's JVM is gone (killed, or crashed)."""


PIPELINE_FAILED = (PySparkException, Py4JJavaError)
"""What Spark raises when a pipeline fails once Spark started: the query failed, or Spark
refused to start it (a checkpoint location it cannot write, a SQL transform that does not
analyse)."""


def failure_text(error: BaseException) -> str:
    """All Spark says of a failed pipeline: the Python and Java tracebacks, as Spark joined them.

    A PySpark exception's text holds its causes' stack traces when the session enables
    ``spark.sql.pyspark.jvmStacktrace.enabled`` (:func:`start_pipeline` does).
    """
    if isinstance(error, Py4JJavaError):
        return f"{error.errmsg}\n{error.java_exception}"
    return str(error)


_PATH_IN_MESSAGE = re.compile(r"(?:file:)?(/[^\s,;:'\"]+)")


def checkpoint_hint(line: str, pipeline: PipelineFile) -> str:
    """What to add to a failure ``line`` that names the checkpoint location or a directory above it.

    The key that sets it, and what Spark needs of it; empty when the line names neither.
    """
    location = Path(pipeline.checkpoint_location)
    on_its_way = {location, *list(location.parents)[:-1]}
    if not any(Path(path) in on_its_way for path in _PATH_IN_MESSAGE.findall(line)):
        return ""
    return (
        f" (pipeline.checkpoint_location is {location}: Spark and laminar keep the pipeline's "
        "progress there, and must be able to create and write it)"
    )


NEARLY_FULL_BYTES = 64 * 1024 * 1024
"""A file system with less free than this is named as the full one after a failure that says
no space is left."""


def full_disk_hint(text: str, pipeline: PipelineFile) -> str:
    """For a failure whose report says no space is left: which file system it was, or ``""``.

    The report seldom names the file (Java's ``IOException: No space left on device`` does
    not), so the places the pipeline writes are looked at: the checkpoint location, Spark's
    temporary files, and each connector option that is a local path. Those with less than
    :data:`NEARLY_FULL_BYTES` free now are named, with the key that sets each.
    """
    if "No space left on device" not in text:
        return ""
    places = {
        "pipeline.checkpoint_location": pipeline.checkpoint_location,
        "Spark's temporary files (TMPDIR)": tempfile.gettempdir(),
    }
    for role, options in (("source", pipeline.source_options), ("sink", pipeline.sink_options)):
        places |= {f"{role}.{key}": value for key, value in options.items() if value[:1] == "/"}
    full = []
    for what, place in places.items():
        existing = Path(place)
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        free = shutil.disk_usage(existing).free
        if free < NEARLY_FULL_BYTES:
            full.append(f"{what} ({place}: {free // 1024} KiB free)")
    if not full:
        return (
            ". None of the places this pipeline writes is full now: "
            f"{', '.join(f'{what} ({place})' for what, place in places.items())}"
        )
    return f". Full: {'; '.join(full)}: free space there, or point the key elsewhere"


_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
"""


@dataclass(frozen=True)
class RunLog:
    """Where Spark's own log of one ``laminar run`` goes, instead of the terminal.

    A directory in the system's temporary directory (not beside the checkpoint location,
    which may be what could not be written), holding Spark's log (``spark.log``) and the
    log4j configuration that sends it there. The terminal keeps laminar's lines only.
    """

    directory: Path

    @classmethod
    def new(cls, pipeline: PipelineFile) -> RunLog:
        """A new one for a run of ``pipeline``."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        directory = Path(tempfile.mkdtemp(prefix=f"laminar-run-{pipeline.path.stem}-{stamp}-"))
        (directory / "log4j2.properties").write_text(_LOG4J2.format(log=directory / "spark.log"))
        return cls(directory)

    @property
    def path(self) -> Path:
        """Spark's log, and a failed run's whole report at its end."""
        return self.directory / "spark.log"

    @property
    def java_option(self) -> str:
        """The driver's JVM option that sends Spark's log here."""
        return f"-Dlog4j2.configurationFile={self.directory / 'log4j2.properties'}"

    def keep_failure(self, text: str) -> Path:
        """Add a failed run's whole report to the log; the log's path."""
        with self.path.open("a", encoding="utf-8") as log:
            log.write(f"\n--- the pipeline failed: Spark's report ---\n{text}\n")
        return self.path

    def remove(self) -> None:
        """Remove the log: the run went well."""
        shutil.rmtree(self.directory, ignore_errors=True)


class _LostDriverTraceback(logging.Filter):
    """Drops py4j's traceback of a command the lost driver could not answer.

    py4j logs it on the root logger (``logging.exception("Exception while sending
    command.")`` in ``GatewayClient.send_command``) before it raises, in whichever thread
    was talking to the JVM. The error the caller then reports, in one line, says all of it
    (:func:`driver_lost`).
    """

    _PY4J = Path(py4j.__file__).parent

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (isinstance(error, DRIVER_LOST) and Path(record.pathname).parent == self._PY4J)


_LOST_DRIVER_TRACEBACK = _LostDriverTraceback()


def quiet_lost_driver_tracebacks() -> None:
    """From now on, py4j logs no traceback when the driver's JVM is gone (see above)."""
    logging.getLogger().addFilter(_LOST_DRIVER_TRACEBACK)  # a second add does nothing


def driver_lost(error: BaseException) -> str:
    """What to tell the user when a call into Spark raised one of :data:`DRIVER_LOST`.

    When :data:`~laminar_sdk.faults.CRASH_AT_VARIABLE` is set, the kill is most likely the one
    it asks for, and the message says so — certainly, when the hook's record
    (:data:`~laminar_sdk.faults.CRASH_RECORD_VARIABLE`) shows it.
    """
    cause = f"({type(error).__name__}: {error})"
    resume = "Nothing committed is lost: run the pipeline again and it resumes from its checkpoint"
    deliberate = fault_seam.deliberate_kill(cause)
    if deliberate is not None:
        return f"{deliberate}. {resume}"
    return (
        f"Spark's driver (its JVM) is gone: it was killed or crashed while the pipeline "
        f"ran {cause}. {resume}"
    )


@dataclass(frozen=True, slots=True)
class EpochProgress:
    """One micro-batch as Spark reported it, and what the sink made of it.

    :param epoch: the epoch, Spark's batch id.
    :param rows_read: the rows the source delivered (Spark's ``numInputRows``).
    :param rows_written: the rows handed to the sink, after the transform (the sink's
        ``numOutputRows``, which Spark counts in the write tasks that succeeded); ``None`` when
        Spark did not count them.
    :param rerun: whether this is a micro-batch Spark ran again after a restart, for an epoch
        whose commit the sink had decided before it: the sink recognises the epoch and writes
        nothing twice (a commit left unfinished is finished, with what was decided then).
    :param commit_ms: how long Spark took to hand the micro-batch to the sink and commit it.
    """

    epoch: int
    rows_read: int
    rows_written: int | None
    rerun: bool
    commit_ms: int

    def __str__(self) -> str:
        if self.rerun:
            return (
                f"epoch {self.epoch}: {self.rows_read} rows read again after a restart; its "
                f"commit was decided before, so nothing is written twice ({self.commit_ms} ms)"
            )
        written = "?" if self.rows_written is None else str(self.rows_written)
        return (
            f"epoch {self.epoch}: {self.rows_read} rows read, {written} written, committed in "
            f"{self.commit_ms} ms"
        )

    @classmethod
    def of(cls, progress: StreamingQueryProgress, *, decided_through: int) -> EpochProgress:
        """What Spark's ``progress`` of a micro-batch says.

        :param decided_through: the newest epoch decided before the query started (``-1``:
            none), from :func:`decided_epochs`.
        """
        written = progress.sink.numOutputRows
        return cls(
            epoch=progress.batchId,
            rows_read=progress.numInputRows,
            rows_written=written if written >= 0 else None,
            rerun=progress.batchId <= decided_through,
            commit_ms=int(progress.durationMs.get("addBatch", 0)),
        )


def decided_epochs(pipeline: PipelineFile, registry: ConnectorRegistry) -> int:
    """The newest epoch whose commit the sink's checkpoint location records; ``-1`` for none.

    Read before the query starts: Spark runs the micro-batch of an epoch up to that one again
    after a crash, and the sink skips it. Damaged checkpoints are passed over, as recovery
    passes over them (which reports them).
    """
    sink = ConnectorRole.SINK
    options = parse_options(pipeline.spark_options(sink), sink, registry)
    search = asyncio.run(search_latest_valid(checkpointer_of(options), on_skip=lambda _: None))
    return -1 if search.recovered is None else search.recovered.manifest.epoch


def start_pipeline(pipeline: PipelineFile, log: RunLog) -> StreamingQuery:
    """Build the Spark session and start the pipeline's streaming query; Spark logs to ``log``."""
    spark = build_session(
        master=pipeline.master,
        app_name=f"laminar {pipeline.path.stem}",
        # Each epoch is reported as it commits; Spark's own progress bar would garble that.
        **{
            "spark.ui.showConsoleProgress": "false",
            DRIVER_JAVA_OPTIONS: log.java_option,
            # A failed query's exception then carries its causes' stack traces, where what
            # the connector raised in a Python worker is (failure_text).
            "spark.sql.pyspark.jvmStacktrace.enabled": "true",
        },
    )
    frame = (
        spark.readStream.format("laminar")
        .options(**pipeline.spark_options(ConnectorRole.SOURCE))
        .load()
    )
    if pipeline.transform_sql is not None:
        frame.createOrReplaceTempView(SOURCE_VIEW)
        frame = spark.sql(pipeline.transform_sql)
    writer = frame.writeStream.format("laminar").options(
        **pipeline.spark_options(ConnectorRole.SINK)
    )
    if pipeline.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{pipeline.interval_s} seconds")
    return writer.start()


def follow(
    query: StreamingQuery, report: Callable[[EpochProgress], None], *, decided_through: int = -1
) -> None:
    """Wait for ``query`` to end, reporting each micro-batch once as it completes.

    On Ctrl-C the query is stopped: Spark aborts the micro-batch in flight, whose epoch is
    rolled back unless its commit was already decided (then the next start finishes it).

    :param decided_through: :func:`decided_epochs`, read before the query started.
    :raises pyspark.errors.StreamingQueryException: when the query failed.
    """
    reported: set[int] = set()
    try:
        while True:
            finished = query.awaitTermination(1)
            for progress in query.recentProgress:
                if progress.batchId not in reported and progress.numInputRows > 0:
                    reported.add(progress.batchId)
                    report(EpochProgress.of(progress, decided_through=decided_through))
            if finished:
                return
    except KeyboardInterrupt:
        query.stop()
        raise
