"""The source conformance suites: contract, and replay from checkpoints.

Adopt them in a plugin's tests with one class per source (fsspec's pattern)::

    from laminar_conformance.source import SourceSuite

    class TestMySource(SourceSuite):
        connector = "my-source"

The plugin must give the kit a :class:`~laminar_conformance.contexts.SourceTestContext`
through the ``laminar_conformance_context`` hook. Adopt :class:`SourceContractSuite` or
:class:`SourceReplaySuite` alone to run part of it; override one check by defining a method of
the same name. ``plugins = [my_plugin_module]`` uses a plugin that is not installed.

The replay checks run when the source's ``supports_replay()`` is true: a checkpoint restored
on a new instance must resume exactly *after* the last record returned before it — no record
lost, none repeated — with each partition restored independently.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from laminar_conformance._config_checks import ConfigurationSuite
from laminar_conformance._figures import Figures
from laminar_conformance._suite import ConnectorSuite, Target, check
from laminar_conformance.contexts import SourceTestContext
from laminar_sdk import (
    Closed,
    ConnectorRole,
    HealthState,
    HealthStatus,
    SourceCheckpoint,
    SourceConnector,
)

T = TypeVar("T")

MAX_RECORDS_PER_PARTITION = 12
"""The most records a replay case appends to one partition."""

# One step of a replay schedule: ("poll", max_records), ("checkpoint", 0) or ("crash", 0).
_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("poll"), st.integers(1, 5)),
        st.tuples(st.sampled_from(["checkpoint", "crash"]), st.just(0)),
    ),
    max_size=30,
)


@dataclass(slots=True)
class _Delivery:
    """What a downstream received, in order, with the partition each record came from."""

    ids: list[int] = field(default_factory=list)
    partitions: list[str | None] = field(default_factory=list)

    def truncate(self, length: int) -> None:
        del self.ids[length:]
        del self.partitions[length:]


class _Source:
    """One source system, filled by the kit, and the source instances reading it."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.context: SourceTestContext = target.source_context()
        self.partitions = int(getattr(self.context, "partitions", 1))
        self.equal_partitions = bool(getattr(self.context, "equal_partitions", False))
        self.idle_timeout_s = float(getattr(self.context, "poll_timeout_s", 0.0))
        self.appended: Counter[int] = Counter()
        self._next_id = itertools.count()

    def append(self, counts: list[int]) -> None:
        """Append ``counts[p]`` new ids to each partition ``p``."""
        for partition, count in enumerate(counts):
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
        source, _ = await self.target.plugins.registry.open_source(
            self.target.connector, self.context.config().properties
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

    async def poll(self, source: SourceConnector, max_records: int, delivery: _Delivery) -> bool:
        """Poll once into ``delivery``, checking the batch; ``False`` when nothing came."""
        batch = await source.poll_batch(max_records)
        if batch is None:
            return False
        schema = source.schema()
        assert batch.records.schema.equals(schema), (
            f"poll_batch returned a batch with schema ({_render(batch.records.schema)}), "
            f"but schema() is ({_render(schema)})"
        )
        assert 0 <= batch.num_rows <= max_records, (
            f"poll_batch({max_records}) returned {batch.num_rows} records"
        )
        ids = self.context.ids(batch.records)
        assert len(ids) == batch.num_rows, "the context's ids() does not give one id per record"
        delivery.ids += ids
        partition = None if batch.partition is None else batch.partition.id
        delivery.partitions += [partition] * len(ids)
        return True

    async def drain(
        self, source: SourceConnector, delivery: _Delivery, expected: int, max_records: int = 7
    ) -> None:
        """Poll until the source has nothing more, expecting ``expected`` records in all."""
        deadline = time.monotonic() + self.idle_timeout_s
        while True:
            if await self.poll(source, max_records, delivery):
                continue
            if len(delivery.ids) >= expected or time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.01)


