"""``format("laminar")``: the Spark data source that runs connector plugins."""

from __future__ import annotations

import asyncio

import pyarrow as pa
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from laminar_sdk._checkpointing.registry import open_checkpointer
from laminar_sdk._delivery import validate_delivery_guarantee
from laminar_sdk._errors import ConfigurationError, SchemaMismatch
from laminar_sdk._registry import ConnectorRole
from laminar_sdk._spark.arrow import arrow_schema, schema_differences, spark_schema
from laminar_sdk._spark.connectors import opened_sink, opened_source
from laminar_sdk._spark.options import BridgeOptions, connector_registry, parse_options
from laminar_sdk._spark.reader import LaminarStreamReader
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
    """

    @classmethod
    def name(cls) -> str:
        """``laminar``."""
        return FORMAT_NAME

    def schema(self) -> StructType:
        """The source's schema: the source is opened (and closed) to ask for it."""
        options = self._options(ConnectorRole.SOURCE)
        return spark_schema(asyncio.run(_source_schema(options)), options.connector)

    def simpleStreamReader(self, schema: StructType) -> LaminarStreamReader:  # noqa: N802 - Spark's name
        """A reader of the source connector, after checking the delivery guarantee."""
        options = self._options(ConnectorRole.SOURCE)
        validate_delivery_guarantee(
            options.delivery,
            sources={options.connector: connector_registry().create_source(options.connector)},
            sinks={},
            checkpointing_enabled=True,
        )
        return LaminarStreamReader(options, arrow_schema(schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> LaminarStreamWriter:  # noqa: N802 - Spark's name
        """A writer to the sink connector, after opening it to check every setting.

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
        return LaminarStreamWriter(options, asyncio.run(_sink_schema(options, schema)))

    def _options(self, role: ConnectorRole) -> BridgeOptions:
        return parse_options(self.options, role)


async def _source_schema(options: BridgeOptions) -> pa.Schema:
    async with opened_source(options) as source:
        return source.schema()


async def _sink_schema(options: BridgeOptions, stream: StructType) -> pa.Schema:
    assert options.checkpoint_location is not None, "parse_options sets it for sinks"
    open_checkpointer(
        options.checkpoint_location,
        store=options.checkpoint_store,
        options=options.checkpoint_options,
    )
    async with opened_sink(options) as sink:
        validate_delivery_guarantee(
            options.delivery,
            sources={},
            sinks={options.connector: sink},
            checkpointing_enabled=True,
        )
        expected = sink.schema()
    problems = schema_differences(expected, arrow_schema(stream))
    if problems:
        raise SchemaMismatch(
            f"sink {options.connector!r} cannot take this stream: {'; '.join(problems)}. "
            "Select or cast the columns before writeStream"
        )
    return expected
