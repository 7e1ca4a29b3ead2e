"""Range reads of a :class:`~laminar_sdk.RangeReadableSource` checked against polling.

Polling one instance from the start is the reference: it returns every record once, each
partition in order, and its checkpoints mark where it stood. A range read between two
checkpoints must return exactly the records polling returned between them — per partition, in
the same order — on any instance, as often as it is asked; ``plan_end`` must end where polling
ends and never name a record that was not appended when it was called.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pyarrow as pa

from laminar_conformance._delivery import Delivery, answered
from laminar_conformance._figures import Figures
from laminar_conformance._source_system import SourceSystem, compare
from laminar_sdk import PartitionRange, RangeReadableSource, SourceCheckpoint, SourceConnector

RangeStep = tuple[str, int]
"""One step of a range-read schedule: ``("poll", max_records)``, ``("checkpoint", 0)``,
``("append", records per partition)`` or ``("plan", max_records)`` (``0``: no bound)."""

Ids = dict[str, list[int]]
"""Ids by partition key, each partition's in order."""


def range_readable(source: SourceConnector, instance: str) -> RangeReadableSource:
    """``source.as_range_readable()``, which must not be ``None`` on ``instance``.

    Its calls fail when they do not return within
    :data:`~laminar_conformance._delivery.CALL_TIMEOUT_S`.
    """
    reader = source.as_range_readable()
    assert reader is not None, (
        f"as_range_readable() returned None on {instance}, though the source offers it: "
        "offer it on every opened instance"
    )
    return _Answering(reader)


class _Answering(RangeReadableSource):
    """A range reader whose calls must return in time (see :func:`answered`)."""

    def __init__(self, reader: RangeReadableSource) -> None:
        self._reader = reader

    async def plan_end(self, start: SourceCheckpoint, max_records: int | None) -> SourceCheckpoint:
        return await answered(
            self._reader.plan_end(start, max_records), f"plan_end({start!r}, {max_records})"
        )

    async def read_range(self, partition_range: PartitionRange) -> AsyncIterator[pa.RecordBatch]:
        batches = aiter(self._reader.read_range(partition_range))
        while True:
            try:
                yield await answered(anext(batches), f"read_range({partition_range})")
            except StopAsyncIteration:
                return


def moved_ranges(start: SourceCheckpoint, end: SourceCheckpoint) -> list[PartitionRange]:
    """The ranges of the partitions whose offset differs between ``start`` and ``end``."""
    return [
        PartitionRange(partition, start.offsets.get(partition), offset)
        for partition, offset in sorted(end.offsets.items())
        if start.offsets.get(partition) != offset
    ]


def _travelled(checkpoint: SourceCheckpoint) -> SourceCheckpoint:
    """``checkpoint`` as another process receives it: through its JSON."""
    return SourceCheckpoint.from_json(checkpoint.to_json())


def _flat(ids: Ids) -> list[int]:
    return [record for partition in sorted(ids) for record in ids[partition]]


async def _read_one(
    system: SourceSystem, source: SourceConnector, partition_range: PartitionRange
) -> list[int]:
    ids: list[int] = []
    async for batch in range_readable(source, "a reading instance").read_range(partition_range):
        ids += system.ids(source, batch, f"read_range({partition_range})")
    return ids


async def read_between(
    system: SourceSystem,
    start: SourceCheckpoint,
    end: SourceCheckpoint,
    reader: SourceConnector | None = None,
) -> Ids:
    """The records between ``start`` and ``end``, by partition.

    Each moved partition is read with ``read_range`` on ``reader``, one after the other, or,
    without a reader, on a new instance of its own (opened, never restored), all at once — as
    parallel tasks read them.
    """
    ranges = moved_ranges(start, end)
    if reader is not None:
        return {r.partition: await _read_one(system, reader, r) for r in ranges}
    instances = [await system.open() for _ in ranges]
    try:
        results = await asyncio.gather(
            *(_read_one(system, i, r) for i, r in zip(instances, ranges, strict=True))
        )
    finally:
        for instance in instances:
            await instance.close()
    return {r.partition: ids for r, ids in zip(ranges, results, strict=True)}


