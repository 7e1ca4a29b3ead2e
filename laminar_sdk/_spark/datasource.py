"""``format("laminar")``: the Spark data source that runs connector plugins."""

from __future__ import annotations

import sys
from types import FrameType

import pyarrow as pa
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from laminar_sdk._contract.connector import SourceConnector
from laminar_sdk._contract.errors import ConfigurationError, SchemaMismatch
from laminar_sdk._contract.schema import sink_described
from laminar_sdk._plugins.loading import FoundEntryPoint
from laminar_sdk._plugins.registry import ConnectorRole
from laminar_sdk._runtime.delivery import validate_delivery_guarantee
from laminar_sdk._spark.arrow import arrow_schema, schema_differences, spark_schema
from laminar_sdk._spark.connectors import opened_sink, opened_source, run
from laminar_sdk._spark.handoff import HandoffDirectory
from laminar_sdk._spark.options import (
    CHECKPOINT_LOCATION,
    BridgeOptions,
    checkpointer_of,
    parse_options,
)
from laminar_sdk._spark.reader import LaminarPolledReader, LaminarRangeReader
from laminar_sdk._spark.writer import LaminarStreamWriter

FORMAT_NAME = "laminar"
"""The name queries use: ``spark.readStream.format("laminar")``."""


class LaminarDataSource(DataSource):
    """The ``laminar`` Spark data source: reads source and writes sink connector plugins.

    Reading: ``spark.readStream.format("laminar").option("connector", NAME)
    .options(**config).load()``. Writing: ``df.writeStream.format("laminar")
    .option("connector", NAME).options(**config).option("checkpointLocation", DIR).start()``.
    Options starting with ``laminar.`` are the SDK's (see
    :data:`laminar_sdk._spark.options.SDK_OPTIONS`); the others configure the connector and
    are checked against its declared keys.

    Spark registers it by itself, through the top-level module ``pyspark_laminar``. Every
    check that can fail — unknown connector or option, a plugin failing to open, a schema
    mismatch, a guarantee the connectors cannot keep — runs before any data moves: when the
    stream is loaded (source) or when the query starts (sink).

    How a connector is read and written depends on what it offers: a range-readable source is
    read range by range in parallel tasks, any other is polled by Spark's planning process
    into the read log, whose slices the tasks read (:mod:`._spark.reader`) — so a micro-batch
    re-run after a crash holds exactly its first run's records either way; a distributed-commit
    sink is staged by the write tasks
    and committed together, any other is written at the commit (:mod:`._spark.writer`), the
    tasks on the driver's machine handing their batches over in files
    (:mod:`._spark.handoff`).
    """

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._entry_points: dict[ConnectorRole, tuple[FoundEntryPoint, ...]] = {}
        """Each side's plugin and checkpoint store, as found (see :meth:`_options`)."""

    @classmethod
    def name(cls) -> str:
        """``laminar``."""
        return FORMAT_NAME

    def schema(self) -> StructType:
        """The source's schema: the source is opened (and closed) to ask for it.

        Every check of the read side runs here, when the stream is loaded.
        """
        options, _ = self._source()
        return spark_schema(run(_source_schema(options)), options.connector)

    def streamReader(  # noqa: N802 - Spark's name
        self, schema: StructType
    ) -> LaminarRangeReader | LaminarPolledReader:
        """The reader of the source: by ranges when it is range-readable, else polled and logged.

        :raises ConfigurationError: for a polled source without a checkpoint location.
        """
        options, source = self._source()
        if source.as_range_readable() is None:
            return LaminarPolledReader(
                options, arrow_schema(schema), replayable=source.supports_replay()
            )
        return LaminarRangeReader(options, arrow_schema(schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> LaminarStreamWriter:  # noqa: N802 - Spark's name
        """A writer to the sink connector, after opening it to check every setting.

        In Spark's commit runner, which calls this again only to commit or abort a
        micro-batch, the sink is not opened (:meth:`LaminarStreamWriter.for_commit`).

        :raises ConfigurationError: for output mode ``complete`` (``overwrite``), bad options
            or a guarantee the sink cannot keep.
        :raises SchemaMismatch: when the stream's columns do not fit the sink's schema.
        """
        options = self._options(ConnectorRole.SINK)
        if overwrite:
            raise ConfigurationError(
                f"sink {options.connector!r}: a laminar sink appends one epoch per "
                "micro-batch; output mode 'complete' would rewrite everything each time: use "
                "outputMode('append') or 'update'",
                key="outputMode",
            )
        if _in_commit_runner():
            return LaminarStreamWriter.for_commit(options)
        expected, distributed = _checked_sink(options, schema)
        handoff = None if distributed else HandoffDirectory.of_driver()
        return LaminarStreamWriter(options, expected, distributed=distributed, handoff=handoff)

    def _options(self, role: ConnectorRole) -> BridgeOptions:
        """The options of the ``role`` side, parsed.

        The entry points found of the plugin providing the connector and of the checkpoint
        store are remembered: Spark pickles this instance after asking for the schema and
        ships it to the source's planning process (a new one per query), which then imports
        that plugin alone, and neither looks for it nor for the store among the installed
        distributions (see :func:`~laminar_sdk._spark.options.registry_providing`).
        """
        options = parse_options(self.options, role, known=self._entry_points.get(role, ()))
        self._entry_points[role] = options.entry_points
        return options

    def _source(self) -> tuple[BridgeOptions, SourceConnector]:
        """The read side's options and an unopened source, every setting checked.

        :raises ConfigurationError: for a guarantee the source cannot keep, or a polled source
            without a checkpoint location for its read log.
        """
        options = self._options(ConnectorRole.SOURCE)
        source = options.registry().create_source(options.connector)
        validate_delivery_guarantee(
            options.delivery,
            sources={options.connector: source},
            sinks={},
            checkpointing_enabled=True,
        )
        if source.as_range_readable() is None and options.checkpoint_location is None:
            raise ConfigurationError(
                f"source {options.connector!r} is polled (it is not range-readable): each "
                "micro-batch it reads is kept in the laminar checkpoint location until Spark "
                "commits it, so that a micro-batch run again after a crash holds exactly the "
                "same records. Give readStream the same .option('checkpointLocation', DIR) as "
                f"writeStream, or .option('{CHECKPOINT_LOCATION}', DIR)",
                key=CHECKPOINT_LOCATION,
            )
        return options, source


_COMMIT_RUNNER = "pyspark.sql.worker.python_streaming_sink_runner"
"""The module of Spark's worker that calls ``streamWriter`` only to commit or abort."""


def _in_commit_runner() -> bool:
    """Whether Spark called ``streamWriter`` from its commit runner (for a commit or abort).

    Spark calls ``streamWriter`` when the query starts, to make the writer it ships to the
    write tasks, and again in each commit's runner; only the first must check the sink.
    """
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        spec = frame.f_globals.get("__spec__")
        if _COMMIT_RUNNER in (frame.f_globals.get("__name__"), getattr(spec, "name", None)):
            return True
        frame = frame.f_back
    return False


async def _source_schema(options: BridgeOptions) -> pa.Schema:
    async with opened_source(options) as source:
        return source.schema()


_SinkCheck = tuple[object, ...]
_CHECKED_SINKS: dict[_SinkCheck, tuple[pa.Schema, bool]] = {}
"""The sinks this process opened and checked (see :func:`_checked_sink`): options → result."""


def _checked_sink(options: BridgeOptions, stream: StructType) -> tuple[pa.Schema, bool]:
    """:func:`_sink_schema`, run once per process for the same options and stream schema.

    Spark calls ``streamWriter`` when the query starts, and again for every micro-batch in
    the Python worker that commits it, only to call the new writer's ``commit``. Opening the
    sink there to check it once more doubled the fixed cost of each commit (the Kafka sink
    connects, fences older producers and reads its epoch markers when it opens), although the
    commit opens the sink itself and checks each batch against the sink's schema. A check
    that fails is not remembered: it runs, and fails, again.
    """
    check: _SinkCheck = (
        options.connector,
        tuple(sorted(options.properties.items())),
        options.delivery,
        options.checkpoint_location,
        options.checkpoint_store,
        tuple(sorted(options.checkpoint_options.items())),
        stream.json(),
    )
    found = _CHECKED_SINKS.get(check)
    if found is None:
        found = _CHECKED_SINKS[check] = run(_sink_schema(options, stream))
    return found


async def _sink_schema(options: BridgeOptions, stream: StructType) -> tuple[pa.Schema, bool]:
    """The sink's schema, checked against the stream's, and whether it commits distributed."""
    checkpointer_of(options)
    async with opened_sink(options) as sink:
        validate_delivery_guarantee(
            options.delivery,
            sources={},
            sinks={options.connector: sink},
            checkpointing_enabled=True,
        )
        expected = sink.schema()
        distributed = sink.as_distributed_commit() is not None
    problems = schema_differences(expected, arrow_schema(stream))
    if problems:
        raise SchemaMismatch(
            f"{sink_described(options.connector, expected)} cannot take this stream: "
            f"{'; '.join(problems)}. "
            "Select or cast the columns before writeStream"
        )
    return expected, distributed
