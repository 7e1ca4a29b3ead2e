"""Test contexts for the SDK's reference connectors, registered by the kit as a plugin.

The kit registers this module on its plugin manager, after the installed plugins
(``trylast``), so the reference connectors are tested exactly like a third-party plugin's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from laminar_sdk import ConnectorConfig, hookimpl
from laminar_sdk.reference import MemorySink, MemorySource, ids_batch

_GENERATOR_PARTITIONS = 3
_MEMORY_SOURCE_PARTITIONS = 3


class MemorySinkContext:
    """The ``memory`` sink writing to ``workdir/memory-sink``, read with ``committed_ids``."""

    def __init__(self, workdir: Path) -> None:
        self._path = workdir / "memory-sink"

    def config(self) -> ConnectorConfig:
        """``path`` = this context's directory; the ``ids`` schema."""
        return ConnectorConfig("memory", {"path": str(self._path)})

    def batch(self, ids: Sequence[int]) -> pa.RecordBatch:
        """An ``ids`` batch."""
        return ids_batch(ids)

    def committed_ids(self) -> list[int]:
        """The ids of every committed epoch."""
        return MemorySink.committed_ids(self._path)

    def close(self) -> None:
        """Nothing to release: the directory is the kit's."""


class NullSinkContext:
    """The ``null`` sink: it keeps nothing, so there is nothing to read back."""

    def config(self) -> ConnectorConfig:
        """No ``path``: counts are not recorded."""
        return ConnectorConfig("null", {})

    def batch(self, ids: Sequence[int]) -> pa.RecordBatch:
        """An ``ids`` batch."""
        return ids_batch(ids)

    def committed_ids(self) -> None:
        """``None``: the null sink drops every record."""
        return

    def close(self) -> None:
        """Nothing to release."""


class MemorySourceContext:
    """The ``memory`` source reading ``workdir/memory-source``, three partitions.

    Records appended while a source runs reach it at its next poll (``live_appends``).
    """

    partitions = _MEMORY_SOURCE_PARTITIONS
    live_appends = True

    def __init__(self, workdir: Path) -> None:
        self._path = workdir / "memory-source"

    def config(self) -> ConnectorConfig:
        """``path`` = this context's directory."""
        return ConnectorConfig("memory", {"path": str(self._path)})

    def append(self, ids: Sequence[int], partition: int | None = None) -> None:
        """Append with :meth:`MemorySource.append`."""
        MemorySource.append(self._path, ids, partition=partition or 0)

    def remove_partition(self, partition: int) -> None:
        """Remove with :meth:`MemorySource.remove_partition`."""
        MemorySource.remove_partition(self._path, partition)

    def ids(self, records: pa.RecordBatch) -> list[int]:
        """The ``id`` column."""
        return [int(value) for value in records.column("id").to_pylist()]

    def close(self) -> None:
        """Nothing to release."""


class GeneratorSourceContext:
    """The ``generator`` source, its rows standing for the ids the kit appended.

    The generator's rows are fixed by its configuration, so :meth:`append` only records the
    kit's ids: row ``i`` of partition ``p`` (generator id ``i * partitions + p``) stands for
    the ``i``-th id appended to ``p``, and ``rows`` is the number appended to each partition.
    """

    partitions = _GENERATOR_PARTITIONS
    equal_partitions = True
    skip_checks = {  # noqa: RUF012 - read by the kit, never mutated
        "live-appends": "the generator's rows are fixed by its configuration (rows, partitions)",
    }

    def __init__(self) -> None:
        self._ids: list[list[int]] = [[] for _ in range(self.partitions)]

    def config(self) -> ConnectorConfig:
        """``partitions`` = 3, ``rows`` = records appended per partition, small batches.

        :raises ValueError: when the partitions were given different numbers of records.
        """
        counts = {len(ids) for ids in self._ids}
        if len(counts) > 1:
            raise ValueError(
                "generator context: append the same number of ids to every partition, "
                f"got {sorted(len(ids) for ids in self._ids)}"
            )
        rows = counts.pop()
        properties = {"partitions": str(self.partitions), "rows": str(rows), "batch_size": "4"}
        return ConnectorConfig("generator", properties)

    def append(self, ids: Sequence[int], partition: int | None = None) -> None:
        """Record ``ids`` as the next rows of ``partition``."""
        self._ids[partition or 0].extend(ids)

    def ids(self, records: pa.RecordBatch) -> list[int]:
        """The appended id each generated row stands for."""
        generated = records.column("id").to_pylist()
        return [self._ids[g % self.partitions][g // self.partitions] for g in generated]

    def close(self) -> None:
        """Nothing to release."""


@hookimpl(trylast=True)
def laminar_conformance_context(
    connector: str, role: str, workdir: Path
) -> MemorySinkContext | NullSinkContext | MemorySourceContext | GeneratorSourceContext | None:
    """Contexts for ``memory`` and ``null`` (sinks), ``memory`` and ``generator`` (sources)."""
    match (connector, role):
        case ("memory", "sink"):
            return MemorySinkContext(workdir)
        case ("null", "sink"):
            return NullSinkContext()
        case ("memory", "source"):
            return MemorySourceContext(workdir)
        case ("generator", "source"):
            return GeneratorSourceContext()
    return None