def expect_polled(got: Ids, delivery: Delivery, first: int, stop: int | None, what: str) -> None:
    """Assert ``got`` is what polling returned from record ``first`` to ``stop``.

    The same ids, once each; and, when the batches carried partition ids matching the
    checkpoints' keys, each partition's ids in the order polling returned them.
    """
    compare(_flat(got), Counter(delivery.ids[first:stop]), what)
    polled = delivery.by_partition(first, stop)
    if polled is None or not set(polled) <= set(got):
        return
    for partition, ids in sorted(got.items()):
        expected = polled.get(partition, [])
        assert ids == expected, (
            f"{what}: read_range of partition {partition!r} returned ids {ids[:12]}, but "
            f"polling returned {expected[:12]} in that order"
        )


@dataclass(frozen=True, slots=True)
class _Plan:
    """A ``plan_end`` made while the source ran, and what had been appended by then."""

    start: SourceCheckpoint
    first: int
    """How many records polling had returned when ``start`` was taken."""
    end: SourceCheckpoint
    max_records: int | None
    appended: Counter[int]


class RangeCase:
    """One schedule: poll, checkpoint, append and plan; then range reads checked against it.

    :param system: the source system, filled with the case's first records.
    :param figures: counters this case adds to.
    """

    def __init__(self, system: SourceSystem, figures: Figures) -> None:
        self._system = system
        self._figures = figures
        self._delivery = Delivery()
        self._taken: list[tuple[SourceCheckpoint, int]] = []
        self._plans: list[_Plan] = []

    async def run(self, steps: list[RangeStep], pairs: list[tuple[int, int]], chunk: int) -> None:
        """Run ``steps``, drain, then check reads between ``pairs`` of checkpoints and plans.

        :param pairs: indexes (taken modulo their number) of checkpoints to read between.
        :param chunk: the ``max_records`` of the chained plans.
        """
        system = self._system
        source = await system.open()
        reader = range_readable(source, "an opened source")
        self._taken.append((source.checkpoint(), 0))
        for action, amount in steps:
            if action == "poll":
                await system.poll(source, amount, self._delivery)
            elif action == "checkpoint":
                self._taken.append((source.checkpoint(), len(self._delivery.ids)))
            elif action == "append":
                system.append([amount] * system.partitions)
            else:
                await self._plan(source, reader, amount or None)
        await system.drain(source, self._delivery, system.appended.total())
        final = source.checkpoint()
        self._taken.append((final, len(self._delivery.ids)))
        await source.close()
        compare(
            self._delivery.ids,
            system.appended,
            f"polling one instance to the end (schedule {steps})",
        )
        fresh = await system.open()
        try:
            starts = sorted({0} | {min(a, b) % len(self._taken) for a, b in pairs})
            for index in starts:
                await self._plan_to_the_end(fresh, index, final)
            await self._nothing_new(fresh, final)
            await self._chain(fresh, starts[-1], chunk, final)
            for plan in self._plans:
                await self._check_plan(fresh, plan)
            for a, b in pairs:
                first, second = sorted((a % len(self._taken), b % len(self._taken)))
                await self._read_between_polled(fresh, first, second)
        finally:
            await fresh.close()

    async def _plan(
        self, source: SourceConnector, reader: RangeReadableSource, max_records: int | None
    ) -> None:
        start, first = self._taken[-1]
        before = source.checkpoint()
        end = await reader.plan_end(_travelled(start), max_records)
        after = source.checkpoint()
        assert after == before, (
            f"plan_end moved the instance it was called on: its checkpoint() was {before!r}, "
            f"and after plan_end({start!r}, {max_records}) it is {after!r}"
        )
        self._plans.append(_Plan(start, first, end, max_records, Counter(self._system.appended)))

    async def _plan_to_the_end(
        self, fresh: SourceConnector, index: int, final: SourceCheckpoint
    ) -> None:
        start, first = self._taken[index]
        end = await range_readable(fresh, "a new instance").plan_end(_travelled(start), None)
        assert dict(end.offsets) == dict(final.offsets), (
            f"plan_end({start!r}, None) returned offsets {dict(end.offsets)}, but polling from "
            f"there ends at {dict(final.offsets)} with every appended record returned: a "
            "planned end must name exactly the records available now"
        )
        got = await read_between(self._system, start, end, fresh)
        self._figures.epochs += 1
        expect_polled(
            got,
            self._delivery,
            first,
            None,
            f"reading the ranges from {start!r} to plan_end(start, None) = {end!r}",
        )

    async def _nothing_new(self, fresh: SourceConnector, final: SourceCheckpoint) -> None:
        again = await range_readable(fresh, "a new instance").plan_end(_travelled(final), None)
        assert dict(again.offsets) == dict(final.offsets), (
            f"nothing was appended after {final!r}, yet plan_end of it returned {again!r}: "
            "with nothing new, plan_end must return equal offsets"
        )

    async def _chain(
        self, fresh: SourceConnector, index: int, chunk: int, final: SourceCheckpoint
    ) -> None:
        """Plan micro-batches of at most ``chunk`` records from checkpoint ``index`` on."""
        start, first = self._taken[index]
        polled = self._delivery.by_partition(first)
        if polled is not None and not set(polled) <= set(final.offsets):
            polled = None  # the batches' partition ids are not the checkpoints' keys
        reached: Counter[str] = Counter()
        cursor, collected = start, Delivery()
        for _ in range(2 * (len(self._delivery.ids) - first) + 2):
            end = await range_readable(fresh, "a new instance").plan_end(_travelled(cursor), chunk)
            if dict(end.offsets) == dict(cursor.offsets):
                break
            got = await read_between(self._system, cursor, end, fresh)
            for partition, ids in sorted(got.items()):
                if polled is not None:
                    following = polled.get(partition, [])[reached[partition] :]
                    assert ids == following[: len(ids)], (
                        f"the range of partition {partition!r} from {cursor!r} to "
                        f"plan_end(start, max_records={chunk}) = {end!r} returned ids "
                        f"{ids[:12]}, but the records polling returned next there are "
                        f"{following[:12]}"
                    )
                reached[partition] += len(ids)
                collected.ids += ids
                collected.partitions += [partition] * len(ids)
            planned = sum(map(len, got.values()))
            assert planned <= chunk, (
                f"plan_end({cursor!r}, max_records={chunk}) returned {end!r}: {planned} "
                "records lie between them"
            )
            cursor = end
        assert dict(cursor.offsets) == dict(final.offsets), (
            f"planning micro-batches of at most {chunk} records from {start!r} stopped at "
            f"{cursor!r}, but polling ends at {final!r}: plan_end(start, max_records) must move "
            "on while records follow start, and never past them"
        )
        expect_polled(
            collected.by_partition() or {},
            self._delivery,
            first,
            None,
            f"reading micro-batches planned with max_records={chunk} from {start!r}",
        )

    async def _check_plan(self, fresh: SourceConnector, plan: _Plan) -> None:
        got = await read_between(self._system, plan.start, plan.end, fresh)
        ids = _flat(got)
        early = sorted(record for record in ids if not plan.appended[record])
        assert not early, (
            f"plan_end({plan.start!r}, {plan.max_records}) returned {plan.end!r} while ids "
            f"{early[:12]} were not appended yet: their ranges now return them, so a "
            "micro-batch planned then would change when read again"
        )
        after_start = Counter(self._delivery.ids[plan.first :])
        foreign = sorted((Counter(ids) - after_start).elements())
        assert not foreign, (
            f"the ranges from {plan.start!r} to plan_end = {plan.end!r} hold ids {foreign[:12]} "
            "that polling returned before the start, or more than once"
        )
        if plan.max_records is not None:
            assert len(ids) <= plan.max_records, (
                f"plan_end({plan.start!r}, max_records={plan.max_records}) returned "
                f"{plan.end!r}, {len(ids)} records on"
            )
        polled = self._delivery.by_partition(plan.first)
        if polled is None:
            return
        for partition, records in sorted(got.items()):
            following = polled.get(partition, [])
            assert records == following[: len(records)], (
                f"the range of partition {partition!r} from {plan.start!r} to plan_end = "
                f"{plan.end!r} returned ids {records[:12]}, not the first records polling "
                f"returned after the start: {following[:12]}"
            )

    async def _read_between_polled(self, fresh: SourceConnector, first: int, second: int) -> None:
        start, start_length = self._taken[first]
        end, end_length = self._taken[second]
        what = f"reading the ranges between polling checkpoints {start!r} and {end!r}"
        for attempt, reader in (
            ("", fresh),
            (" a second time", fresh),
            (" on new instances", None),
        ):
            got = await read_between(self._system, start, end, reader)
            self._figures.epochs += 1
            expect_polled(got, self._delivery, start_length, end_length, what + attempt)


