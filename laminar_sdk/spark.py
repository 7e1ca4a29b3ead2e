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
"""

from __future__ import annotations

from laminar_sdk._spark.datasource import FORMAT_NAME, LaminarDataSource
from laminar_sdk._spark.faults import (
    CRASH_AT_VARIABLE,
    CRASH_RECORD_VARIABLE,
    KILL_WRITER_VARIABLE,
    CrashPoint,
    CrashStep,
)
from laminar_sdk._spark.options import SDK_OPTIONS, BridgeOptions, SdkOption, parse_options
from laminar_sdk._spark.session import build_session

__all__ = [
    "CRASH_AT_VARIABLE",
    "CRASH_RECORD_VARIABLE",
    "FORMAT_NAME",
    "KILL_WRITER_VARIABLE",
    "SDK_OPTIONS",
    "BridgeOptions",
    "CrashPoint",
    "CrashStep",
    "LaminarDataSource",
    "SdkOption",
    "build_session",
    "parse_options",
]
