"""The sink conformance suites: contract, epoch protocol, and recovery from crashes.

Adopt them in a plugin's tests with one class per sink (fsspec's pattern)::

    from laminar_conformance.sink import SinkSuite

    class TestMySink(SinkSuite):
        connector = "my-sink"

The plugin must give the kit a :class:`~laminar_conformance.contexts.SinkTestContext` through
the ``laminar_conformance_context`` hook. Adopt single suites (:class:`SinkContractSuite`,
:class:`SinkEpochProtocolSuite`, :class:`SinkRecoverySuite`) to run part of it; override one
check by defining a method of the same name (mark it ``pytest.mark.skip(reason=...)`` to leave
it out, saying why). ``plugins = [my_plugin_module]`` uses a plugin that is not installed.

The sink's :meth:`~laminar_sdk.SinkConnector.capabilities` select the checks, and a claimed
capability the sink does not keep fails: ``exactly_once`` — every committed id visible exactly
once, a rolled-back epoch leaves no trace, a committed epoch delivered again is skipped;
``two_phase_commit`` — nothing is visible before ``commit_epoch``; ``idempotent`` — writing a
committed epoch again adds nothing. Every sink must lose no committed id.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from collections import Counter
from collections.abc import Coroutine, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from laminar_conformance._config_checks import ConfigurationSuite
from laminar_conformance._faults import (
    FaultPlan,
    FaultPoint,
    FaultySink,
    InjectedFault,
    every_fault_point,
)
from laminar_conformance._figures import Figures
from laminar_conformance._sink_machine import SinkProtocolMachine, open_sink
from laminar_conformance._suite import ConnectorSuite, Target, check
from laminar_conformance.contexts import SinkTestContext
from laminar_sdk import (
    Closed,
    ConnectorRole,
    EpochCoordinator,
    HealthState,
    HealthStatus,
    RetryPolicy,
    SchemaMismatch,
    SimulatedCrash,
    SinkConnector,
    SinkConnectorCapabilities,
)

_CHECKPOINT_STORE = "file"
_UNCHECKED = ("upsert", "changelog", "schema_evolution", "partitioned")
_UNREADABLE = "the test context cannot read the destination back (committed_ids() is None)"
T = TypeVar("T")


def _capabilities(target: Target) -> SinkConnectorCapabilities:
    sink = target.plugins.registry.create_sink(target.connector)
    return sink.capabilities()


def _require_readable(context: SinkTestContext) -> Sequence[int]:
    visible = context.committed_ids()
    if visible is None:
        pytest.skip(_UNREADABLE)
    return visible


def _require(capabilities: SinkConnectorCapabilities, *names: str) -> None:
    if not any(getattr(capabilities, name) for name in names):
        pytest.skip(f"the sink does not declare {' or '.join(names)}")


class _Session:
    """One destination, and the sink instances opened on it, in one event loop."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.context = target.sink_context()
        self.properties = self.context.config().properties

    async def open(self) -> SinkConnector:
        return await open_sink(self.target, self.properties)

    async def write_epoch(
        self, sink: SinkConnector, epoch: int, ids: Sequence[int], *, commit: bool = True
    ) -> None:
        await sink.begin_epoch(epoch)
        await sink.write_batch(self.context.batch(ids))
        await sink.pre_commit(epoch)
        if commit:
            await sink.commit_epoch(epoch)

    def visible(self) -> Counter[int]:
        return Counter(_require_readable(self.context))

    def run(self, scenario: Coroutine[object, object, T]) -> T:
        """Run ``scenario``, then close the context."""
        try:
            return asyncio.run(scenario)
        finally:
            self.context.close()


