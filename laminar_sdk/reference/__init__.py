"""The reference connectors shipped with the SDK, for tests, benchmarks and examples.

They register through the ``laminar_sdk.plugins`` entry point (``reference``), exactly as a
third-party plugin does, under these names:

- ``generator`` source — deterministic, replayable, partitioned rows whose ids are unique
  across partitions (:class:`GeneratorSource`);
- ``memory`` source — replays records a test appended to a directory (:class:`MemorySource`);
- ``memory`` sink — commits epochs exactly once to a directory, with a two-phase commit that
  survives a restart (:class:`MemorySink`);
- ``null`` sink — counts records and bytes, keeps nothing, at-least-once (:class:`NullSink`).

Every bit of state a restarted process needs lives in the checkpoint (sources) or in the
``path`` directory (memory and null), never only in memory.

Helpers the reference and first-party connectors share, public for any plugin's use:

- :class:`Lifecycle` (unopened → open → closed, with the contract's errors);
- :func:`conform_batch` (a sink's batch against its schema, with a message naming each
  difference);
- :func:`parse_count` (a checkpoint offset as a count, or a :class:`~laminar_sdk.CheckpointError`);
- :func:`single_offset` (the offset of a one-partition source's checkpoint) and
  :func:`first_rows` (a range read's batches, cut at the rows the range holds);
- :class:`OrderedUnits` (the position of a one-partition source whose rows come in ordered
  units, a :class:`UnitPosition`, through polls, checkpoints and range plans), with its
  :class:`PositionFormat` and :class:`UnitReader`;
- :func:`parse_schema` (a ``schema`` key written ``name type, ...``, the types as
  :func:`arrow_type` reads them);
- :func:`storage_location` (a local directory or an object-store prefix, from a ``path`` key and
  the :data:`S3_KEYS`, as a pyarrow filesystem: :class:`StorageLocation`).
"""

from __future__ import annotations

from laminar_sdk.reference._generator import UNBOUNDED, GeneratorSource
from laminar_sdk.reference._lifecycle import Lifecycle
from laminar_sdk.reference._location import S3_KEYS, StorageLocation, storage_location
from laminar_sdk.reference._memory import MemorySink, MemorySource
from laminar_sdk.reference._null import EpochCount, NullSink
from laminar_sdk.reference._offsets import first_rows, parse_count, single_offset
from laminar_sdk.reference._ordered_units import (
    OrderedUnits,
    PositionFormat,
    UnitPosition,
    UnitReader,
)
from laminar_sdk.reference._plugin import laminar_register_connectors
from laminar_sdk.reference._schemas import (
    IDS_SCHEMA,
    SCHEMAS,
    TYPE_EXAMPLES,
    WIDE_SCHEMA,
    arrow_type,
    conform_batch,
    ids_batch,
    parse_schema,
)

__all__ = [
    "IDS_SCHEMA",
    "S3_KEYS",
    "SCHEMAS",
    "TYPE_EXAMPLES",
    "UNBOUNDED",
    "WIDE_SCHEMA",
    "EpochCount",
    "GeneratorSource",
    "Lifecycle",
    "MemorySink",
    "MemorySource",
    "NullSink",
    "OrderedUnits",
    "PositionFormat",
    "StorageLocation",
    "UnitPosition",
    "UnitReader",
    "arrow_type",
    "conform_batch",
    "first_rows",
    "ids_batch",
    "laminar_register_connectors",
    "parse_count",
    "parse_schema",
    "single_offset",
    "storage_location",
]
