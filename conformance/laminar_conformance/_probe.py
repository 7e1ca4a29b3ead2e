"""What a source really does, found out before the checks run: partitions and live appends.

The kit does not take a test context's word for how many partitions it can fill or whether
records appended to a running source reach it: it appends one record to each partition it
can address, reads them back, and watches the partitions of the batches and of the source's
own checkpoint; then it appends again to the opened source and sees whether the records
arrive. A context's ``partitions`` spares the partition probe (the checkpoint is still
watched); ``live_appends = True`` spares the live probe. Only ``skip_checks`` turns a check
off, with its reason.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

from laminar_conformance._delivery import CALL_TIMEOUT_S, Delivery, answered, drain
from laminar_conformance._skips import STATED, skip, stated_reasons
from laminar_conformance._suite import Target
from laminar_conformance.contexts import SourceTestContext
from laminar_sdk import ConnectorRole, SourceConnector

PROBED_PARTITIONS = 4
"""How many partitions the probe tries to append to when the context declares none."""

LIVE_WAIT_S = 1.0
"""How long the live probe waits, at least, for records appended to an opened source."""


@dataclass(frozen=True, slots=True)
class SourceTraits:
    """What the probe found, and how the checks use it.

    :param partitions: how many partitions the kit spreads records over.
    :param equal_partitions: the context needs the same number of records in every partition.
    :param live_appends: records appended to a running source reach it.
    :param found: one line per trait saying how it was established, for the report.
    :param not_multi_partition: why the multi-partition checks cannot run (with its category
        prefix stripped), when they cannot.
    :param not_live: why the live-append checks cannot run, when they cannot.
    :param problems: what the probe found wrong; a check fails on them.
    """

    partitions: int
    equal_partitions: bool
    live_appends: bool
    found: tuple[str, ...]
    not_multi_partition: str | None
    not_live: str | None
    problems: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        """The probed traits in one line, for the report."""
        return "; ".join(self.found)


async def _read(
    source: SourceConnector,
    context: SourceTestContext,
    reading: Delivery,
    expected: int,
    wait_s: float,
) -> None:
    async def poll() -> bool:
        batch = await answered(source.poll_batch(16), "poll_batch(16)", CALL_TIMEOUT_S + wait_s)
        if batch is None:
            return False
        reading.receive(context.ids(batch.records), batch.partition)
        return True

    await drain(poll, reading, expected, wait_s)


def _addressable(appended: dict[int, list[int]], reading: Delivery) -> int:
    """How many leading kit partitions map each onto one distinct source partition."""
    seen: set[str] = set()
    where = dict(zip(reading.ids, reading.partitions, strict=True))
    for index in sorted(appended):
        found = {where.get(record) for record in appended[index]}
        if len(found) != 1 or None in found:
            return index
        (partition,) = found
        assert partition is not None
        if partition in seen:
            return index
        seen.add(partition)
    return len(appended)


def turned_off(target: Target, category: str) -> str | None:
    """Why ``target``'s test context turns ``category`` off, or ``None``; read once per suite.

    :raises AssertionError: when the context's ``skip_checks`` is malformed.
    """
    stated = target.probed.get("stated")
    if not isinstance(stated, dict):
        source = target.role is ConnectorRole.SOURCE
        context = target.source_context() if source else target.sink_context()
        try:
            stated = stated_reasons(context)
        finally:
            context.close()
        target.probed["stated"] = stated
    reason = stated.get(category)
    return reason if isinstance(reason, str) else None


def skip_if_turned_off(target: Target, category: str) -> None:
    """Skip the running check when ``target``'s test context turns ``category`` off."""
    reason = turned_off(target, category)
    if reason is not None:
        skip(category, STATED + reason)


def source_traits(target: Target) -> SourceTraits:
    """What ``target``'s source does, probed once per suite (see the module)."""
    traits = target.probed.get("source")
    if not isinstance(traits, SourceTraits):
        context = target.source_context()
        try:
            traits = asyncio.run(_SourceProbe(target, context).run())
        finally:
            context.close()
        target.probed["source"] = traits
    return traits


