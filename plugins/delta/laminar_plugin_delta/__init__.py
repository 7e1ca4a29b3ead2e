"""Laminar connectors for Delta Lake tables, on local disk and S3: the ``delta`` source and sink.

- :class:`DeltaSource` reads the rows each committed version of a table appended, in version
  order, as versions are committed, replayably (its checkpoint is the version being read and
  the row in it); versions that only compact files add nothing, and versions that delete or
  rewrite rows are refused (or skipped, with ``skip_change_commits``). It is also a
  range-readable source, so Spark plans a micro-batch from the log alone.
- :class:`DeltaSink` appends each epoch to a Delta table exactly once, in one Delta
  transaction that records the epoch as the table's transaction version of the app id
  ``laminar-<sink.id>``; it is also a distributed-commit sink, so Spark's write tasks write
  the data files in parallel and the driver commits them together.

Any Delta reader sees each epoch's rows once: ``deltalake`` (delta-rs), Spark with Delta's
connector, DuckDB's and Polars' Delta readers.

The plugin registers both through the ``laminar_sdk.plugins`` entry point ``delta`` and gives
the conformance kit a test context for each (:mod:`laminar_plugin_delta.testing`, imported
only when the kit asks for one) without depending on the kit.
"""

from __future__ import annotations

from laminar_plugin_delta._plugin import (
    CONNECTOR,
    laminar_conformance_context,
    laminar_register_connectors,
)
from laminar_plugin_delta._sink import APP_ID_PREFIX, DeltaSink
from laminar_plugin_delta._source import DeltaSource

__all__ = [
    "APP_ID_PREFIX",
    "CONNECTOR",
    "DeltaSink",
    "DeltaSource",
    "laminar_conformance_context",
    "laminar_register_connectors",
]
