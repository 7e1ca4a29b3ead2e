"""The source conformance suites: contract, replay from checkpoints, and range reads.

Adopt them in a plugin's tests with one class per source (fsspec's pattern)::

    from laminar_conformance.source import SourceSuite

    class TestMySource(SourceSuite):
        connector = "my-source"

The plugin must give the kit a :class:`~laminar_conformance.contexts.SourceTestContext`
through the ``laminar_conformance_context`` hook. Adopt :class:`SourceContractSuite`,
:class:`SourceReplaySuite`, :class:`SourceRangeReadSuite` or :class:`SourceRuntimeSuite` (what
the Spark bridge demands of a source, checked in process) alone to run part of it; override
one check by defining a method of the same name. ``plugins = [my_plugin_module]`` uses a plugin
that is not installed.

The replay checks run when the source's ``supports_replay()`` is true: a checkpoint restored
on a new instance must resume exactly *after* the last record returned before it — no record
lost, none repeated — with each partition restored independently, also while records are
appended (when the context's appends reach a running source). The range-read checks run when
the source offers ``as_range_readable()``: the ranges between two checkpoints hold exactly the
records polling returned between them, and ``plan_end`` ends where polling ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from collections.abc import Iterator
from typing import ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from laminar_conformance._config_checks import ConfigurationSuite
from laminar_conformance._delivery import CALL_TIMEOUT_S, Delivery, read_enough
from laminar_conformance._faults import (
    FaultPlan,
    FaultPoint,
    dropping_what_crashes_left,
    with_watched_threads,
)
from laminar_conformance._figures import Figures
from laminar_conformance._inside_crashes import coverage, crash_at_chosen_points
from laminar_conformance._kill import Child, kill_source_in_child
from laminar_conformance._network import (
    NETWORK_CALL_TIMEOUT_S,
    NETWORK_FAULTS,
    FaultWindow,
    NetworkFault,
    judged,
    proxied_config,
)
from laminar_conformance._probe import skip_if_turned_off, source_traits
from laminar_conformance._range_reads import (
    RangeCase,
    RangeStep,
    plan_on_an_instance_kept_open,
    plan_then_append,
)
from laminar_conformance._report import PROBED_PROPERTY
from laminar_conformance._runtime_checks import SourceRuntimeSuite
from laminar_conformance._secrets import assert_no_secret_shown, every_log_record
from laminar_conformance._skips import skip
from laminar_conformance._source_runs import Committed, SourceSchedule, run_source_epochs
from laminar_conformance._source_system import SourceSystem, compare
from laminar_conformance._suite import ConnectorSuite, Target, check
from laminar_conformance._timeline import Timeline
from laminar_sdk import (
    Closed,
    ConnectorRole,
    HealthState,
    HealthStatus,
    SourceCheckpoint,
)

__all__ = [
    "SourceContractSuite",
    "SourceNetworkSuite",
    "SourceRangeReadSuite",
    "SourceReplaySuite",
    "SourceRuntimeSuite",
    "SourceSuite",
]

# One step of a replay schedule: ("poll", max_records), ("checkpoint", 0), ("crash", 0), or
# ("append", records per partition) where the context's appends reach a running source.
_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("poll"), st.integers(1, 5)),
        st.tuples(st.sampled_from(["checkpoint", "crash"]), st.just(0)),
    ),
    max_size=30,
)
_LIVE_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("poll"), st.integers(1, 5)),
        st.tuples(st.sampled_from(["checkpoint", "crash"]), st.just(0)),
        st.tuples(st.just("append"), st.integers(1, 3)),
    ),
    max_size=30,
)


def _require_replay(target: Target) -> None:
    skip_if_turned_off(target, "replay")
    if not target.plugins.registry.create_source(target.connector).supports_replay():
        skip("replay", "supports_replay() is False: the source cannot go back")


class SourceContractSuite(ConfigurationSuite):
    """The source's batches, lifecycle, checkpoints, configuration errors, health, metrics."""

    role: ClassVar[ConnectorRole] = ConnectorRole.SOURCE

    @check
    def test_the_probe_reaches_every_partition_the_source_checkpoints(
        self, conformance: Target, figures: Figures, request: pytest.FixtureRequest
    ) -> None:
        """The kit can fill every partition the source's checkpoint holds; the probe's findings.

        Before the checks, the kit appends one record to each partition it can address and
        reads them back, then appends to the opened source (see
        :mod:`laminar_conformance._probe`). A checkpoint holding partitions the kit cannot
        fill would leave them unchecked, so it fails here, saying how to fix the context.
        """
        figures.cases += 1
        traits = source_traits(conformance)
        request.node.user_properties.append((PROBED_PROPERTY, traits.describe()))
        assert not traits.problems, "probing the source: " + "; ".join(traits.problems)

    @check
    def test_every_record_is_returned_once_in_batches_of_the_schema(
        self, conformance: Target, figures: Figures
    ) -> None:
        """Batches match ``schema()`` and ``max_records``; every appended record comes once."""
        system = SourceSystem(conformance)
        uneven = [5 + partition for partition in range(system.partitions)]
        system.append([6] * system.partitions if system.equal_partitions else uneven)

        async def scenario() -> None:
            source = await system.open()
            delivery = Delivery()
            total = system.appended.total()
            for max_records in itertools.cycle([1, 2, 3, 7]):
                if read_enough(len(delivery.ids), total):
                    break
                if not await system.poll(source, max_records, delivery):
                    break
            await system.drain(source, delivery, system.appended.total())
            await source.close()
            compare(delivery.ids, system.appended, "reading every record once")

        figures.cases += 1
        system.run(scenario())

    @check
    def test_a_source_with_nothing_appended_returns_nothing(
        self, conformance: Target, figures: Figures
    ) -> None:
        """An empty system gives ``None`` from ``poll_batch`` (or only empty batches)."""
        figures.cases += 1
        system = SourceSystem(conformance)
        system.append([0] * system.partitions)

        async def scenario() -> None:
            source = await system.open()
            delivery = Delivery()
            await system.drain(source, delivery, 0)
            await source.close()
            assert delivery.ids == [], f"an empty source returned ids {delivery.ids[:12]}"

        system.run(scenario())

    @check
    def test_calls_after_close_raise_closed(self, conformance: Target, figures: Figures) -> None:
        """After ``close()``, ``poll_batch`` and ``checkpoint`` raise :class:`Closed`."""
        figures.cases += 1
        system = SourceSystem(conformance)
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
        system = SourceSystem(conformance)
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
        """``health_check`` gives a status, not unhealthy; counters never go down or below 0.

        And no secret value of the configuration (a key declared secret, or named like one)
        shows in the source's health, metrics, ``repr`` or log records (DEBUG and up) meanwhile.
        """
        figures.cases += 1
        system = SourceSystem(conformance)
        system.append([4] * system.partitions)
        total = system.appended.total()

        async def scenario() -> dict[str, str]:
            source = await system.open()
            health = await source.health_check()
            assert isinstance(health, HealthStatus), f"health_check() returned {health!r}"
            assert health.state is not HealthState.UNHEALTHY, f"a working source reports {health}"
            shown = {"health_check()": f"{health!s} {health!r}", "repr()": repr(source)}
            previous, polls = 0, 0
            while await source.poll_batch(3) is not None and not read_enough(3 * polls, total):
                polls += 1
                metrics = source.metrics()
                counters = (metrics.records_total, metrics.bytes_total, metrics.errors_total)
                assert min(*counters, metrics.lag) >= 0, f"negative metrics: {metrics}"
                assert metrics.records_total >= previous, "records_total went down"
                previous = metrics.records_total
                shown[f"metrics() after poll {polls}"] = repr(metrics)
            await source.close()
            return shown

        with every_log_record() as records:
            shown = system.run(scenario())
        assert_no_secret_shown("source", conformance.secret_values(), shown | records.shown())


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
        probe = SourceSystem(conformance)
        probe.context.close()

        @given(counts=probe.counts(), steps=_STEPS)
        def run(counts: list[int], steps: list[tuple[str, int]]) -> None:
            figures.cases += 1
            system = SourceSystem(conformance)
            system.append(counts)
            system.run(self._replay_case(system, figures, counts, steps))

        conformance.explore(run, conformance.profile.replay_examples, figures)

    @check
    def test_records_appended_while_reading_are_returned_once_across_restores(
        self, conformance: Target, figures: Figures
    ) -> None:
        """As the replay check, with records appended between polls, checkpoints and crashes.

        Records appended after a checkpoint was taken, or while a restored instance runs,
        must be returned once: neither hidden by a cached end of the data nor read twice.
        """
        _require_replay(conformance)
        probe = SourceSystem(conformance)
        probe.context.close()
        if not probe.live_appends:
            skip("live-appends", f"{probe.traits.not_live}, so appends while it runs go unchecked")

        @given(counts=probe.counts(), steps=_LIVE_STEPS)
        def run(counts: list[int], steps: list[tuple[str, int]]) -> None:
            figures.cases += 1
            system = SourceSystem(conformance)
            system.append(counts)
            system.run(self._replay_case(system, figures, counts, steps))

        # Half the replay cases: the appends make each case longer.
        examples = max(1, conformance.profile.replay_examples // 2)
        conformance.explore(run, examples, figures)

    async def _replay_case(
        self,
        system: SourceSystem,
        figures: Figures,
        counts: list[int],
        steps: list[tuple[str, int]],
    ) -> None:
        source = await system.open()
        delivery = Delivery()
        durable: SourceCheckpoint | None = None
        durable_length = 0
        taken: list[tuple[SourceCheckpoint, Counter[int]]] = []
        for action, amount in steps:
            if action == "poll":
                await system.poll(source, amount, delivery)
            elif action == "checkpoint":
                durable, durable_length = source.checkpoint(), len(delivery.ids)
                taken.append((durable, Counter(delivery.ids)))
            elif action == "append":
                system.append([amount] * system.partitions)
            else:
                source = await system.open(durable)  # the old instance dies without close()
                delivery.truncate(durable_length)
                figures.restarts += 1
        total = system.appended.total()
        await system.drain(source, delivery, total)
        await source.close()
        compare(
            delivery.ids,
            system.appended,
            f"polling {steps} with crashes restoring the last checkpoint (records {counts})",
        )
        for checkpoint, before in taken[-3:]:
            await _restored_returns_the_rest(
                system,
                figures,
                checkpoint,
                before,
                f"restoring {checkpoint!r}, taken after ids {sorted(before.elements())[:12]} "
                f"were returned (records {counts}, schedule {steps}), on a new instance",
            )

    @check
    def test_delivery_survives_a_crash_at_each_point_inside_a_call(
        self, conformance: Target, figures: Figures
    ) -> None:
        """A crash before and after every place a clean run's source calls leave Python.

        Epochs are read as the Spark bridge reads micro-batches (a new instance a batch,
        restored from the last committed checkpoint); the kit traces ``restore``,
        ``poll_batch`` and ``checkpoint`` as it does a sink's calls (docs/conformance-kit.md,
        "Crash points") and crashes at each point found — in process, and for a seeded
        sample with a real SIGKILL of a child process. What an epoch read is lost with it
        when it crashes; the next instance restores the last committed checkpoint, and in
        the end every record must have been read once. A source with side effects in its
        calls — records archived, acknowledged or moved as they are read, in two steps —
        fails here when a crash between the steps leaves a record both read and still there,
        or gone without being read.
        """
        _require_replay(conformance)
        found = _read_through_crashes(conformance, figures, [], discovering=True)
        figures.crash_points = coverage(found, [])
        if not found.reached_inside:
            skip(
                "capability",
                "a clean run's source calls reached no crash point: none of them called out of "
                "Python, and none is marked with laminar_sdk.crash_point",
            )

        def check_run(points: list[FaultPoint], killed_at: FaultPoint | None) -> list[FaultPoint]:
            return _read_through_crashes(conformance, figures, points, killed_at=killed_at).fired

        profile, seed = conformance.profile, conformance.seed
        crash_at_chosen_points(found, profile, seed, figures, check_run)

    @check
    def test_a_partition_that_appears_while_reading_is_read_from_its_beginning(
        self, conformance: Target, figures: Figures
    ) -> None:
        """Records of a partition first written after the source opened arrive, once.

        A topic whose partitions are increased, a new directory under a files source, a table
        repartitioned: the kit fills all partitions but the last, opens the source, polls,
        takes a checkpoint, then writes the last partition for the first time. The open
        instance must return its records; an instance restored from the checkpoint taken
        before it appeared must read it from its beginning; and one restored from the end
        must return only what is written to it afterwards. A source that lists its
        partitions once, when it opens or restores, fails here.
        """
        _require_replay(conformance)
        system = _system_whose_partitions_change(conformance, "appear")
        held_back = system.partitions - 1
        system.append([4] * held_back + [0])

        async def scenario() -> None:
            source = await system.open()
            delivery = Delivery()
            await system.poll(source, 2, delivery)
            before = source.checkpoint()
            returned = Counter(delivery.ids)
            system.append([0] * held_back + [3])
            await system.drain(source, delivery, system.appended.total())
            compare(
                delivery.ids,
                system.appended,
                f"partition {held_back} was written for the first time after the source "
                "opened and polled: an open instance",
            )
            end = source.checkpoint()
            await source.close()
            for checkpoint, seen, when in (
                (before, returned, "before the partition appeared"),
                (end, Counter(delivery.ids), "after every record was returned"),
            ):
                if when.startswith("after"):
                    system.append([0] * held_back + [2])
                await _restored_returns_the_rest(
                    system,
                    figures,
                    checkpoint,
                    seen,
                    f"restoring {checkpoint!r}, taken {when} (partition {held_back} was "
                    "written for the first time after the source opened)",
                )

        figures.cases += 1
        system.run(scenario())

    @check
    def test_a_removed_partition_and_one_that_takes_its_place_stop_nothing(
        self, conformance: Target, figures: Figures
    ) -> None:
        """A partition that goes away, and a new one in its place, leave the rest flowing.

        A directory deleted under a files source, a table partition dropped, a shard split
        into new ones: where the context can remove a partition (its ``remove_partition``),
        the kit fills every partition but the last, reads them all, takes a checkpoint,
        removes partition 0, writes the last partition for the first time and appends to the
        others. The open instance must return the new records, once; so must an instance
        restored from the checkpoint, which names the removed partition, and one restored
        from a checkpoint taken after the removal. A source that fails on a partition it can
        no longer find, or that reads only the partitions it listed before, fails here.
        """
        _require_replay(conformance)
        skip_if_turned_off(conformance, "partition-removal")
        system = _system_whose_partitions_change(conformance, "go")
        remove = getattr(system.context, "remove_partition", None)
        if not callable(remove):
            system.context.close()
            skip(
                "partition-removal",
                "the test context has no remove_partition(partition): the kit cannot take a "
                "partition away",
            )
        replacement = system.partitions - 1
        system.append([3] * replacement + [0])
        change = (
            f"partition 0 was removed after its records were read, and partition {replacement} "
            "written for the first time"
        )

        async def scenario() -> None:
            source = await system.open()
            delivery = Delivery()
            await system.drain(source, delivery, system.appended.total())
            before = source.checkpoint()
            returned = Counter(delivery.ids)
            remove(0)
            system.append([0] + [2] * (replacement - 1) + [3])
            with _raised_while(f"{change}: polling the open instance"):
                await system.drain(source, delivery, system.appended.total())
            compare(delivery.ids, system.appended, f"{change}: the open instance")
            after = source.checkpoint()
            await source.close()
            system.append([0] * replacement + [2])
            for checkpoint, seen, when in (
                (before, returned, "before the removal"),
                (after, Counter(delivery.ids), "after it"),
            ):
                what = f"{change}: restoring {checkpoint!r}, taken {when}"
                with _raised_while(what):
                    await _restored_returns_the_rest(system, figures, checkpoint, seen, what)

        figures.cases += 1
        system.run(scenario())

    @check
    def test_each_partition_restores_independently(
        self, conformance: Target, figures: Figures
    ) -> None:
        """A checkpoint holding one partition's offset resumes that one; the rest start over."""
        _require_replay(conformance)
        system = SourceSystem(conformance)
        if system.partitions < 2:
            system.context.close()
            skip("multi-partition", f"{system.traits.not_multi_partition}")
        system.append([6] * system.partitions)

        async def scenario() -> None:
            source = await system.open()
            delivery = Delivery()
            for _ in range(2 * system.partitions):
                await system.poll(source, 2, delivery)
            checkpoint = source.checkpoint()
            await source.close()
            if None in delivery.partitions:
                skip(
                    "multi-partition",
                    "batches carry no PartitionInfo, so partitions cannot be told apart",
                )
            for partition, offset in checkpoint.offsets.items():
                if partition not in delivery.partitions:
                    continue
                alone = SourceCheckpoint({partition: offset}, metadata=checkpoint.metadata)
                restored = await system.open(alone)
                after = Delivery()
                returned = Counter(
                    record
                    for record, part in zip(delivery.ids, delivery.partitions, strict=True)
                    if part == partition
                )
                await system.drain(restored, after, system.appended.total() - returned.total())
                await restored.close()
                figures.cases += 1
                figures.epochs += 1
                compare(
                    after.ids,
                    system.appended - returned,
                    f"restoring only partition {partition!r} at offset {offset!r} of "
                    f"{checkpoint!r} (the others from their start)",
                )

        system.run(scenario())
        if not figures.cases:
            skip(
                "multi-partition",
                "the checkpoint's offsets are not keyed by the batches' PartitionInfo.id",
            )


SCHEDULE = SourceSchedule()
"""The epochs :meth:`SourceReplaySuite.test_delivery_survives_a_crash_at_each_point_inside_a_call`
reads."""


def _read_through_crashes(
    target: Target,
    figures: Figures,
    points: list[FaultPoint],
    *,
    killed_at: FaultPoint | None = None,
    discovering: bool = False,
) -> FaultPlan:
    """Read :data:`SCHEDULE`'s epochs crashing at ``points``, then the rest; check every record.

    :param killed_at: first read the epochs in a child process killed with SIGKILL there,
        then go on in this one from what its epochs committed.
    :param discovering: find the crash points inside the calls (and watch threads the source
        starts itself).
    :returns: the plan, with the points found and those fired.
    """
    system = SourceSystem(target)
    system.append([SCHEDULE.records_per_partition] * system.partitions)
    plan = FaultPlan(points, discovering=discovering)
    poll_timeout_s = CALL_TIMEOUT_S + system.idle_timeout_s
    committed = Committed()
    if killed_at is not None:
        try:
            properties = dict(system.context.config().properties)
            committed = kill_source_in_child(
                Child(target.connector, properties, target.extra_plugins, system.state_directory),
                schedule=SCHEDULE,
                poll_timeout_s=poll_timeout_s,
                point=killed_at,
                plan=plan,
            )
        except AssertionError:
            system.context.close()
            raise
        figures.restarts += 1

    async def scenario() -> tuple[int, list[int]]:
        crashes = await run_source_epochs(
            system.open, plan, SCHEDULE, committed, poll_timeout_s=poll_timeout_s
        )
        read = sum(batch.num_rows for batches in committed.batches for batch in batches)
        last = committed.checkpoint
        source = await system.open(None if last is None else SourceCheckpoint.from_json(last))
        rest = Delivery()
        await system.drain(source, rest, system.appended.total() - read)
        await source.close()
        return crashes, rest.ids

    with dropping_what_crashes_left():
        crashes, rest = system.run(with_watched_threads(scenario(), own_threads=discovering))
    figures.cases += 1
    figures.restarts += crashes
    figures.faults += len(plan.fired)
    figures.epochs += SCHEDULE.epochs + 1
    read = [
        record
        for batches in committed.batches
        for batch in batches
        for record in system.context.ids(batch)
    ]
    fired = "; ".join(map(str, plan.fired)) or "none fired"
    try:
        compare(read + rest, system.appended, f"{SCHEDULE}, with faults [{fired}], then the rest")
    except AssertionError as failure:
        timeline = Timeline(tuple(plan.trace), (str(failure),), rows="source")
        figures.timeline = timeline.to_json()
        raise AssertionError(f"{failure}\n{timeline.text()}") from None
    return plan


def _system_whose_partitions_change(target: Target, change: str) -> SourceSystem:
    """A system for a check that makes a partition ``change`` (appear, go) while a source runs.

    Skips, saying why, when the probe found one partition only or no live appends.
    """
    system = SourceSystem(target)
    if system.partitions < 2:
        system.context.close()
        skip("multi-partition", f"{system.traits.not_multi_partition}")
    if not system.live_appends:
        system.context.close()
        skip("live-appends", f"{system.traits.not_live}, so a partition cannot {change}")
    return system


@contextlib.contextmanager
def _raised_while(what: str) -> Iterator[None]:
    """Turn an exception of the source's into a failure that says what the kit had done."""
    try:
        yield
    except AssertionError:
        raise
    except Exception as error:
        raised = f"{type(error).__name__}: {error}"
        raise AssertionError(f"{what}: the source raised {raised}") from error


async def _restored_returns_the_rest(
    system: SourceSystem,
    figures: Figures,
    checkpoint: SourceCheckpoint,
    returned: Counter[int],
    what: str,
) -> None:
    """``checkpoint``, restored on a new instance, returns every record not in ``returned``."""
    restored = await system.open(checkpoint)
    after = Delivery()
    await system.drain(restored, after, system.appended.total() - returned.total())
    await restored.close()
    figures.epochs += 1
    compare(after.ids, system.appended - returned, what)


def _require_range_readable(target: Target) -> None:
    system = SourceSystem(target)

    async def offered() -> tuple[bool, bool]:
        source = await system.open()
        try:
            return source.as_range_readable() is not None, source.supports_replay()
        finally:
            await source.close()

    readable, replays = system.run(offered())
    if not readable:
        skip(
            "range-reads",
            "as_range_readable() is None: the source is read by polling only (on Spark, "
            "through the read log)",
        )
    assert replays, (
        "the source offers as_range_readable() but its supports_replay() is False: a range "
        "read is a replay of the records between two checkpoints, so only a replayable source "
        "can offer it"
    )


class SourceRangeReadSuite(ConnectorSuite):
    """``as_range_readable()``: range reads and planned ends agree with polling."""

    role: ClassVar[ConnectorRole] = ConnectorRole.SOURCE

    @check
    def test_range_reads_return_exactly_what_polling_returned(
        self, conformance: Target, figures: Figures
    ) -> None:
        """Random polls, checkpoints, appends and plans; then ranges read against polling.

        One instance polls to the end, the reference. Between sampled pairs of its
        checkpoints, ``read_range`` of every partition that moved returns exactly the ids
        polling returned between them, in order — twice on one instance, and once more on new
        instances reading all partitions at once. ``plan_end(start, None)`` ends where
        polling ends; chained ``plan_end(start, k)`` plans at most ``k`` records each and
        reaches the same end; with nothing new it returns equal offsets; a plan made while
        the source ran names no record appended after it and does not move its instance.
        """
        _require_range_readable(conformance)
        probe = SourceSystem(conformance)
        probe.context.close()
        choices = [
            st.tuples(st.just("poll"), st.integers(1, 5)),
            st.tuples(st.just("checkpoint"), st.just(0)),
            st.tuples(st.just("plan"), st.integers(0, 5)),
        ]
        if probe.live_appends:
            choices.append(st.tuples(st.just("append"), st.integers(1, 3)))
        indexes = st.integers(0, 30)

        @given(
            counts=probe.counts(),
            steps=st.lists(st.one_of(choices), max_size=25),
            pairs=st.lists(st.tuples(indexes, indexes), min_size=1, max_size=3),
            chunk=st.integers(1, 8),
        )
        def run(
            counts: list[int], steps: list[RangeStep], pairs: list[tuple[int, int]], chunk: int
        ) -> None:
            figures.cases += 1
            system = SourceSystem(conformance)
            system.append(counts)
            system.run(RangeCase(system, figures).run(steps, pairs, chunk))

        # A third of the replay cases: each reads every range three ways and chains plans.
        examples = max(1, conformance.profile.replay_examples // 3)
        conformance.explore(run, examples, figures)

    @check
    def test_plan_end_names_only_records_already_appended(
        self, conformance: Target, figures: Figures
    ) -> None:
        """A plan made mid-way ends where polling ends; records appended later stay out of it."""
        _require_range_readable(conformance)
        figures.cases += 1
        system = SourceSystem(conformance)
        uneven = [4 + partition % 2 for partition in range(system.partitions)]
        system.append([5] * system.partitions if system.equal_partitions else uneven)
        system.run(plan_then_append(system, figures))

    @check
    def test_an_instance_kept_open_plans_records_appended_after_it_opened(
        self, conformance: Target, figures: Figures
    ) -> None:
        """One instance, never polled, plans records appended after it was opened.

        Spark keeps one instance of a range-readable source open for the whole query to plan
        every micro-batch with ``plan_end``, and never polls it.
        """
        _require_range_readable(conformance)
        figures.cases += 1
        system = SourceSystem(conformance)
        if not system.live_appends:
            system.context.close()
            skip("live-appends", f"{system.traits.not_live}, so a planner kept open goes unchecked")
        system.append([2] * system.partitions)
        system.run(plan_on_an_instance_kept_open(system, figures))


NETWORK_RECORDS_PER_PARTITION = 6
"""What the network-fault check appends to each partition before it reads."""
NETWORK_POLLS = 20
"""The most polls under the fault: the first that raises or returns nothing ends them."""


class SourceNetworkSuite(ConnectorSuite):
    """Network faults between the source and its system, through a proxy."""

    role: ClassVar[ConnectorRole] = ConnectorRole.SOURCE

    @pytest.mark.parametrize("fault", NETWORK_FAULTS, ids=lambda fault: fault.name)
    @check
    def test_a_network_fault_ends_polls_and_loses_nothing(
        self, conformance: Target, fault: NetworkFault
    ) -> None:
        """Records read through a proxy, a checkpoint, then polls under ``fault``.

        For contexts that name their connector's ``network_endpoint`` and give
        ``config_through(address)``. Each poll under the fault must end within the runtime's
        call timeout (the polls go on until one returns nothing or raises): returning what it
        holds or nothing, or raising a ``ConnectorError``
        that names the address it connects to — not hang, not wait to be cancelled. Latency
        and low bandwidth must fail no poll. Then the fault clears, and the checkpoint,
        restored on a new instance, must return every record after it once.
        """
        _require_replay(conformance)
        system = SourceSystem(conformance)
        proxy, _ = proxied_config(system.context)
        system.through = proxy.listen
        system.append([NETWORK_RECORDS_PER_PARTITION] * system.partitions)
        window = FaultWindow(proxy, fault)

        async def scenario() -> tuple[Counter[int], list[int]]:
            source = await system.open()
            before = Delivery()
            while before.ids == [] and await system.poll(source, 2, before):
                pass
            checkpoint = source.checkpoint()
            window.turn_on()
            with contextlib.suppress(Exception):
                for _ in range(NETWORK_POLLS):
                    bounded = asyncio.wait_for(source.poll_batch(2), NETWORK_CALL_TIMEOUT_S)
                    if await window.watched("poll_batch", bounded) is None:
                        break  # what the source held is read: the next polls need the network
            window.off()
            with contextlib.suppress(Exception):
                await source.close()
            returned = Counter(before.ids)
            restored = await system.open(checkpoint)
            rest = Delivery()
            await system.drain(restored, rest, system.appended.total() - returned.total())
            await restored.close()
            return returned, rest.ids

        try:
            returned, rest = judged(window, lambda: system.run(scenario()), must_fail=False)
        finally:
            window.off()
            proxy.delete()
        compare(
            rest,
            system.appended - returned,
            f"after {fault.name} ({fault.happens}) and a restore of the checkpoint taken before it",
        )


class SourceSuite(
    SourceContractSuite,
    SourceReplaySuite,
    SourceRangeReadSuite,
    SourceRuntimeSuite,
    SourceNetworkSuite,
):
    """Every source check: contract, replay, range reads, what Spark demands, network faults."""
