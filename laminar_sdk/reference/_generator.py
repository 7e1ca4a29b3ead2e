"""The ``generator`` source: deterministic, replayable, partitioned rows."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import ClassVar, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from laminar_sdk import (
    CheckpointError,
    ConfigKeySpec,
    ConfigurationError,
    ConnectorConfig,
    ConnectorMetrics,
    PartitionInfo,
    PartitionRange,
    RangeReadableSource,
    SourceBatch,
    SourceCheckpoint,
    SourceConnector,
)
from laminar_sdk.reference._lifecycle import Lifecycle
from laminar_sdk.reference._offsets import (
    NEXT_PARTITION,
    next_partition_in,
    offsets_in,
    parse_count,
    planned_ends,
    range_bounds,
)
from laminar_sdk.reference._schemas import SCHEMA_KEY, WIDE_SCHEMA, configured_schema

T = TypeVar("T")

UNBOUNDED = -1
"""The ``rows`` value for a partition that never ends."""

STARTED_AT = "started_at_ms"
"""The checkpoint metadata key of a paced generator: when its stream started (Unix ms)."""

_NAME = "generator"
_GOLDEN = 0x9E3779B97F4A7C15
_MAX_PARTITIONS = 2**31  # the partition column is int32
_EVENT_TIME_ORIGIN_US = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z
_U64 = pa.uint64()


_MIX_1 = 0xBF58476D1CE4E5B9
_MIX_2 = 0x94D049BB133111EB
_MASK = 2**64 - 1


def _mix(value: int) -> int:
    """SplitMix64's mixing of one value: ``splitmix64(x)`` is ``_mix(x + G)`` (mod 2**64)."""
    value = ((value ^ (value >> 30)) * _MIX_1) & _MASK
    value = ((value ^ (value >> 27)) * _MIX_2) & _MASK
    return value ^ (value >> 31)


def _mix_array(values: pa.Array) -> pa.Array:
    """:func:`_mix` element-wise on uint64 (wrapping arithmetic), one kernel per step."""
    z = pc.multiply(pc.bit_wise_xor(values, pc.shift_right(values, _SHIFT_30)), _MIX_1_U64)
    z = pc.multiply(pc.bit_wise_xor(z, pc.shift_right(z, _SHIFT_27)), _MIX_2_U64)
    return pc.bit_wise_xor(z, pc.shift_right(z, _SHIFT_31))


def _u64(value: int) -> pa.Scalar:
    return pa.scalar(value & _MASK, _U64)


_GOLDEN_U64 = _u64(_GOLDEN)
_MIX_1_U64 = _u64(_MIX_1)
_MIX_2_U64 = _u64(_MIX_2)
_SHIFT_30, _SHIFT_27, _SHIFT_31, _SHIFT_11, _SHIFT_10 = map(_u64, (30, 27, 31, 11, 10))
_ONE_U64, _LOW_10_BITS = _u64(1), _u64(1023)
_ONE_I64 = pa.scalar(1, pa.int64())


def _arange(start: int, stop: int) -> pa.Array:
    """``start, start + 1, …, stop - 1`` as int64, without a Python object per element."""
    return pc.add(pc.cumulative_sum(pa.repeat(_ONE_I64, stop - start)), start - 1)


