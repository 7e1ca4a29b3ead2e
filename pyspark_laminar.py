"""Spark's entry point to Laminar: makes ``format("laminar")`` work in every SparkSession.

Spark 4 imports every top-level module whose name starts with ``pyspark_`` at its first data
source lookup and registers the module's ``DefaultSource`` under ``DefaultSource.name()``; so
installing ``laminar-sdk`` is all it takes, no registration call.
"""

from __future__ import annotations

from laminar_sdk._spark.datasource import LaminarDataSource as DefaultSource

__all__ = ["DefaultSource"]
