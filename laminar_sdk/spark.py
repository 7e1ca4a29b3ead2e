"""The Spark bridge: connector plugins as the Spark data source ``format("laminar")``.

Importing this module imports ``pyspark`` (install ``laminar-sdk[spark]``); nothing else in
the SDK does. Spark finds the data source by itself, through the top-level module
``pyspark_laminar``: in any SparkSession, once the SDK is installed::

    spark.readStream.format("laminar").option("connector", "generator").load()
    df.writeStream.format("laminar").option("connector", "memory").option("path", out)
        .option("checkpointLocation", checkpoints).start()

Options named ``laminar.*`` belong to the SDK (:data:`SDK_OPTIONS` lists them with their
defaults); every other option is the connector's configuration. :func:`build_session` builds a
session whose Python workers run the current interpreter.

What the bridge demands of a connector's batches is public too, for test kits to check before
anything runs on Spark: :func:`spark_round_trip_schema` (the types a schema has after crossing
Spark), :func:`schema_differences` and :func:`conform_source_batch`; and what a failed
pipeline's report says in one line, :func:`failure_line`.
"""

from __future__ import annotations

from laminar_sdk._contract.errors import failure_line
from laminar_sdk._spark.arrow import (
    conform_source_batch,
    schema_differences,
    spark_round_trip_schema,
)
from laminar_sdk._spark.datasource import FORMAT_NAME, LaminarDataSource
from laminar_sdk._spark.options import SDK_OPTIONS, BridgeOptions, SdkOption, parse_options
from laminar_sdk._spark.session import build_session

__all__ = [
    "FORMAT_NAME",
    "SDK_OPTIONS",
    "BridgeOptions",
    "LaminarDataSource",
    "SdkOption",
    "build_session",
    "conform_source_batch",
    "failure_line",
    "parse_options",
    "schema_differences",
    "spark_round_trip_schema",
]