def _render(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


def _require_replay(target: Target) -> None:
    if not target.plugins.registry.create_source(target.connector).supports_replay():
        pytest.skip(
            "supports_replay() is False: the source cannot go back, so replay is not checked"
        )


def _compare(got: list[int], expected: Counter[int], what: str) -> None:
    received = Counter(got)
    lost = sorted((expected - received).elements())
    repeated = sorted((received - expected).elements())
    problems = []
    if lost:
        problems.append(f"lost ids {lost[:12]}")
    if repeated:
        problems.append(f"repeated or unknown ids {repeated[:12]}")
    assert not problems, f"{what}: " + "; ".join(problems)


class SourceContractSuite(ConfigurationSuite):
    """The source's batches, lifecycle, checkpoints, configuration errors, health, metrics."""

    role: ClassVar[ConnectorRole] = ConnectorRole.SOURCE

    @check
    def test_every_record_is_returned_once_in_batches_of_the_schema(
        self, conformance: Target, figures: Figures
    ) -> None:
        """Batches match ``schema()`` and ``max_records``; every appended record comes once."""
        system = _Source(conformance)
        uneven = [5 + partition for partition in range(system.partitions)]
        system.append([6] * system.partitions if system.equal_partitions else uneven)

        async def scenario() -> None:
            source = await system.open()
            delivery = _Delivery()
            for max_records in itertools.cycle([1, 2, 3, 7]):
                if not await system.poll(source, max_records, delivery):
                    break
            await system.drain(source, delivery, system.appended.total())
            await source.close()
            _compare(delivery.ids, system.appended, "reading every record once")

        figures.cases += 1
        system.run(scenario())

    @check
    def test_a_source_with_nothing_appended_returns_nothing(
        self, conformance: Target, figures: Figures
    ) -> None:
        """An empty system gives ``None`` from ``poll_batch`` (or only empty batches)."""
        figures.cases += 1
        system = _Source(conformance)
        system.append([0] * system.partitions)

        async def scenario() -> None:
            source = await system.open()
            delivery = _Delivery()
            await system.drain(source, delivery, 0)
            await source.close()
            assert delivery.ids == [], f"an empty source returned ids {delivery.ids[:12]}"

        system.run(scenario())

    @check
    def test_calls_after_close_raise_closed(self, conformance: Target, figures: Figures) -> None:
        """After ``close()``, ``poll_batch`` and ``checkpoint`` raise :class:`Closed`."""
        figures.cases += 1
        system = _Source(conformance)
        system.append([2] * system.partitions)

        async def scenario() -> None:
            source = await system.open()
            await source.close()
            with pytest.raises(Closed):
                await source.poll_batch(1)
            with pytest.raises(Closed):
                source.checkpoint()

        system.run(scenario())

    @check
    def test_a_checkpoint_survives_its_json_round_trip(
        self, conformance: Target, figures: Figures
    ) -> None:
        """What ``checkpoint()`` returns is the same after ``to_json`` / ``from_json``."""
        figures.cases += 1
        system = _Source(conformance)
        system.append([3] * system.partitions)

        async def scenario() -> None:
            source = await system.open()
            for _ in range(3):
                checkpoint = source.checkpoint()
                assert isinstance(checkpoint, SourceCheckpoint)
                again = SourceCheckpoint.from_json(checkpoint.to_json())
                assert again == checkpoint, f"{checkpoint!r} became {again!r} through JSON"
                await source.poll_batch(2)
            await source.close()

        system.run(scenario())

    @check
    def test_health_and_metrics_are_sane(self, conformance: Target, figures: Figures) -> None:
        """``health_check`` gives a status, not unhealthy; counters never go down or below 0."""
        figures.cases += 1
        system = _Source(conformance)
        system.append([4] * system.partitions)

        async def scenario() -> None:
            source = await system.open()
            health = await source.health_check()
            assert isinstance(health, HealthStatus), f"health_check() returned {health!r}"
            assert health.state is not HealthState.UNHEALTHY, f"a working source reports {health}"
            previous = 0
            while await source.poll_batch(3) is not None:
                metrics = source.metrics()
                counters = (metrics.records_total, metrics.bytes_total, metrics.errors_total)
                assert min(*counters, metrics.lag) >= 0, f"negative metrics: {metrics}"
                assert metrics.records_total >= previous, "records_total went down"
                previous = metrics.records_total
            await source.close()

        system.run(scenario())


class SourceReplaySuite(ConnectorSuite):
    """Checkpoints restored on new instances resume exactly after the records returned."""

    role: ClassVar[ConnectorRole] = ConnectorRole.SOURCE

    @check
    def test_restoring_any_checkpoint_returns_exactly_the_records_after_it(
        self, conformance: Target, figures: Figures
    ) -> None:
        """Random polls, checkpoints and crashes; then every checkpoint restored on its own.

        A downstream keeps what it received up to the last checkpoint and forgets the rest at
        a crash: it must end with every record once. Then each checkpoint, restored on a new
        instance, must return exactly the records not received before it was taken.
        """
        _require_replay(conformance)
        probe = _Source(conformance)
        probe.context.close()

        @given(counts=probe.counts(), steps=_STEPS)
        def run(counts: list[int], steps: list[tuple[str, int]]) -> None:
            figures.cases += 1
            system = _Source(conformance)
            system.append(counts)
            system.run(self._replay_case(system, figures, counts, steps))

        conformance.seeded(conformance.settings(conformance.profile.replay_examples)(run))()

    async def _replay_case(
        self, system: _Source, figures: Figures, counts: list[int], steps: list[tuple[str, int]]
    ) -> None:
        total = system.appended.total()
        source = await system.open()
        delivery = _Delivery()
        durable: SourceCheckpoint | None = None
        durable_length = 0
        taken: list[tuple[SourceCheckpoint, Counter[int]]] = []
        for action, max_records in steps:
            if action == "poll":
                await system.poll(source, max_records, delivery)
            elif action == "checkpoint":
                durable, durable_length = source.checkpoint(), len(delivery.ids)
                taken.append((durable, Counter(delivery.ids)))
            else:
                source = await system.open(durable)  # the old instance dies without close()
                delivery.truncate(durable_length)
                figures.restarts += 1
        await system.drain(source, delivery, total)
        await source.close()
        _compare(
            delivery.ids,
            system.appended,
            f"polling {steps} with crashes restoring the last checkpoint (records {counts})",
        )
        for checkpoint, before in taken[-3:]:
            restored = await system.open(checkpoint)
            after = _Delivery()
            await system.drain(restored, after, total - before.total())
            await restored.close()
            figures.epochs += 1
            _compare(
                after.ids,
                system.appended - before,
                f"restoring {checkpoint!r}, taken after ids {sorted(before.elements())[:12]} "
                f"were returned (records {counts}, schedule {steps}), on a new instance",
            )

    @check
    def test_each_partition_restores_independently(
        self, conformance: Target, figures: Figures
    ) -> None:
        """A checkpoint holding one partition's offset resumes that one; the rest start over."""
        _require_replay(conformance)
        system = _Source(conformance)
        if system.partitions < 2:
            system.context.close()
            pytest.skip("the test context has one partition (set its `partitions` attribute)")
        system.append([6] * system.partitions)

        async def scenario() -> None:
            source = await system.open()
            delivery = _Delivery()
            for _ in range(2 * system.partitions):
                await system.poll(source, 2, delivery)
            checkpoint = source.checkpoint()
            await source.close()
            if None in delivery.partitions:
                pytest.skip("batches carry no PartitionInfo, so partitions cannot be told apart")
            for partition, offset in checkpoint.offsets.items():
                if partition not in delivery.partitions:
                    continue
                alone = SourceCheckpoint({partition: offset}, metadata=checkpoint.metadata)
                restored = await system.open(alone)
                after = _Delivery()
                returned = Counter(
                    record
                    for record, part in zip(delivery.ids, delivery.partitions, strict=True)
                    if part == partition
                )
                await system.drain(restored, after, system.appended.total() - returned.total())
                await restored.close()
                figures.cases += 1
                figures.epochs += 1
                _compare(
                    after.ids,
                    system.appended - returned,
                    f"restoring only partition {partition!r} at offset {offset!r} of "
                    f"{checkpoint!r} (the others from their start)",
                )

        system.run(scenario())
        if not figures.cases:
            pytest.skip("the checkpoint's offsets are not keyed by the batches' PartitionInfo.id")


class SourceSuite(SourceContractSuite, SourceReplaySuite):
    """Every source check: contract and replay."""