class SinkContractSuite(ConfigurationSuite):
    """The sink's schema, lifecycle, configuration errors, health and metrics."""

    role: ClassVar[ConnectorRole] = ConnectorRole.SINK

    @check
    def test_the_context_batches_match_the_sink_schema(
        self, conformance: Target, figures: Figures
    ) -> None:
        """The context builds batches in ``schema()`` (every other check relies on it)."""
        figures.cases += 1
        session = _Session(conformance)

        async def scenario() -> None:
            sink = await session.open()
            schema = sink.schema()
            assert isinstance(schema, pa.Schema), f"schema() returned {type(schema).__name__}"
            for ids in ([], [1], [2, 3, 4]):
                batch = session.context.batch(ids)
                assert batch.schema.equals(schema), (
                    f"the test context's batch({ids}) has schema {batch.schema}, but the sink's "
                    f"schema() is {schema}: fix the context's batch()"
                )
                assert batch.num_rows == len(ids)
            await sink.close()

        session.run(scenario())

    @check
    def test_a_batch_of_another_schema_is_refused_with_schema_mismatch(
        self, conformance: Target, figures: Figures
    ) -> None:
        """``write_batch`` raises :class:`SchemaMismatch` for a batch not in ``schema()``."""
        figures.cases += 1
        session = _Session(conformance)

        async def scenario() -> None:
            sink = await session.open()
            batch = session.context.batch([1, 2])
            extra = batch.append_column("laminar_conformance_extra", pa.array([0, 0], pa.int8()))
            await sink.begin_epoch(0)
            with pytest.raises(SchemaMismatch):
                await sink.write_batch(extra)
            await sink.rollback_epoch(0)
            await sink.close()

        session.run(scenario())

    @check
    def test_calls_after_close_raise_closed(self, conformance: Target, figures: Figures) -> None:
        """After ``close()``, protocol calls raise :class:`Closed` and change nothing."""
        figures.cases += 1
        session = _Session(conformance)

        async def scenario() -> None:
            sink = await session.open()
            await sink.close()
            with pytest.raises(Closed):
                await sink.begin_epoch(0)
            with pytest.raises(Closed):
                await sink.write_batch(session.context.batch([1]))
            visible = session.context.committed_ids()
            assert not visible, f"ids {sorted(visible or [])} visible after calls on a closed sink"

        session.run(scenario())

    @check
    def test_close_abandons_an_open_epoch(self, conformance: Target, figures: Figures) -> None:
        """Closing with an epoch open commits nothing; a new instance can write it again."""
        figures.cases += 1
        figures.restarts += 1
        session = _Session(conformance)

        async def scenario() -> None:
            sink = await session.open()
            exactly_once = sink.capabilities().exactly_once
            await sink.begin_epoch(0)
            await sink.write_batch(session.context.batch([1, 2]))
            await sink.close()
            if exactly_once:
                assert not session.visible(), "close() committed the open epoch"
            restarted = await session.open()
            await restarted.rollback_epoch(0)
            await session.write_epoch(restarted, 0, [1, 2])
            await restarted.close()
            seen = session.visible()
            assert seen[1] >= 1, "the epoch written again after close is lost"
            assert seen[2] >= 1, "the epoch written again after close is lost"
            if exactly_once:
                assert seen == Counter([1, 2]), (
                    f"expected ids 1, 2 once, see {sorted(seen.elements())}"
                )

        session.run(scenario())

    @check
    def test_health_and_metrics_are_sane(self, conformance: Target, figures: Figures) -> None:
        """``health_check`` gives a status, not unhealthy; counters never go down or below 0."""
        figures.cases += 1
        session = _Session(conformance)

        async def scenario() -> None:
            sink = await session.open()
            health = await sink.health_check()
            assert isinstance(health, HealthStatus), f"health_check() returned {health!r}"
            assert health.state is not HealthState.UNHEALTHY, f"a working sink reports {health}"
            previous = 0
            for epoch in range(3):
                await session.write_epoch(sink, epoch, [epoch * 10, epoch * 10 + 1])
                metrics = sink.metrics()
                assert min(metrics.records_total, metrics.bytes_total, metrics.errors_total) >= 0
                assert metrics.records_total >= previous, "records_total went down"
                previous = metrics.records_total
            await sink.close()

        session.run(scenario())

    @pytest.mark.parametrize("capability", _UNCHECKED)
    @check
    def test_capabilities_not_checked_in_process(
        self, conformance: Target, figures: Figures, capability: str
    ) -> None:
        """Capabilities this layer has no check for are reported as skipped, saying why."""
        figures.cases += 1
        if getattr(_capabilities(conformance), capability):
            pytest.skip(f"{capability} is declared, but the in-process layer does not check it yet")
        pytest.skip(f"the sink does not declare {capability}")


