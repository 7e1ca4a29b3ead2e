"""A one-partition source whose rows come in ordered units: a table's versions, a directory's files.

Its position is a unit and the rows of it read. :class:`OrderedUnits` keeps that position
through polls, checkpoints and range plans; the source says which units follow a position,
how one is read, and how many rows it holds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

import pyarrow as pa

from laminar_sdk import (
    CheckpointError,
    PartitionInfo,
    PartitionRange,
    SourceBatch,
    SourceCheckpoint,
)
from laminar_sdk.reference._offsets import parse_count, single_offset

UnitT = TypeVar("UnitT")
SettingsT = TypeVar("SettingsT")

_FINISHED = "end"


@dataclass(frozen=True, slots=True)
class UnitPosition(Generic[UnitT]):
    """Where a source stands: ``rows`` rows into ``unit``, or past it when ``rows`` is None.

    Every unit before ``unit`` has been read.
    """

    unit: UnitT
    rows: int | None


@dataclass(frozen=True, slots=True)
class PositionFormat(Generic[UnitT]):
    """How a source writes its :class:`UnitPosition` in the offset of its one partition.

    A position is ``<unit>:<rows>`` or ``<unit>:end`` (the unit as ``str`` writes it), or with
    ``rows_first`` ``<rows>:<unit>`` or ``end:<unit>``: for units that may hold a ``:``.

    :param connector: the source's name, for messages (``files source``).
    :param partition: the name of the source's one partition.
    :param unit_name: what a unit is, for messages (``file``).
    :param rows_first: whether the rows come before the unit.
    :param parse_unit: a unit from its text; ``None`` when the text is not one. It may raise
        a :class:`~laminar_sdk.CheckpointError` of its own.
    """

    connector: str
    partition: str
    unit_name: str
    rows_first: bool
    parse_unit: Callable[[str], UnitT | None]

    def encode(self, position: UnitPosition[UnitT]) -> str:
        """``position`` as an offset."""
        rows = _FINISHED if position.rows is None else str(position.rows)
        unit = str(position.unit)
        return f"{rows}:{unit}" if self.rows_first else f"{unit}:{rows}"

    def decode(self, text: str) -> UnitPosition[UnitT]:
        """The position an offset holds.

        :raises CheckpointError: when ``text`` is not one of this format.
        """
        head, separator, tail = text.partition(":")
        rows, unit_text = (head, tail) if self.rows_first else (tail, head)
        unit = self.parse_unit(unit_text) if separator else None
        if unit is None:
            unit_field = f"<{self.unit_name}>"
            shapes = (
                f"'<rows>:{unit_field}' or '{_FINISHED}:{unit_field}'"
                if self.rows_first
                else f"'{unit_field}:<rows>' or '{unit_field}:{_FINISHED}'"
            )
            raise CheckpointError(
                f"{self.connector}: checkpoint position {text!r} is not {shapes}; was it "
                "written by another connector?"
            )
        if rows == _FINISHED:
            return UnitPosition(unit, None)
        return UnitPosition(unit, parse_count(self.connector, rows, "row position"))

    def position_in(self, checkpoint: SourceCheckpoint) -> UnitPosition[UnitT] | None:
        """The position ``checkpoint`` holds; ``None`` (the source's start) when it holds none.

        :raises CheckpointError: when it names another partition or an unreadable position.
        """
        encoded = single_offset(self.connector, checkpoint, self.partition)
        return None if encoded is None else self.decode(encoded)

    def checkpoint(self, position: UnitPosition[UnitT] | None) -> SourceCheckpoint:
        """A checkpoint holding ``position``; an empty one for ``None``."""
        if position is None:
            return SourceCheckpoint()
        return SourceCheckpoint({self.partition: self.encode(position)})

    def range_positions(
        self, partition_range: PartitionRange
    ) -> tuple[UnitPosition[UnitT] | None, UnitPosition[UnitT]]:
        """The positions ``partition_range`` starts (``None``: the source's start) and ends at.

        :raises CheckpointError: for a range of another partition, or an unreadable position.
        """
        if partition_range.partition != self.partition:
            raise CheckpointError(
                f"{self.connector}: a range of partition {partition_range.partition!r} was asked "
                f"for; this source has only {self.partition!r}"
            )
        start = partition_range.start
        return (None if start is None else self.decode(start)), self.decode(partition_range.end)


class UnitReader(ABC, Generic[UnitT]):
    """One unit being read: hands out exactly the rows asked for, and knows when it is done.

    Subclasses say how rows are taken and when the unit is finished.

    :param schema: the schema of the batches, that of a take with no rows.
    :param batches: the unit's batches after its first ``returned`` rows.
    :param returned: the rows of the unit returned before ``batches`` (a restored position);
        :meth:`take` counts on from there.
    """

    def __init__(
        self,
        unit: UnitT,
        schema: pa.Schema,
        batches: Generator[pa.RecordBatch, None, None],
        returned: int,
    ) -> None:
        self.unit = unit
        self.returned = returned
        self._schema = schema
        self._batches = batches

    @property
    @abstractmethod
    def finished(self) -> bool:
        """Whether every row of the unit has been returned."""

    @abstractmethod
    def take(self, count: int) -> pa.RecordBatch:
        """The next ``count`` rows, or fewer when the unit ends first."""

    def _joined(self, pieces: list[pa.RecordBatch]) -> pa.RecordBatch:
        """``pieces`` as one batch; one of the schema, with no rows, when there are none."""
        if not pieces:
            return pa.RecordBatch.from_pylist([], schema=self._schema)
        return pieces[0] if len(pieces) == 1 else pa.concat_batches(pieces)

    def close(self) -> None:
        """Close the batches (a reader's ``finally`` runs now, not at garbage collection)."""
        self._batches.close()


class OrderedUnits(Generic[UnitT, SettingsT]):
    """The position of a source reading ordered units, moved by polls and walked by plans.

    The source gives how its positions are written, and functions each called with the
    ``settings`` it holds while open:

    :param position_format: how a position is written in checkpoints and batches.
    :param following: the units after a position (all of them from the start for ``None``),
        in order, each with the rows of it already read: the position's own unit first when
        the position is inside it.
    :param open_unit: a reader of a unit after its first rows; ``None`` when no row follows
        them, and the unit is passed over.
    :param plannable_rows: the rows of a unit after its first ones, for a plan; ``None`` to end
        the plan before the unit, which it may do only when the plan holds rows already (its
        last argument).
    :param skips_empty_units: whether a unit with no rows to read is passed over, the position
        staying before it; otherwise it is read as any unit is, and the position moves past
        it, so that a plan without a bound needs no counts.

    ``records_total`` and ``bytes_total`` count the rows and Arrow bytes polls returned;
    ``units_finished`` the units whose rows have all been returned.
    """

    def __init__(
        self,
        position_format: PositionFormat[UnitT],
        *,
        following: Callable[[SettingsT, UnitPosition[UnitT] | None], Iterator[tuple[UnitT, int]]],
        open_unit: Callable[[SettingsT, UnitT, int], UnitReader[UnitT] | None],
        plannable_rows: Callable[[SettingsT, UnitT, int, bool], int | None],
        skips_empty_units: bool,
    ) -> None:
        self._format = position_format
        self._following = following
        self._open_unit = open_unit
        self._plannable_rows = plannable_rows
        self._skips_empty_units = skips_empty_units
        self._position: UnitPosition[UnitT] | None = None
        # Units passed over since the position: the next poll starts after them.
        self._passed: UnitPosition[UnitT] | None = None
        self._reader: UnitReader[UnitT] | None = None
        self.records_total = 0
        self.bytes_total = 0
        self.units_finished = 0

    @property
    def position(self) -> UnitPosition[UnitT] | None:
        """The position after the last row returned; ``None`` before any, without a restore."""
        return self._position

    def poll(self, settings: SettingsT, max_records: int, batch_size: int) -> SourceBatch | None:
        """Up to ``min(max_records, batch_size)`` rows of the unit being read.

        Moves on to the next unit when that one is finished; ``None`` when no unit holds a
        row to read now.

        :raises ValueError: when ``max_records < 1``.
        """
        if max_records < 1:
            connector = self._format.connector
            raise ValueError(f"{connector}: max_records must be >= 1, got {max_records}")
        limit = min(max_records, batch_size)
        while True:
            reader = self._reader or self._open_next(settings)
            if reader is None:
                return None
            batch = reader.take(limit)
            if reader.finished:
                self._position = UnitPosition(reader.unit, None)
                self._passed = None
                self.close()
                self.units_finished += 1
            else:
                self._position = UnitPosition(reader.unit, reader.returned)
            if batch.num_rows:
                self.records_total += batch.num_rows
                self.bytes_total += batch.nbytes
                offset = self._format.encode(self._position)
                return SourceBatch(batch, PartitionInfo(self._format.partition, offset))

    def _open_next(self, settings: SettingsT) -> UnitReader[UnitT] | None:
        """Open the unit the position is in, or else the next one with rows to read."""
        for unit, skip in self._following(settings, self._passed or self._position):
            self._reader = self._open_unit(settings, unit, skip)
            if self._reader is not None:
                return self._reader
            self._passed = UnitPosition(unit, None)
        return None

    def checkpoint(self) -> SourceCheckpoint:
        """The position after the last row returned: restoring it resumes right after it."""
        return self._format.checkpoint(self._position)

    def restore(self, checkpoint: SourceCheckpoint) -> None:
        """Resume after the position ``checkpoint`` holds (from the start when it holds none).

        :raises CheckpointError: when it names another partition or an unreadable position.
        """
        position = self._format.position_in(checkpoint)
        self.close()
        self._position = position
        self._passed = None

    def plan_end(
        self, settings: SettingsT, start: SourceCheckpoint, max_records: int | None
    ) -> SourceCheckpoint:
        """The position after the rows that follow ``start`` now, at most ``max_records``.

        ``start`` itself when no row follows it.

        :raises CheckpointError: when ``start`` is not a checkpoint of this source.
        """
        position = self._format.position_in(start)
        end, remaining = position, max_records
        for unit, skip in self._following(settings, position):
            if remaining is not None and remaining <= 0:
                break
            if remaining is None and not self._skips_empty_units:
                end = UnitPosition(unit, None)
                continue
            available = self._plannable_rows(settings, unit, skip, end != position)
            if available is None:
                break
            if not available and self._skips_empty_units:
                continue
            if remaining is None or available <= remaining:
                end = UnitPosition(unit, None)
                remaining = None if remaining is None else remaining - available
            else:
                end, remaining = UnitPosition(unit, skip + remaining), 0
        if end is None or end == position:
            return start
        return self._format.checkpoint(end)

    def close(self) -> None:
        """Close the unit being read (its files' ``finally`` run now, not when collected)."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None
