"""One source system for a source check: the context filling it, and the instances reading it."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import TypeVar

import pyarrow as pa
from hypothesis import strategies as st

from laminar_conformance._call_times import CALL_TIMES
from laminar_conformance._delivery import CALL_TIMEOUT_S, Delivery, answered, drain
from laminar_conformance._probe import SourceTraits, source_traits
from laminar_conformance._suite import Target
from laminar_conformance.contexts import SourceTestContext
from laminar_sdk import SourceBatch, SourceCheckpoint, SourceConnector

T = TypeVar("T")

MAX_RECORDS_PER_PARTITION = 12
"""The most records one append of a case puts into one partition."""


class SourceSystem:
    """One source system, filled by the kit, and the source instances reading it.

    :param target: the source under test; a new context is made for this system. How many
        partitions it fills and whether it appends while sources run come from the probe.
    """

    def __init__(self, target: Target) -> None:
        self.target = target
        self.traits: SourceTraits = source_traits(target)
        self.context: SourceTestContext = target.source_context()
        self.partitions = self.traits.partitions
        self.equal_partitions = self.traits.equal_partitions
        self.live_appends = self.traits.live_appends
        self.idle_timeout_s = float(getattr(self.context, "poll_timeout_s", 0.0))
        self.appended: Counter[int] = Counter()
        self.state_directory = target.new_state_directory()
        """Where :attr:`state` is kept (a child process the kit kills opens it there too)."""
        self.state = target.new_state_store(self.state_directory)
        self.through: str | None = None
        """An address the instances connect to instead (the context's ``config_through``)."""
        self._next_id = itertools.count()

    def append(self, counts: list[int]) -> None:
        """Append ``counts[p]`` new ids to each partition ``p`` (none to one whose count is 0)."""
        for partition, count in enumerate(counts):
            if not count:
                continue  # a partition written for the first time later must not exist yet
            ids = [next(self._next_id) for _ in range(count)]
            self.context.append(ids, partition if self.partitions > 1 else None)
            self.appended.update(ids)

    def counts(self) -> st.SearchStrategy[list[int]]:
        """Records per partition, as the context allows."""
        per_partition = st.integers(0, MAX_RECORDS_PER_PARTITION)
        if self.equal_partitions:
            return per_partition.map(lambda count: [count] * self.partitions)
        return st.lists(per_partition, min_size=self.partitions, max_size=self.partitions)

    async def open(self, checkpoint: SourceCheckpoint | None = None) -> SourceConnector:
        """A new instance, opened, and restored from ``checkpoint`` (via its JSON) if given."""
        config = (
            self.context.config()
            if self.through is None
            else self.context.config_through(self.through)  # type: ignore[attr-defined]
        )
        with CALL_TIMES.timing("the source's open()"):
            source, _ = await self.target.plugins.registry.open_source(
                self.target.connector, config.properties, state_store=self.state
            )
        if checkpoint is not None:
            await source.restore(SourceCheckpoint.from_json(checkpoint.to_json()))
        return source

    def run(self, scenario: Coroutine[object, object, T]) -> T:
        """Run ``scenario``, then close the context."""
        try:
            return asyncio.run(scenario)
        finally:
            self.context.close()

    def ids(self, source: SourceConnector, batch: pa.RecordBatch, call: str) -> list[int]:
        """The ids of ``batch``, which ``call`` returned, after checking it is in the schema."""
        assert isinstance(batch, pa.RecordBatch), (
            f"{call} returned records as a {type(batch).__name__}, not a pyarrow.RecordBatch "
            "(the runtime passes record batches on; a Table gives them with to_batches())"
        )
        schema = source.schema()
        assert batch.schema.equals(schema), (
            f"{call} returned a batch with schema ({render(batch.schema)}), "
            f"but schema() is ({render(schema)})"
        )
        ids = self.context.ids(batch)
        assert len(ids) == batch.num_rows, "the context's ids() does not give one id per record"
        return ids

    async def poll(
        self,
        source: SourceConnector,
        max_records: int,
        delivery: Delivery,
        inspect: Callable[[pa.RecordBatch], None] | None = None,
    ) -> bool:
        """Poll once into ``delivery``, checking the batch; ``False`` when nothing came.

        :param inspect: called with each batch's records, for a check's own demands.
        :raises AssertionError: when ``poll_batch`` does not return within
            :data:`~laminar_conformance._delivery.CALL_TIMEOUT_S` (plus the context's
            ``poll_timeout_s``), or returns something else than the contract says.
        """
        with CALL_TIMES.timing("poll_batch"):
            batch = await answered(
                source.poll_batch(max_records),
                f"poll_batch({max_records})",
                CALL_TIMEOUT_S + self.idle_timeout_s,
            )
        if batch is None:
            return False
        assert isinstance(batch, SourceBatch), (
            f"poll_batch returned a {type(batch).__name__}, not a SourceBatch or None"
        )
        ids = self.ids(source, batch.records, "poll_batch")
        assert 0 <= batch.num_rows <= max_records, (
            f"poll_batch({max_records}) returned {batch.num_rows} records"
        )
        if inspect is not None:
            inspect(batch.records)
        delivery.receive(ids, batch.partition)
        return True

    async def drain(
        self,
        source: SourceConnector,
        delivery: Delivery,
        expected: int,
        max_records: int = 7,
        inspect: Callable[[pa.RecordBatch], None] | None = None,
    ) -> None:
        """Poll until the source has nothing more, expecting ``expected`` records in all."""
        await drain(
            lambda: self.poll(source, max_records, delivery, inspect),
            delivery,
            expected,
            self.idle_timeout_s,
        )


def render(schema: pa.Schema) -> str:
    """``schema`` as ``name: type, …``."""
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


def compare(got: list[int], expected: Counter[int], what: str) -> None:
    """Assert ``got`` holds every id of ``expected`` as often, naming lost and extra ids."""
    received = Counter(got)
    lost = sorted((expected - received).elements())
    repeated = sorted((received - expected).elements())
    problems = []
    if lost:
        problems.append(f"lost ids {lost[:12]}")
    if repeated:
        problems.append(f"repeated or unknown ids {repeated[:12]}")
    assert not problems, f"{what}: " + "; ".join(problems)
