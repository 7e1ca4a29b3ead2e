"""Laminar connectors for Delta Lake tables, on local disk and S3: the ``delta`` sink.

- :class:`DeltaSink` appends each epoch to a Delta table exactly once, in one Delta
  transaction that records the epoch as the table's transaction version of the app id
  ``laminar-<sink.id>``; it is also a distributed-commit sink, so Spark's write tasks write
  the data files in parallel and the driver commits them together.

Any Delta reader sees each epoch's rows once: ``deltalake`` (delta-rs), Spark with Delta's
connector, DuckDB's and Polars' Delta readers.

The plugin registers through the ``laminar_sdk.plugins`` entry point ``delta`` and gives the
conformance kit a test context (:mod:`laminar_plugin_delta.testing`, imported only when the
kit asks for one) without depending on the kit.
"""

from __future__ import annotations

from laminar_plugin_delta._plugin import (
    CONNECTOR,
    laminar_conformance_context,
    laminar_register_connectors,
)
from laminar_plugin_delta._sink import APP_ID_PREFIX, DeltaSink

__all__ = [
    "APP_ID_PREFIX",
    "CONNECTOR",
    "DeltaSink",
    "laminar_conformance_context",
    "laminar_register_connectors",
]