class SinkEpochProtocolSuite(ConnectorSuite):
    """The epoch protocol, driven call by call, with faults and restarts."""

    role: ClassVar[ConnectorRole] = ConnectorRole.SINK

    @check
    def test_epoch_protocol_state_machine(self, conformance: Target, figures: Figures) -> None:
        """Random schedules of protocol calls, faults, restarts and re-deliveries vs a model."""

        class SinkProtocol(SinkProtocolMachine):
            def __init__(self) -> None:
                super().__init__(conformance, figures)

        run_state_machine_as_test(
            conformance.seeded(SinkProtocol),
            settings=conformance.settings(conformance.profile.machine_examples),
        )

    @check
    def test_nothing_is_visible_before_commit_epoch(
        self, conformance: Target, figures: Figures
    ) -> None:
        """``two_phase_commit``: written and pre-committed records stay invisible until commit."""
        _require(_capabilities(conformance), "two_phase_commit")
        figures.cases += 1
        session = _Session(conformance)

        async def scenario() -> None:
            sink = await session.open()
            await sink.begin_epoch(0)
            await sink.write_batch(session.context.batch([1, 2]))
            assert not session.visible(), "written records are visible before pre_commit"
            await sink.write_batch(session.context.batch([3]))
            await sink.pre_commit(0)
            assert not session.visible(), "pre-committed records are visible before commit_epoch"
            await sink.commit_epoch(0)
            assert session.visible() == Counter([1, 2, 3]), "commit_epoch did not publish the epoch"
            figures.epochs += 1
            await sink.close()

        session.run(scenario())

    @check
    def test_a_rolled_back_epoch_leaves_no_trace(
        self, conformance: Target, figures: Figures
    ) -> None:
        """``exactly_once``: rolling back after writing, or after pre-committing, keeps nothing."""
        _require(_capabilities(conformance), "exactly_once")
        figures.cases += 1
        session = _Session(conformance)

        async def scenario() -> None:
            sink = await session.open()
            await session.write_epoch(sink, 0, [1])
            await session.write_epoch(sink, 1, [2], commit=False)
            await sink.rollback_epoch(1)
            await sink.begin_epoch(1)
            await sink.write_batch(session.context.batch([3]))
            await sink.rollback_epoch(1)
            await session.write_epoch(sink, 1, [4])
            assert session.visible() == Counter([1, 4]), (
                "after rolling back two attempts at epoch 1 (id 2 after pre_commit, id 3 "
                "before) and committing a third (id 4), a reader sees "
                f"{sorted(session.visible().elements())}"
            )
            figures.epochs += 2
            await sink.close()

        session.run(scenario())

    @check
    def test_a_committed_epoch_delivered_again_after_a_restart_is_skipped(
        self, conformance: Target, figures: Figures
    ) -> None:
        """``exactly_once`` / ``idempotent``: a new instance skips an epoch committed before."""
        _require(_capabilities(conformance), "exactly_once", "idempotent")
        figures.cases += 1
        figures.restarts += 1
        session = _Session(conformance)

        async def scenario() -> None:
            crashed = await session.open()
            await session.write_epoch(crashed, 0, [1, 2])
            await session.write_epoch(crashed, 1, [3])
            restarted = await session.open()  # the old instance dies without close()
            await session.write_epoch(restarted, 1, [3])
            await session.write_epoch(restarted, 0, [1, 2])
            assert session.visible() == Counter([1, 2, 3]), (
                "committed epochs 0 (ids 1, 2) and 1 (id 3) delivered again to a new instance: "
                f"a reader sees {sorted(session.visible().elements())}"
            )
            figures.epochs += 2
            await restarted.close()

        session.run(scenario())

    @check
    def test_an_epoch_decided_before_a_crash_is_committed_by_a_new_instance(
        self, conformance: Target, figures: Figures
    ) -> None:
        """The commit of a pre-committed epoch survives the crash of the instance that wrote it."""
        figures.cases += 1
        figures.restarts += 1
        session = _Session(conformance)

        async def scenario() -> None:
            crashed = await session.open()
            await session.write_epoch(crashed, 0, [1, 2], commit=False)
            restarted = await session.open()  # the runtime's record says: commit epoch 0
            await restarted.commit_epoch(0)
            seen = session.visible()
            assert {1, 2} <= set(seen.elements()), (
                "epoch 0 was pre-committed, then committed by a new instance after a crash: "
                f"a reader sees {sorted(seen.elements())}, not ids 1 and 2 (is the pre-commit "
                "kept only in the memory of the instance that wrote it?)"
            )
            figures.epochs += 1
            await restarted.close()

        session.run(scenario())


def _checkpoint_store(directory: Path) -> Any:  # noqa: ANN401 - the SDK does not export Checkpointer
    """A checkpoint store in ``directory``, found like any installed store."""
    (entry_point,) = metadata.entry_points(
        group="laminar_sdk.checkpointers", name=_CHECKPOINT_STORE
    )
    return entry_point.load()(str(directory), {})