class _SourceProbe:
    def __init__(self, target: Target, context: SourceTestContext) -> None:
        self._target = target
        self._context = context
        self._ids = itertools.count()
        self._declared = getattr(context, "partitions", None)
        self._equal = bool(getattr(context, "equal_partitions", False))
        self._wait_s = float(getattr(context, "poll_timeout_s", 0.0))
        self._found: list[str] = []
        self._problems: list[str] = []
        try:
            stated = stated_reasons(context)
        except AssertionError as error:
            self._problems.append(str(error))
            stated = {}
        self._off_multi = stated.get("multi-partition")
        self._off_live = stated.get("live-appends")

    def _traits(self, partitions: int, live: bool, not_live: str | None) -> SourceTraits:
        not_multi = None
        if self._off_multi is not None:
            not_multi = STATED + self._off_multi
        elif partitions < 2:
            not_multi = (
                "the kit can fill only one partition of this source through its test context "
                f"({self._found[0]})"
            )
        return SourceTraits(
            partitions=partitions,
            equal_partitions=self._equal,
            live_appends=live,
            found=tuple(self._found),
            not_multi_partition=not_multi,
            not_live=not_live,
            problems=tuple(self._problems),
        )

    def _append_first(self) -> tuple[dict[int, list[int]], str]:
        """One record into each partition the context addresses; why the probe stopped."""
        appended: dict[int, list[int]] = {}
        if self._declared is not None:
            count = int(self._declared)
            for partition in range(count):
                appended[partition] = [next(self._ids)]
                self._context.append(appended[partition], partition if count > 1 else None)
            return appended, ""
        for partition in range(PROBED_PARTITIONS):
            ids = [next(self._ids)]
            try:
                self._context.append(ids, partition if partition else None)
            except Exception as error:  # any refusal ends the probe the same way
                if not partition:
                    raise
                return appended, f"; append(ids, partition={partition}) raised {error!r}"
            appended[partition] = ids
        return appended, ""

    async def run(self) -> SourceTraits:
        declared_live = getattr(self._context, "live_appends", False) is True
        try:
            appended, refused = self._append_first()
            properties = self._context.config().properties
            source, _ = await self._target.plugins.registry.open_source(
                self._target.connector, properties, state_store=self._target.new_state_store()
            )
        except Exception as error:  # noqa: BLE001 - reported as the probe's problem
            self._problems.append(f"the probe could not open the source: {error!r}")
            self._found.append("partitions and live appends not probed (the probe failed)")
            return self._traits(int(self._declared or 1), declared_live, "the probe failed")
        try:
            partitions = await self._partitions(source, appended, refused)
            live, not_live = await self._live(source, partitions, declared_live)
        except Exception as error:  # noqa: BLE001 - reported as the probe's problem
            self._problems.append(f"reading the probe's records failed: {error!r}")
            return self._traits(int(self._declared or 1), declared_live, "the probe failed")
        finally:
            await source.close()
        return self._traits(partitions, live, not_live)

    async def _partitions(
        self, source: SourceConnector, appended: dict[int, list[int]], refused: str
    ) -> int:
        reading = Delivery()
        total = sum(len(ids) for ids in appended.values())
        await _read(source, self._context, reading, total, self._wait_s)
        keys = sorted(source.checkpoint().offsets)
        if sorted(reading.ids) != sorted(itertools.chain(*appended.values())):
            self._problems.append(
                f"the probe appended ids {sorted(itertools.chain(*appended.values()))} (one "
                f"per partition) and read back {sorted(reading.ids)}"
            )
        if self._declared is not None:
            partitions = int(self._declared)
            self._found.append(f"{partitions} partition(s), declared by the test context")
        elif None in reading.partitions or not reading.ids:
            partitions = min(len(appended), len(keys)) if len(keys) > 1 else 1
            self._found.append(
                f"{partitions} partition(s), probed: the batches carry no PartitionInfo, so "
                f"counted from the checkpoint's {len(keys)} partition(s){refused}"
            )
        else:
            partitions = max(1, _addressable(appended, reading))
            self._found.append(
                f"{partitions} partition(s), probed: records appended to partitions 0 to "
                f"{len(appended) - 1} came back from {len(set(reading.partitions))} distinct "
                f"partition(s){refused}"
            )
        if len(keys) > partitions and self._off_multi is None:
            how = (
                f"its context declares partitions = {partitions}"
                if self._declared is not None
                else f"the kit can fill only {partitions} of them through its test context"
            )
            self._problems.append(
                f"the source's checkpoint holds {len(keys)} partitions ({', '.join(keys[:8])}), "
                f"but {how}, so its other partitions would go unchecked: make the context's "
                f"append(ids, partition) put records into partition `partition` (0 to "
                f"{len(keys) - 1}) and declare `partitions = {len(keys)}`, or turn the "
                "multi-partition checks off with skip_checks = {'multi-partition': 'why'}"
            )
        return partitions

    async def _live(
        self, source: SourceConnector, partitions: int, declared: bool
    ) -> tuple[bool, str | None]:
        if self._off_live is not None:
            self._found.append("live appends: turned off by the test context")
            return False, STATED + self._off_live
        if declared:
            self._found.append("live appends: declared by the test context")
            return True, None
        reading = Delivery()
        for partition in range(partitions):
            self._context.append([next(self._ids)], partition if partitions > 1 else None)
        wait_s = max(self._wait_s, LIVE_WAIT_S)
        await _read(source, self._context, reading, partitions, wait_s)
        if reading.ids:
            self._found.append("live appends: probed, records appended to an opened source arrive")
            return True, None
        self._found.append("live appends: probed, none reached the opened source")
        return False, (
            f"probed: {partitions} record(s) appended after the source was opened did not "
            f"reach it within {wait_s:.1f} s (its data is fixed when it is configured); a "
            "source that returns them later sets `poll_timeout_s` on its test context"
        )
