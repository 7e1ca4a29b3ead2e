"""What the runtime demands of a connector on Spark, checked in process before anything runs.

Each check here fails, with what the connector's author has to change, for a connector the
Spark bridge would refuse or break on: types that do not come back from Spark as declared, a
schema that depends on the data, answers that change once the connector is opened, keys
Spark's options cannot carry, and a source that loses records when it is reopened and restored
for every micro-batch, as the bridge's planning does. They use the bridge's own rules
(``laminar_sdk.spark``), so they cannot drift from it; where ``pyspark`` is not installed the
checks that need its type mapping skip under ``spark``.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections import Counter
from types import ModuleType
from typing import ClassVar

import pyarrow as pa

from laminar_conformance._delivery import Delivery
from laminar_conformance._figures import Figures
from laminar_conformance._skips import skip
from laminar_conformance._source_system import SourceSystem, compare, render
from laminar_conformance._spark_layer import PYSPARK_MISSING
from laminar_conformance._suite import ConnectorSuite, Target, check
from laminar_sdk import (
    ConnectorRole,
    SchemaMismatch,
    SinkConnector,
    SourceCheckpoint,
    SourceConnector,
)

MICRO_BATCH_RECORDS = 2
"""The most records the kit's imitation of the bridge's planning polls per micro-batch: fewer
than each append holds, so that micro-batches end with records still waiting."""


def spark_bridge() -> ModuleType:
    """``laminar_sdk.spark``, whose rules the checks apply; skip under ``spark`` without it."""
    if importlib.util.find_spec("pyspark") is None:
        skip("spark", PYSPARK_MISSING)
    import laminar_sdk.spark  # noqa: PLC0415 - imports pyspark

    return laminar_sdk.spark


def _round_trip(target: Target, declared: pa.Schema) -> pa.Schema:
    """The schema ``declared`` has after crossing Spark; fail, naming the columns, if it changes."""
    bridge = spark_bridge()
    try:
        crossed: pa.Schema = bridge.spark_round_trip_schema(declared, target.connector)
    except SchemaMismatch as error:
        raise AssertionError(
            f"on Spark, this {target.role} is refused before any data moves: {error}"
        ) from None
    problems = bridge.schema_differences(crossed, declared)
    assert not problems, (
        f"schema() declares ({render(declared)}), but on Spark its batches have "
        f"({render(crossed)}): {'; '.join(problems)}. Spark keeps its own types (timestamps "
        "in microseconds, strings and binaries with 32-bit offsets, no dictionaries, no "
        "unsigned integers): declare in schema(), and use in the batches, the types Spark "
        f"gives back, or every micro-batch of this {target.role} is refused on Spark"
    )
    return crossed


class SourceRuntimeSuite(ConnectorSuite):
    """A source as the Spark bridge reads it: its types, its schema, reopened every batch."""

    role: ClassVar[ConnectorRole] = ConnectorRole.SOURCE

    @check
    def test_batches_reach_spark_as_the_source_declares_them(
        self, conformance: Target, figures: Figures
    ) -> None:
        """The declared types come back from Spark unchanged; every batch conforms to them.

        The bridge conforms each batch to the Arrow schema Spark exchanges (the declared one
        after Spark's type mapping): a column of a type Spark changes on the way, or nulls
        in a column declared non-nullable, fail every micro-batch there.
        """
        figures.cases += 1
        bridge = spark_bridge()
        system = SourceSystem(conformance)
        system.append([4] * system.partitions)

        async def scenario() -> None:
            source = await system.open()
            declared = source.schema()
            crossed = _round_trip(conformance, declared)
            delivery = Delivery()

            def conform(batch: pa.RecordBatch) -> None:
                try:
                    bridge.conform_source_batch(batch, declared, crossed, conformance.connector)
                except SchemaMismatch as error:
                    raise AssertionError(
                        f"on Spark, this batch is refused: {error} (fix the source's batches "
                        "or its schema(), not the pipeline)"
                    ) from None

            await system.drain(source, delivery, system.appended.total(), inspect=conform)
            await source.close()
            compare(delivery.ids, system.appended, "reading every record once")

        system.run(scenario())

    @check
    def test_schema_is_known_when_opened_and_the_same_on_every_instance(
        self, conformance: Target, figures: Figures
    ) -> None:
        """``schema()`` answers before any record is read, the same on every instance.

        Spark fixes a stream's columns when it is loaded, from an instance opened before any
        record exists; every task then opens an instance of its own and conforms its batches
        to those columns.
        """
        figures.cases += 1
        system = SourceSystem(conformance)

        async def scenario() -> None:
            early = await system.open()
            before = early.schema()
            system.append([3] * system.partitions)
            later = await system.open()
            delivery = Delivery()
            await system.drain(later, delivery, system.appended.total())
            schemas = {
                "an instance opened before any record existed": before,
                "an instance after reading records": later.schema(),
                "the first instance, asked again": early.schema(),
            }
            await early.close()
            await later.close()
            for what, schema in schemas.items():
                assert schema.equals(before, check_metadata=False), (
                    f"schema() of {what} is ({render(schema)}), but an instance opened before "
                    f"any record existed said ({render(before)}): Spark fixes a stream's "
                    "columns from that first answer, and refuses batches of any other. "
                    "schema() must come from the configuration, not from the data"
                )

        system.run(scenario())

    @check
    def test_what_the_source_offers_does_not_change_when_it_is_opened(
        self, conformance: Target, figures: Figures
    ) -> None:
        """``as_range_readable()`` and ``supports_replay()`` answer alike, unopened or opened.

        The bridge chooses how to read a source (range reads or polling) and whether a
        pipeline can be exactly-once from an unopened instance, then reads with opened ones.
        """
        figures.cases += 1
        unopened = conformance.plugins.registry.create_source(conformance.connector)
        system = SourceSystem(conformance)

        async def scenario() -> None:
            answers = _source_answers(unopened, "an unopened instance")
            opened = await system.open()
            try:
                assert _source_answers(opened, "an opened instance") == answers, (
                    f"an unopened instance answers {answers}, an opened one "
                    f"{_source_answers(opened, 'an opened instance')}: the Spark bridge asks an "
                    "unopened instance to choose how to read the source, then reads with opened "
                    "ones. Answer from the class, not from the configuration or a connection"
                )
            finally:
                await opened.close()

        system.run(scenario())

    @check
    def test_a_source_reopened_and_restored_for_each_micro_batch_loses_nothing(
        self, conformance: Target, figures: Figures
    ) -> None:
        """Every micro-batch on a new instance restored to where the last one stopped.

        That is how the bridge plans a source that is not range-readable — whether or not it
        can replay: open a new instance, ``restore`` the last micro-batch's end, poll up to
        the batch's size (clearing ``data_ready_notify()``, stopping when
        ``checkpoint_requested()`` is set), take ``checkpoint()``, close. Records appended
        between micro-batches must come too. Nothing may be lost; a replayable source
        returns each record once.
        """
        figures.cases += 1
        system = SourceSystem(conformance)
        system.append([3] * system.partitions)
        replays = conformance.plugins.registry.create_source(conformance.connector)
        exactly_once = replays.supports_replay()

        async def scenario() -> None:
            first = await system.open()
            start = first.checkpoint()
            await first.close()
            delivery = Delivery()
            appends = 2 if system.live_appends else 0
            idle = 0
            while idle < 2 and len(delivery.ids) <= 2 * system.appended.total() + 64:
                start, polled = await self._micro_batch(system, start, delivery)
                figures.epochs += 1
                if polled:
                    idle = 0
                    if appends:
                        appends -= 1
                        system.append([3] * system.partitions)
                    continue
                if len(delivery.ids) < system.appended.total():
                    await asyncio.sleep(max(system.idle_timeout_s, 0.05))
                idle += 1
            received = Counter(delivery.ids)
            if exactly_once:
                compare(
                    delivery.ids,
                    system.appended,
                    f"{figures.epochs} micro-batches, each on a new instance restored to where "
                    "the last one stopped",
                )
            lost = sorted((system.appended - received).elements())
            assert not lost, (
                f"lost ids {lost[:12]} over {figures.epochs} micro-batches, each on a new "
                "instance restored to where the last one stopped: on Spark, a polled source "
                "is reopened and restored for every micro-batch, so what an instance held "
                "when it was closed must not be gone"
            )

        system.run(scenario())

    async def _micro_batch(
        self, system: SourceSystem, start: SourceCheckpoint, delivery: Delivery
    ) -> tuple[SourceCheckpoint, int]:
        """One micro-batch as the bridge plans it; the checkpoint it ends at, records polled."""
        source = await system.open(start)
        requested = source.checkpoint_requested()
        assert requested is None or all(
            callable(getattr(requested, name, None)) for name in ("is_set", "clear")
        ), f"checkpoint_requested() returned {requested!r}, not a threading.Event or None"
        before = len(delivery.ids)
        while (polled := len(delivery.ids) - before) < MICRO_BATCH_RECORDS:
            ready = source.data_ready_notify()
            assert ready is None or isinstance(ready, asyncio.Event), (
                f"data_ready_notify() returned {ready!r}, not an asyncio.Event or None"
            )
            if ready is not None:
                ready.clear()
            if not await system.poll(source, MICRO_BATCH_RECORDS - polled, delivery):
                break
            if requested is not None and requested.is_set():
                requested.clear()
                break
        end = source.checkpoint()
        await source.close()
        return end, len(delivery.ids) - before


def _source_answers(source: SourceConnector, what: str) -> dict[str, object]:
    try:
        return {
            "range-readable": source.as_range_readable() is not None,
            "replayable": source.supports_replay(),
        }
    except Exception as error:
        raise AssertionError(
            f"asking {what} as_range_readable() / supports_replay() raised {error!r}: the Spark "
            "bridge asks an unopened instance; answer from the class"
        ) from error


class SinkRuntimeSuite(ConnectorSuite):
    """A sink as the Spark bridge writes it: its types, and what it offers before it opens."""

    role: ClassVar[ConnectorRole] = ConnectorRole.SINK

    @check
    def test_the_sink_schema_comes_back_from_spark_unchanged(
        self, conformance: Target, figures: Figures
    ) -> None:
        """Spark hands the sink batches of its own types: the declared ones must survive it."""
        figures.cases += 1
        context = conformance.sink_context()

        async def declared() -> pa.Schema:
            opened, _ = await conformance.plugins.registry.open_sink(
                conformance.connector,
                context.config().properties,
                state_store=conformance.new_state_store(),
            )
            try:
                return opened.schema()
            finally:
                await opened.close()

        try:
            schema = asyncio.run(declared())
        finally:
            context.close()
        _round_trip(conformance, schema)

    @check
    def test_what_the_sink_offers_does_not_change_when_it_is_opened(
        self, conformance: Target, figures: Figures
    ) -> None:
        """``capabilities()`` and ``as_distributed_commit()`` answer alike, unopened or opened."""
        figures.cases += 1
        registry = conformance.plugins.registry
        unopened = registry.create_sink(conformance.connector)
        context = conformance.sink_context()

        def answers(sink: SinkConnector, what: str) -> dict[str, object]:
            try:
                return {
                    "capabilities": sink.capabilities(),
                    "distributed-commit": sink.as_distributed_commit() is not None,
                }
            except Exception as error:
                raise AssertionError(
                    f"asking {what} capabilities() / as_distributed_commit() raised {error!r}: "
                    "answer from the class"
                ) from error

        async def scenario() -> None:
            before = answers(unopened, "an unopened instance")
            opened, _ = await registry.open_sink(
                conformance.connector,
                context.config().properties,
                state_store=conformance.new_state_store(),
            )
            try:
                after = answers(opened, "an opened instance")
            finally:
                await opened.close()
            assert before == after, (
                f"an unopened instance answers {before}, an opened one {after}: the runtime "
                "checks the delivery guarantee and chooses the commit path from what the sink "
                "offers before it writes. Answer from the class, not from the configuration or "
                "a connection"
            )

        try:
            asyncio.run(scenario())
        finally:
            context.close()