@dataclass(frozen=True, slots=True)
class _Settings:
    """The validated configuration of one generator; :meth:`rows_between` is pure."""

    rows: int
    partitions: int
    batch_size: int
    rate: float
    schema: pa.Schema
    seed: int

    @classmethod
    def from_config(cls, config: ConnectorConfig) -> _Settings:
        config = config.validate(GeneratorSource.CONFIG_KEYS)
        settings = cls(
            rows=_filled_in(config, "rows", int),
            partitions=_filled_in(config, "partitions", int),
            batch_size=_filled_in(config, "batch_size", int),
            rate=_filled_in(config, "rate", float),
            schema=configured_schema(config),
            seed=_filled_in(config, "seed", int),
        )
        settings.check()
        return settings

    def check(self) -> None:
        problems = {
            "rows": (self.rows < UNBOUNDED, f"-1 (unbounded) or a count >= 0, got {self.rows}"),
            "partitions": (
                not 1 <= self.partitions <= _MAX_PARTITIONS,
                f"between 1 and {_MAX_PARTITIONS}, got {self.partitions}",
            ),
            "batch_size": (self.batch_size < 1, f">= 1, got {self.batch_size}"),
            "rate": (
                not (math.isfinite(self.rate) and self.rate >= 0),
                f"a finite number >= 0 (0 = as fast as possible), got {self.rate}",
            ),
        }
        for key, (broken, expectation) in problems.items():
            if broken:
                raise ConfigurationError(
                    f"{_NAME}: config key {key!r} must be {expectation}", key=key
                )

    @property
    def bounded(self) -> bool:
        return self.rows != UNBOUNDED

    def metadata(self) -> dict[str, str]:
        """What a checkpoint records so that it is never restored into another id space."""
        return {"partitions": str(self.partitions), "seed": str(self.seed)}

    def due(self, started_at_ms: int) -> int | None:
        """The offset after the last row of a partition whose time has come.

        Without a ``rate`` every row's time has come: the partition's end when ``rows`` is
        bounded, ``None`` (no end) when it is not. With a rate, row ``i`` is due ``i / rate``
        seconds after the stream started.
        """
        if self.rate <= 0:
            return self.rows if self.bounded else None
        earned = int(self.rate * max(0.0, time.time() - started_at_ms / 1000))
        return min(earned, self.rows) if self.bounded else earned

    def offsets_of(self, checkpoint: SourceCheckpoint) -> list[int]:
        """The next offset of every partition in ``checkpoint`` (``0`` where it has none).

        :raises ConfigurationError: when the checkpoint was taken with other ``partitions`` or
            ``seed`` (its ids or values would differ from what was delivered).
        :raises CheckpointError: for a partition or offset this generator cannot have written.
        """
        for key, value in self.metadata().items():
            recorded = checkpoint.metadata.get(key)
            if recorded is not None and recorded != value:
                raise ConfigurationError(
                    f"{_NAME}: the checkpoint was taken with {key}={recorded} but the source "
                    f"is configured with {key}={value}; restore with the same {key!r} or start "
                    "from a new checkpoint location",
                    key=key,
                )
        offsets = [0] * self.partitions
        for partition, offset in offsets_in(_NAME, checkpoint).items():
            if partition >= self.partitions:
                raise CheckpointError(
                    f"{_NAME}: checkpoint names partition {partition}, but the source has "
                    f"{self.partitions} partition(s)"
                )
            if self.bounded and offset > self.rows:
                raise CheckpointError(
                    f"{_NAME}: checkpoint offset {offset} of partition {partition} is past the "
                    f"{self.rows} rows the partition holds"
                )
            offsets[partition] = offset
        return offsets

    def rows_between(self, partition: int, start: int, end: int) -> pa.RecordBatch:
        """Rows ``start`` (included) to ``end`` (excluded) of ``partition``.

        Row ``i``'s hash is ``splitmix64(i * G + partition_key)``, and SplitMix64 adds ``G``
        before mixing: so one multiply-add by constants, then the three mixing steps.
        """
        offsets = _arange(start, end)
        count = end - start
        hashes = _mix_array(
            pc.add(pc.multiply(offsets.cast(_U64), _GOLDEN_U64), self._hash_base(partition))
        )
        columns = [
            pc.add(pc.multiply(offsets, self.partitions), partition),
            pa.repeat(pa.scalar(partition, pa.int32()), count),
            pc.multiply(pc.shift_right(hashes, _SHIFT_11).cast(pa.float64()), 2.0**-53),
        ]
        if self.schema.equals(WIDE_SCHEMA):
            columns += [
                pc.add(pc.multiply(offsets, 1000), _EVENT_TIME_ORIGIN_US).cast(
                    pa.timestamp("us", tz="UTC")
                ),
                pc.bit_wise_and(hashes, _LOW_10_BITS).cast(pa.string()),
                pc.equal(pc.bit_wise_and(pc.shift_right(hashes, _SHIFT_10), _ONE_U64), _ONE_U64),
            ]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def _hash_base(self, partition: int) -> pa.Scalar:
        """``partition_key + G``: the partition's key is ``splitmix64(splitmix64(seed) ^ p)``."""
        seed_hash = _mix((self.seed + _GOLDEN) & _MASK)
        partition_key = _mix(((seed_hash ^ partition) + _GOLDEN) & _MASK)
        return _u64(partition_key + _GOLDEN)


def _filled_in(config: ConnectorConfig, key: str, parse: Callable[[str], T]) -> T:
    """The value of a key that :meth:`ConnectorConfig.validate` filled in with its default."""
    value = config.get_parsed(key, parse)
    assert value is not None, f"{key} has a default"
    return value