async def _run_through_faults(
    session: _Session, store_directory: Path, epochs: list[list[list[int]]], plan: FaultPlan
) -> int:
    """Run ``epochs`` through the coordinator until done, restarting after each crash.

    :returns: the number of restarts.
    """
    store = _checkpoint_store(store_directory)
    # More attempts than planned faults: a retried call fails at most once per fault.
    policy = RetryPolicy(call_timeout_s=60.0, attempts=len(plan) + 2, backoff_s=0.0)
    restarts = 0
    while True:
        sink = FaultySink(await session.open(), plan)
        coordinator = EpochCoordinator(store, {"sink": sink}, policy=policy, observer=plan.observe)
        try:
            await coordinator.recover()
            epoch = coordinator.next_epoch
            while epoch < len(epochs):
                batches = [session.context.batch(ids) for ids in epochs[epoch]]
                try:
                    await coordinator.run_epoch(epoch, batches, {})
                except InjectedFault:
                    continue  # rolled back by the coordinator: run the epoch again
                epoch += 1
        except SimulatedCrash:
            restarts += 1  # the instance dies without close(); a new one recovers
            continue
        await sink.close()
        return restarts


def _delivery_problems(
    visible: Counter[int], epochs: list[list[list[int]]], exactly_once: bool
) -> list[str]:
    epoch_of = {record: e for e, batches in enumerate(epochs) for ids in batches for record in ids}
    lost = sorted(record for record in epoch_of if not visible[record])
    problems = [f"lost ids {lost} (epochs {sorted({epoch_of[r] for r in lost})})"] if lost else []
    if exactly_once:
        twice = sorted(record for record, count in visible.items() if count > 1)
        if twice:
            problems.append(
                f"duplicated ids {twice} (epochs {sorted({epoch_of.get(r, -1) for r in twice})})"
            )
        unknown = sorted(record for record in visible if record not in epoch_of)
        if unknown:
            problems.append(f"ids the kit never wrote: {unknown}")
    return problems


def _epochs_of(sizes: list[list[int]]) -> list[list[list[int]]]:
    counter = iter(range(1_000_000))
    return [[[next(counter) for _ in range(size)] for size in batches] for batches in sizes]


class SinkRecoverySuite(ConnectorSuite):
    """End to end through the SDK's epoch coordinator, crashing at every protocol step."""

    role: ClassVar[ConnectorRole] = ConnectorRole.SINK

    def _check_run(
        self, target: Target, figures: Figures, sizes: list[list[int]], points: list[FaultPoint]
    ) -> None:
        session = _Session(target)
        if session.context.committed_ids() is None:
            session.context.close()
            pytest.skip(_UNREADABLE)
        exactly_once = _capabilities(target).exactly_once
        epochs = _epochs_of(sizes)
        plan = FaultPlan(points)
        store = Path(tempfile.mkdtemp(prefix="checkpoints-", dir=target.directory))

        async def scenario() -> tuple[int, Counter[int]]:
            restarts = await _run_through_faults(session, store, epochs, plan)
            return restarts, session.visible()

        restarts, visible = session.run(scenario())
        figures.cases += 1
        figures.restarts += restarts
        figures.faults += len(plan.fired)
        figures.epochs += len(epochs)
        problems = _delivery_problems(visible, epochs, exactly_once)
        guarantee = "exactly once" if exactly_once else "at least once"
        assert not problems, (
            f"{len(epochs)} epochs through the coordinator with faults "
            f"[{'; '.join(map(str, plan.fired)) or 'none fired'}]: not delivered {guarantee}: "
            + "; ".join(problems)
        )

    @pytest.mark.parametrize("point", every_fault_point(1), ids=str)
    @check
    def test_delivery_survives_a_fault_at_each_point(
        self, conformance: Target, figures: Figures, point: FaultPoint
    ) -> None:
        """Three epochs; one fault at one point of epoch 1; then recovery and the rest."""
        self._check_run(conformance, figures, [[2, 1], [2, 1], [3]], [point])

    @check
    def test_delivery_survives_any_faults(self, conformance: Target, figures: Figures) -> None:
        """Random epochs and several faults at random points, through the coordinator."""
        points = st.tuples(st.sampled_from(every_fault_point(0)), st.integers(0, 3)).map(
            lambda chosen: dataclasses.replace(chosen[0], epoch=chosen[1])
        )

        @given(
            sizes=st.lists(st.lists(st.integers(0, 3), max_size=3), min_size=1, max_size=4),
            points=st.lists(points, max_size=4),
        )
        def run(sizes: list[list[int]], points: list[FaultPoint]) -> None:
            self._check_run(conformance, figures, sizes, points)

        conformance.seeded(conformance.settings(conformance.profile.recovery_examples)(run))()


class SinkSuite(SinkContractSuite, SinkEpochProtocolSuite, SinkRecoverySuite):
    """Every sink check: contract, epoch protocol, and recovery from crashes."""