async def plan_then_append(system: SourceSystem, figures: Figures) -> None:
    """Plan from a checkpoint mid-way, append more, then read the planned ranges.

    The ranges must hold exactly the records polling returned after the checkpoint before the
    new ones were appended — planning is not reading ahead — and a plan from their end must
    hold exactly the new ones.
    """
    source = await system.open()
    reader = range_readable(source, "an opened source")
    delivery = Delivery()
    for _ in range(system.partitions):
        await system.poll(source, 2, delivery)
    middle, first = source.checkpoint(), len(delivery.ids)
    end = await reader.plan_end(_travelled(middle), None)
    await system.drain(source, delivery, system.appended.total())
    final = source.checkpoint()
    assert dict(end.offsets) == dict(final.offsets), (
        f"plan_end({middle!r}, None) returned offsets {dict(end.offsets)}, but polling from "
        f"there ends at {dict(final.offsets)}, every appended record returned: it names records "
        "that are not there" + ("" if system.live_appends else " (or leaves some out)")
    )
    if system.live_appends:
        system.append([3] * system.partitions)
    got = await read_between(system, middle, end)
    figures.epochs += 1
    expect_polled(
        got,
        delivery,
        first,
        None,
        f"reading the ranges from {middle!r} to plan_end(start, None) = {end!r}, after more "
        "records were appended",
    )
    if not system.live_appends:
        await source.close()
        return
    more_first = len(delivery.ids)
    await system.drain(source, delivery, system.appended.total())
    latest = source.checkpoint()
    following = await reader.plan_end(_travelled(end), None)
    await source.close()
    compare(delivery.ids, system.appended, "polling on after more records were appended")
    assert dict(following.offsets) == dict(latest.offsets), (
        f"after more records were appended, plan_end({end!r}, None) returned {following!r}, "
        f"but polling ends at {latest!r}"
    )
    figures.epochs += 1
    expect_polled(
        await read_between(system, end, following),
        delivery,
        more_first,
        None,
        f"reading the ranges of the records appended after {end!r}",
    )


async def plan_on_an_instance_kept_open(system: SourceSystem, figures: Figures) -> None:
    """Plan twice on an instance that is never polled, records appended in between.

    That is how Spark plans a range-readable source: one instance, opened when the query
    starts and kept open, plans every micro-batch and never polls. Its second plan must end
    where polling a new instance ends, the new records included.
    """
    planner = await system.open()
    reader = range_readable(planner, "an instance kept open to plan")
    start = planner.checkpoint()
    first = await reader.plan_end(_travelled(start), None)
    system.append([3] * system.partitions)
    end = await reader.plan_end(_travelled(first), None)
    fresh = await system.open()
    delivery = Delivery()
    await system.drain(fresh, delivery, system.appended.total())
    final = fresh.checkpoint()
    await fresh.close()
    await planner.close()
    figures.epochs += 2
    assert dict(end.offsets) == dict(final.offsets), (
        f"an instance opened before records were appended, and never polled, planned up to "
        f"{dict(end.offsets)}; polling a new instance ends at {dict(final.offsets)}. Spark plans "
        "every micro-batch of a range-readable source on one instance it keeps open for the "
        "whole query and never polls: plan_end must look at the external system, not at what "
        "poll_batch last saw"
    )
