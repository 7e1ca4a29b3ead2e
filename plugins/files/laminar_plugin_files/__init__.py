"""Laminar connectors for files in a directory: the ``files`` source and the ``files`` sink.

- :class:`FilesSource` reads Parquet, CSV or JSON Lines files as they appear in a directory,
  in name order, replayably (its checkpoint is the file being read and the row in it); it is
  also a range-readable source, so Spark can plan a micro-batch by position.
- :class:`FilesSink` writes Parquet or JSON Lines files, publishing each epoch exactly once
  with one atomic directory rename; it is also a distributed-commit sink, so Spark's write
  tasks can stage an epoch in parallel.

The plugin registers both through the ``laminar_sdk.plugins`` entry point ``files``, and
gives the conformance kit a test context for each (:mod:`laminar_plugin_files.testing`,
imported only when the kit asks for one) without depending on the kit.
"""

from __future__ import annotations

from laminar_plugin_files._plugin import (
    CONNECTOR,
    laminar_conformance_context,
    laminar_register_connectors,
)
from laminar_plugin_files._sink import FilesSink
from laminar_plugin_files._source import FilesSource

__all__ = [
    "CONNECTOR",
    "FilesSink",
    "FilesSource",
    "laminar_conformance_context",
    "laminar_register_connectors",
]