class GeneratorSource(SourceConnector, RangeReadableSource):
    """Deterministic rows, in partitions, that can be replayed from any checkpoint.

    Row ``i`` of partition ``p`` (its *offset* is ``i``) is a pure function of ``seed``, ``p``
    and ``i``, so any process produces the same rows for the same position:

    - ``id = i * partitions + p`` — unique across partitions, so loss and duplicates can be
      counted id by id; partition ``p`` holds the ids ``≡ p (mod partitions)``, ascending;
    - ``partition = p``;
    - ``value = (h >> 11) / 2**53``, a double in ``[0, 1)``, where
      ``h = splitmix64(k + i * G)``, ``k = splitmix64(splitmix64(seed) ^ p)``,
      ``G = 0x9E3779B97F4A7C15`` and ``splitmix64(x)`` is SplitMix64's output for state
      ``x``: ``z = x + G; z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9;
      z = (z ^ z >> 27) * 0x94D049BB133111EB; z ^ z >> 31``, all modulo ``2**64``;
    - with ``schema=wide`` also ``event_time`` = 2024-01-01T00:00:00Z plus ``i`` milliseconds,
      ``key = str(h & 1023)`` and ``flag = bool((h >> 10) & 1)``.

    Each partition ends after ``rows`` rows (``-1``, the default, never ends).
    :meth:`poll_batch` visits the partitions in turn and returns at most ``batch_size`` rows
    of one partition. With ``rate > 0`` the rows are paced: row ``i`` of each partition is
    due ``i / rate`` seconds after the stream started — when a source that was never restored
    was opened; the time travels in its checkpoints (metadata ``started_at_ms``), so every
    process, and a restarted one, agrees on which rows are due (a restart after a pause finds
    the rows due meanwhile). Its :class:`~laminar_sdk.PartitionInfo` is
    ``(str(p), str(next offset))``.

    :meth:`checkpoint` holds each partition's next offset: restoring it resumes *after* the
    last row returned, never at it. The source is range-readable
    (:meth:`as_range_readable`): :meth:`plan_end` shares a micro-batch among the partitions
    with rows due, and :meth:`read_range` produces the rows of one partition between two
    offsets in any process, without polling.
    """

    CONFIG_KEYS: ClassVar[tuple[ConfigKeySpec, ...]] = (
        ConfigKeySpec(
            "rows",
            default=str(UNBOUNDED),
            value_type=int,
            description="rows in each partition; -1 = unbounded",
        ),
        ConfigKeySpec(
            "partitions",
            default="1",
            value_type=int,
            description="number of partitions; id = offset * partitions + partition",
        ),
        ConfigKeySpec(
            "batch_size", default="8192", value_type=int, description="most rows one poll returns"
        ),
        ConfigKeySpec(
            "rate",
            default="0",
            value_type=float,
            description="rows per second per partition; 0 = as fast as possible",
        ),
        SCHEMA_KEY,
        ConfigKeySpec(
            "seed",
            default="0",
            value_type=int,
            description="seed of the generated values: the same seed gives the same rows",
        ),
    )
    DESCRIPTION: ClassVar[str] = (
        "Deterministic, replayable rows with ids unique across partitions, for tests and benchmarks"
    )

    def __init__(self) -> None:
        self._lifecycle: Lifecycle[_Settings] = Lifecycle(f"{_NAME} source")
        self._next: list[int] = []
        self._cursor = 0
        self._started_at_ms = 0
        self._records_total = 0
        self._bytes_total = 0

    async def open(self, config: ConnectorConfig) -> None:
        """Validate ``config`` (defaults applied) and start every partition at offset 0.

        :raises ConfigurationError: naming the key that is unknown, mistyped or out of range.
        """
        settings = _Settings.from_config(config)
        self._lifecycle.open(settings)
        self._next = [0] * settings.partitions
        self._started_at_ms = time.time_ns() // 1_000_000

    def schema(self) -> pa.Schema:
        """The configured schema (``ids`` or ``wide``)."""
        return self._lifecycle.require("schema").schema

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        """Return up to ``min(max_records, batch_size)`` rows of the next partition that has any.

        Returns ``None`` when every partition is exhausted (bounded ``rows``) or, with a
        ``rate``, when no partition has a row that is due.

        :raises ValueError: when ``max_records < 1``.
        """
        settings = self._lifecycle.require("poll_batch")
        if max_records < 1:
            raise ValueError(f"{_NAME}: max_records must be >= 1, got {max_records}")
        limit = min(max_records, settings.batch_size)
        for step in range(settings.partitions):
            partition = (self._cursor + step) % settings.partitions
            count = self._available(settings, partition, limit)
            if count <= 0:
                continue
            start = self._next[partition]
            batch = settings.rows_between(partition, start, start + count)
            self._next[partition] = start + count
            self._cursor = (partition + 1) % settings.partitions
            self._records_total += count
            self._bytes_total += batch.nbytes
            return SourceBatch(batch, PartitionInfo(str(partition), str(start + count)))
        return None

    def _available(self, settings: _Settings, partition: int, limit: int) -> int:
        """How many rows, at most ``limit``, ``partition`` may return now."""
        due = settings.due(self._started_at_ms)
        return limit if due is None else min(limit, due - self._next[partition])

    def checkpoint(self) -> SourceCheckpoint:
        """Every partition's next offset: restoring resumes *after* the last row returned.

        The metadata records ``partitions`` and ``seed`` (a checkpoint is never restored into
        another id space), the partition the next poll tries first and, with a ``rate``, when
        the stream started.
        """
        settings = self._lifecycle.require("checkpoint")
        offsets = {str(partition): str(offset) for partition, offset in enumerate(self._next)}
        metadata = {**settings.metadata(), NEXT_PARTITION: str(self._cursor)}
        if settings.rate > 0:
            metadata[STARTED_AT] = str(self._started_at_ms)
        return SourceCheckpoint(offsets, metadata=metadata)

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        """Seek every partition to its offset in ``checkpoint``; partitions it omits to 0.

        A paced generator takes the time its stream started from the checkpoint, when it
        records one.

        :raises ConfigurationError: when it was taken with other ``partitions`` or ``seed``.
        :raises CheckpointError: for a partition or offset this generator cannot have reached.
        """
        settings = self._lifecycle.require("restore")
        self._next = settings.offsets_of(checkpoint)
        self._cursor = next_partition_in(_NAME, checkpoint) % settings.partitions
        self._started_at_ms = self._started_at(checkpoint)

    def _started_at(self, checkpoint: SourceCheckpoint) -> int:
        recorded = checkpoint.metadata.get(STARTED_AT)
        if recorded is None:
            return self._started_at_ms
        return parse_count(_NAME, recorded, STARTED_AT)

    def as_range_readable(self) -> RangeReadableSource:
        """This source: it plans micro-batches and reads partition ranges in any process."""
        return self

    async def plan_end(self, start: SourceCheckpoint, max_records: int | None) -> SourceCheckpoint:
        """The checkpoint after at most ``max_records`` rows that are due, following ``start``.

        The rows are shared fairly among the partitions that have rows due. An unbounded
        generator without a ``rate`` always has rows: with ``max_records=None`` it offers
        ``batch_size`` rows per partition (a micro-batch needs a bound). Returns ``start``
        when no row is due.

        :raises ConfigurationError: when ``start`` was taken with other ``partitions`` or
            ``seed``.
        :raises CheckpointError: for a partition or offset this generator cannot have reached.
        """
        settings = self._lifecycle.require("plan_end")
        firsts = settings.offsets_of(start)
        started_at_ms = self._started_at(start)
        due = settings.due(started_at_ms)
        unbounded_share = settings.batch_size if max_records is None else max_records
        available = {
            p: first + unbounded_share if due is None else due for p, first in enumerate(firsts)
        }
        ends = planned_ends(dict(enumerate(firsts)), available, max_records)
        if not ends:
            return start
        offsets = {str(p): str(ends.get(p, first)) for p, first in enumerate(firsts)}
        metadata = {**start.metadata, **settings.metadata()}
        if settings.rate > 0:
            metadata[STARTED_AT] = str(started_at_ms)
        return SourceCheckpoint(offsets, metadata=metadata)

    async def read_range(self, partition_range: PartitionRange) -> AsyncIterator[pa.RecordBatch]:
        """The rows of one partition between two offsets, in batches of ``batch_size`` rows.

        Exactly the rows :meth:`poll_batch` returns for those offsets, in any process, at any
        time (pacing decides only which rows :meth:`plan_end` names); it does not move the
        source or count in :meth:`metrics`.

        :raises CheckpointError: for a partition or range outside the generator's rows.
        """
        settings = self._lifecycle.require("read_range")
        partition, first, stop = range_bounds(_NAME, partition_range)
        if partition >= settings.partitions:
            raise CheckpointError(
                f"{_NAME}: partition {partition} is not in [0, {settings.partitions})"
            )
        if settings.bounded and stop > settings.rows:
            raise CheckpointError(
                f"{_NAME}: offset {stop} of partition {partition} is past the {settings.rows} "
                "rows the partition holds"
            )
        for offset in range(first, stop, settings.batch_size):
            yield settings.rows_between(partition, offset, min(stop, offset + settings.batch_size))

    def metrics(self) -> ConnectorMetrics:
        """Rows and Arrow bytes returned by :meth:`poll_batch`, and the lag.

        ``lag`` is the rows not yet returned, across partitions, when ``rows`` is bounded;
        0 when it is not.
        """
        lag = 0
        settings = self._lifecycle.state
        if settings is not None and settings.bounded:
            lag = sum(settings.rows - offset for offset in self._next)
        return ConnectorMetrics(
            records_total=self._records_total, bytes_total=self._bytes_total, lag=lag
        )

    async def close(self) -> None:
        """Stop; any later call but :meth:`metrics` raises :class:`~laminar_sdk.Closed`."""
        self._lifecycle.close()
