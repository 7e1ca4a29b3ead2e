"""The sink conformance suites: contract, epoch protocol, and recovery from crashes.

Adopt them in a plugin's tests with one class per sink (fsspec's pattern)::

    from laminar_conformance.sink import SinkSuite

    class TestMySink(SinkSuite):
        connector = "my-sink"

The plugin must give the kit a :class:`~laminar_conformance.contexts.SinkTestContext` through
the ``laminar_conformance_context`` hook. Adopt single suites (:class:`SinkContractSuite`,
:class:`SinkEpochProtocolSuite`, :class:`SinkRecoverySuite`,
:class:`SinkDistributedCommitSuite`, :class:`SinkRuntimeSuite`) to run part of it; override one
check by defining a method
of the same name (mark it ``pytest.mark.skip(reason=...)`` to leave it out, saying why).
``plugins = [my_plugin_module]`` uses a plugin that is not installed.

The sink's :meth:`~laminar_sdk.SinkConnector.capabilities` select the checks, and a claimed
capability the sink does not keep fails: ``exactly_once`` — every committed id visible exactly
once, a rolled-back epoch leaves no trace, a committed epoch delivered again is skipped;
``two_phase_commit`` — nothing is visible before ``commit_epoch``; ``idempotent`` — writing a
committed epoch again adds nothing; ``schema_evolution`` — through ``as_schema_evolvable()``, a
nullable column added between epochs is accepted; ``partitioned`` — through
``as_distributed_commit()``, tasks staged at once are committed together. Every sink must lose
no committed id. A sink offering ``as_distributed_commit()`` is held to that extension's
promise: nothing staged is visible before ``commit_aggregated``, then exactly the staged output
its descriptors name, once, whatever failed, crashed or was committed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import warnings
from collections import Counter
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from typing import ClassVar, TypeVar

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from laminar_conformance._call_times import CALL_TIMES
from laminar_conformance._config_checks import ConfigurationSuite
from laminar_conformance._distributed_machine import (
    DistributedCommitMachine,
    TaskBatches,
    distributed,
)
from laminar_conformance._faults import (
    Fault,
    FaultPlan,
    FaultPoint,
    FaultySink,
    InjectedFault,
    dropping_what_crashes_left,
    every_distributed_fault_point,
    every_fault_point,
    release_crashed_run,
    with_watched_threads,
)
from laminar_conformance._figures import Figures
from laminar_conformance._inside_crashes import CRASHES_PER_RUN, coverage, crash_at_chosen_points
from laminar_conformance._kill import KILL_STEPS, Child, kill_in_child
from laminar_conformance._network import (
    NETWORK_CALL_TIMEOUT_S,
    NETWORK_FAULTS,
    FaultWindow,
    NetworkFault,
    WatchedSink,
    faulted_steps,
    judged,
    proxied_config,
)
from laminar_conformance._probe import skip_if_turned_off
from laminar_conformance._report import PROBED_PROPERTY
from laminar_conformance._runtime_checks import SinkRuntimeSuite
from laminar_conformance._secrets import assert_no_secret_shown, every_log_record
from laminar_conformance._sink_machine import SinkProtocolMachine, open_sink
from laminar_conformance._skips import skip
from laminar_conformance._stores import checkpoint_store
from laminar_conformance._suite import ConnectorSuite, Target, check
from laminar_conformance._timeline import Timeline
from laminar_conformance.contexts import SinkTestContext
from laminar_sdk import (
    Checkpointer,
    CheckpointError,
    Closed,
    ConnectorRole,
    EpochCoordinator,
    EvolutionVerdict,
    HealthState,
    HealthStatus,
    LaminarError,
    ProtocolStep,
    RetryPolicy,
    SchemaChangeKind,
    SchemaMismatch,
    SinkConnector,
    SinkConnectorCapabilities,
    stage_task,
)
from laminar_sdk.faults import SimulatedCrash

_UNCHECKABLE = {  # capability -> why no check exercises it (the probe's report says so)
    "upsert": (
        "upsert is declared, but the contract names no key: the test context's batch(ids) "
        "carries ids, not keys, so the kit cannot tell which records should replace which; "
        "check upserts in the plugin's own tests"
    ),
    "changelog": (
        "changelog is declared, but the contract defines no encoding of insert and retract "
        "records (no operation column in SinkConnector or the test context), so the kit cannot "
        "write a retraction; check changelog records in the plugin's own tests"
    ),
}
__all__ = [
    "SinkContractSuite",
    "SinkDistributedCommitSuite",
    "SinkEpochProtocolSuite",
    "SinkNetworkSuite",
    "SinkRecoverySuite",
    "SinkRuntimeSuite",
    "SinkSuite",
]

MAX_DESCRIPTOR_BYTES = 64 * 1024
"""The largest commit descriptor a few records may take (see ``_Session.stage``)."""
_UNREADABLE = "the test context cannot read the destination back (committed_ids() is None)"
_ADDED_COLUMN = pa.field("laminar_conformance_added", pa.int64(), nullable=True)
T = TypeVar("T")


def _capabilities(target: Target) -> SinkConnectorCapabilities:
    sink = target.plugins.registry.create_sink(target.connector)
    return sink.capabilities()


def _require_readable(context: SinkTestContext) -> Sequence[int]:
    with CALL_TIMES.timing("the test context's committed_ids()"):
        visible = context.committed_ids()
    if visible is None:
        skip("read-back", _UNREADABLE)
    return visible


def _require(target: Target, category: str, *names: str) -> None:
    """Skip under ``category`` unless the sink declares one of the capabilities ``names``.

    A rollback check is skipped also when the test context turns ``rollback`` off.
    """
    if category == "rollback":
        skip_if_turned_off(target, category)
    if not any(getattr(_capabilities(target), name) for name in names):
        skip(category, f"the sink does not declare {' or '.join(names)}")


class _Session:
    """One destination, and the sink instances opened on it, in one event loop."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.context = target.sink_context()
        self.properties = self.context.config().properties
        self.state_directory = target.new_state_directory()
        self.state = target.new_state_store(self.state_directory)

    async def open(self) -> SinkConnector:
        return await open_sink(self.target, self.properties, self.state)

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

    async def stage(self, epoch: int, task: str, *batches: Sequence[int]) -> str:
        """Stage ``batches`` (ids each) as write task ``task`` of ``epoch``, on a new instance."""
        sink = await self.open()
        records = [self.context.batch(ids) for ids in batches]
        staging = distributed(sink, "an instance opened in a write task")
        descriptor = await staging.stage(epoch, task, TaskBatches(records, Fault.NONE, epoch))
        await sink.close()
        assert isinstance(descriptor, str), f"stage() returned {descriptor!r}, not a str"
        size = len(descriptor.encode())
        assert size <= MAX_DESCRIPTOR_BYTES, (
            f"stage() of {sum(map(len, batches))} records returned a descriptor of {size} bytes: "
            "it travels in the task's commit message and is written into the epoch's manifest "
            f"twice, so it must stay small (at most {MAX_DESCRIPTOR_BYTES} bytes here): name "
            "the staged files or transactions, not the records"
        )
        return descriptor

    async def commit_aggregated(self, epoch: int, descriptors: Sequence[str]) -> None:
        """Commit ``descriptors`` as ``epoch`` on a new instance."""
        sink = await self.open()
        await distributed(sink, "a new instance").commit_aggregated(epoch, descriptors)
        await sink.close()

    async def rollback_epoch(self, epoch: int) -> None:
        """Roll ``epoch`` back on a new instance."""
        sink = await self.open()
        await sink.rollback_epoch(epoch)
        await sink.close()

    def run(self, scenario: Coroutine[object, object, T], *, own_threads: bool = False) -> T:
        """Run ``scenario``, then close the context.

        :param own_threads: watch the threads the sink starts (see
            :func:`~laminar_conformance._faults.with_watched_threads`).

        A crash simulated inside a call abandons what the dead instance held: a coroutine it
        had created and not yet awaited (``await asyncio.wait_for(self._stage(batch), ...)``
        crashed before ``wait_for``), a file it had open. A killed process never finalizes
        them, so their "never awaited" and "unclosed" warnings are the simulation's, not the
        sink's, and are not shown.
        """
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings(
                    "ignore", "coroutine .* was never awaited", category=RuntimeWarning
                )
                warnings.simplefilter("ignore", ResourceWarning)
                return asyncio.run(with_watched_threads(scenario, own_threads=own_threads))
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
    def test_the_probe_finds_what_the_sink_does(
        self, conformance: Target, figures: Figures, request: pytest.FixtureRequest
    ) -> None:
        """An epoch written, pre-committed and committed is visible; what the sink does, found.

        The kit watches one epoch through the protocol and the same epoch delivered again to
        a new instance, and reports what it saw next to what the sink declares: whether
        anything is visible before ``commit_epoch``, and whether a committed epoch delivered
        again is skipped. A sink that behaves exactly-once without declaring it is told so:
        exactly-once pipelines refuse a sink that does not declare ``exactly_once``.
        """
        figures.cases += 1
        figures.restarts += 1
        session = _Session(conformance)
        if session.context.committed_ids() is None:
            session.context.close()
            request.node.user_properties.append((PROBED_PROPERTY, _UNREADABLE))
            skip("read-back", _UNREADABLE)

        async def scenario() -> tuple[Counter[int], Counter[int], Counter[int], bool]:
            sink = await session.open()
            await session.write_epoch(sink, 0, [1, 2], commit=False)
            before = session.visible()
            await sink.commit_epoch(0)
            after = session.visible()
            again = await session.open()  # delivered again after a crash
            await session.write_epoch(again, 0, [1, 2])
            distributed = again.as_distributed_commit() is not None
            await again.close()
            return before, after, session.visible(), distributed

        before, after, redelivered, distributed = session.run(scenario())
        declared = _capabilities(conformance)
        found = [
            "nothing visible before commit_epoch"
            if not before
            else f"ids {sorted(before.elements())} visible before commit_epoch",
            "a committed epoch delivered again to a new instance is skipped"
            if redelivered == Counter([1, 2])
            else "a committed epoch delivered again is written again",
            "offers a distributed commit" if distributed else "commits from one instance",
        ]
        if not declared.exactly_once and not before and redelivered == Counter([1, 2]):
            found.append(
                "it behaves exactly-once here but does not declare exactly_once: exactly-once "
                "pipelines refuse it; declare exactly_once (and two_phase_commit) in "
                "capabilities() if it keeps them, and the kit holds it to them"
            )
        found += [reason for name, reason in _UNCHECKABLE.items() if getattr(declared, name)]
        request.node.user_properties.append((PROBED_PROPERTY, "; ".join(found)))
        assert after >= Counter([1, 2]), (
            f"epoch 0 (ids 1, 2) written, pre-committed and committed: a reader sees "
            f"{sorted(after.elements())}"
        )

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
        """``health_check`` gives a status, not unhealthy; counters never go down or below 0.

        And no secret value of the configuration (a key declared secret, or named like one)
        shows in the sink's health, metrics, ``repr`` or log records (DEBUG and up) meanwhile.
        """
        figures.cases += 1
        session = _Session(conformance)

        async def scenario() -> dict[str, str]:
            sink = await session.open()
            health = await sink.health_check()
            assert isinstance(health, HealthStatus), f"health_check() returned {health!r}"
            assert health.state is not HealthState.UNHEALTHY, f"a working sink reports {health}"
            previous = 0
            shown = {"health_check()": f"{health!s} {health!r}", "repr()": repr(sink)}
            for epoch in range(3):
                await session.write_epoch(sink, epoch, [epoch * 10, epoch * 10 + 1])
                metrics = sink.metrics()
                assert min(metrics.records_total, metrics.bytes_total, metrics.errors_total) >= 0
                assert metrics.records_total >= previous, "records_total went down"
                previous = metrics.records_total
                shown[f"metrics() after epoch {epoch}"] = repr(metrics)
            await sink.close()
            return shown

        with every_log_record() as records:
            shown = session.run(scenario())
        assert_no_secret_shown("sink", conformance.secret_values(), shown | records.shown())

    @check
    def test_schema_evolution_adds_a_column_between_epochs(
        self, conformance: Target, figures: Figures
    ) -> None:
        """``schema_evolution``: a nullable column added between epochs is accepted.

        Through ``as_schema_evolvable()``: ``diff_schemas`` reports the one added column (and
        nothing between equal schemas), ``evaluate_evolution`` finds it compatible,
        ``apply_evolution`` returns the new schema, which ``schema()`` then is, and
        ``schema_version()`` grows by one; an epoch of the new schema is committed after one
        of the old. Also run when the sink offers ``as_schema_evolvable()`` without declaring
        the capability, as far as it evaluates the change compatible.
        """
        figures.cases += 1
        session = _Session(conformance)

        async def scenario() -> None:
            sink = await session.open()
            declared = sink.capabilities().schema_evolution
            evolvable = sink.as_schema_evolvable()
            if evolvable is None:
                await sink.close()
                assert not declared, (
                    "the sink declares schema_evolution, but as_schema_evolvable() returns "
                    "None: offer SchemaEvolvable, through which the runtime evolves a schema"
                )
                skip("capability", "the sink neither declares schema_evolution nor offers it")
            old = sink.schema()
            new = old.append(_ADDED_COLUMN)
            assert evolvable.diff_schemas(old, old) == [], "diff_schemas(s, s) is not empty"
            changes = evolvable.diff_schemas(old, new)
            added = [(change.kind, change.column) for change in changes]
            assert added == [(SchemaChangeKind.COLUMN_ADDED, _ADDED_COLUMN.name)], (
                f"diff_schemas(old, old + nullable {_ADDED_COLUMN.name}) returned {changes}, "
                "not the one added column"
            )
            verdict = evolvable.evaluate_evolution(changes)
            if verdict is not EvolutionVerdict.COMPATIBLE:
                await sink.close()
                assert not declared, (
                    f"the sink declares schema_evolution, yet evaluates adding a nullable "
                    f"column as {verdict.value}"
                )
                skip(
                    "capability",
                    f"the sink evaluates adding a nullable column as {verdict.value}",
                )
            await session.write_epoch(sink, 0, [1, 2])
            version = evolvable.schema_version()
            applied = await evolvable.apply_evolution(old, changes)
            assert applied.equals(new), f"apply_evolution returned ({applied}), not ({new})"
            assert sink.schema().equals(new), (
                f"after apply_evolution, schema() is still ({sink.schema()}), so batches of the "
                "evolved schema are refused"
            )
            assert evolvable.schema_version() == version + 1, (
                f"schema_version() went from {version} to {evolvable.schema_version()}, not "
                "up by one"
            )
            batch = session.context.batch([3, 4])
            evolved = batch.append_column(_ADDED_COLUMN, pa.array([3, None], pa.int64()))
            await sink.begin_epoch(1)
            await sink.write_batch(evolved)
            await sink.pre_commit(1)
            await sink.commit_epoch(1)
            figures.epochs += 2
            await sink.close()
            seen = session.context.committed_ids()
            if seen is not None:
                assert Counter(seen) >= Counter([1, 2, 3, 4]), (
                    f"after epoch 0 (ids 1, 2) and, evolved, epoch 1 (ids 3, 4), a reader sees "
                    f"{sorted(seen)}"
                )

        session.run(scenario())


class SinkEpochProtocolSuite(ConnectorSuite):
    """The epoch protocol, driven call by call, with faults and restarts."""

    role: ClassVar[ConnectorRole] = ConnectorRole.SINK

    @check
    def test_epoch_protocol_state_machine(self, conformance: Target, figures: Figures) -> None:
        """Random schedules of protocol calls, faults, restarts and re-deliveries vs a model."""

        class SinkProtocol(SinkProtocolMachine):
            def __init__(self) -> None:
                super().__init__(conformance, figures)

        conformance.explore_machine(SinkProtocol, conformance.profile.machine_examples, figures)

    @check
    def test_nothing_is_visible_before_commit_epoch(
        self, conformance: Target, figures: Figures
    ) -> None:
        """``two_phase_commit``: written and pre-committed records stay invisible until commit."""
        _require(conformance, "capability", "two_phase_commit")
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
        _require(conformance, "rollback", "exactly_once")
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
        _require(conformance, "rollback", "exactly_once", "idempotent")
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


async def _run_through_faults(
    session: _Session, store_directory: Path, epochs: list[list[list[int]]], plan: FaultPlan
) -> int:
    """Run ``epochs`` through the coordinator until done, restarting after each crash.

    :returns: the number of restarts.
    """
    store = checkpoint_store(store_directory)
    # More attempts than planned faults: a retried call fails at most once per fault.
    policy = RetryPolicy(call_timeout_s=60.0, attempts=len(plan) + 2, backoff_s=0.0)
    restarts = 0
    while True:
        sink = FaultySink(await session.open(), plan)
        coordinator = EpochCoordinator(store, {"sink": sink}, policy=policy, observer=plan.observe)
        crash: SimulatedCrash | None = None
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
        except SimulatedCrash as error:
            crash = error  # the instance dies without close(); a new one recovers
        if crash is not None:
            restarts += 1
            del sink, coordinator  # this frame's references to the dead instance
            release_crashed_run(crash)
            continue
        await sink.close()
        return restarts


async def _run_staged_through_faults(
    session: _Session, store_directory: Path, epochs: list[list[list[int]]], plan: FaultPlan
) -> int:
    """Run ``epochs`` as Spark runs a distributed-commit sink, until done, through crashes.

    Each batch of an epoch is one write task's share, staged on a new instance and retried
    under a new name when it fails; then, on another new instance, the coordinator recovers
    without rolling the epoch back and commits the tasks' descriptors — as Spark's writer
    commit does. After a crash the next run stages the epoch again, with new task names.

    :returns: the number of restarts.
    """
    store = checkpoint_store(store_directory)
    policy = RetryPolicy(call_timeout_s=60.0, attempts=len(plan) + 2, backoff_s=0.0)
    restarts, epoch, attempts = 0, 0, itertools.count()
    while epoch < len(epochs):
        try:
            if await _stage_and_commit(
                session,
                epochs[epoch],
                store=store,
                policy=policy,
                plan=plan,
                epoch=epoch,
                run=f"run-{restarts}",
                attempts=attempts,
            ):
                epoch += 1
        except SimulatedCrash as crash:
            restarts += 1  # the run dies; Spark runs the epoch not in its commit log again
            release_crashed_run(crash)
    return restarts


async def _stage_and_commit(
    session: _Session,
    tasks: list[list[int]],
    *,
    store: Checkpointer,
    policy: RetryPolicy,
    plan: FaultPlan,
    epoch: int,
    run: str,
    attempts: Iterator[int],
) -> bool:
    """Stage each task's ids on an instance of its own, then commit them on another.

    :returns: whether the epoch committed (``False``: rolled back before the decision, so
        Spark runs it again).
    """
    descriptors = []
    for task, ids in enumerate(tasks):
        while True:
            name = f"{run}.epoch-{epoch}.task-{task}.attempt-{next(attempts)}"
            sink = FaultySink(await session.open(), plan)
            batch = [session.context.batch(ids)]
            try:
                descriptors.append(
                    await stage_task("sink", sink, epoch, name, batch, observer=plan.observe)
                )
            except InjectedFault:
                await sink.close()  # as the bridge's write task does when stage() fails
                continue  # Spark runs the task again, as a new attempt
            await sink.close()
            break
    driver = FaultySink(await session.open(), plan)
    coordinator = EpochCoordinator(store, {"sink": driver}, policy=policy, observer=plan.observe)
    await coordinator.recover(roll_back_next=False)
    try:
        await coordinator.commit_staged(epoch, {"sink": descriptors})
    except InjectedFault:
        await driver.close()
        return False
    await driver.close()
    return True


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


def _check_run(
    target: Target,
    figures: Figures,
    sizes: list[list[int]],
    points: list[FaultPoint],
    *,
    staged: bool,
    killed_at: FaultPoint | None = None,
) -> list[FaultPoint]:
    """Run epochs of ``sizes`` with faults at ``points``; check what a reader sees.

    :param staged: run them as a distributed-commit sink's (each batch a write task), held to
        exactly once; else through ``run_epoch``, held to what the sink declares.
    :param killed_at: first run the epochs in a child process killed with SIGKILL there, then
        recover and finish in this one (through ``run_epoch`` only).
    """
    session = _Session(target)
    if session.context.committed_ids() is None:
        session.context.close()
        skip("read-back", _UNREADABLE)
    exactly_once = staged or _capabilities(target).exactly_once
    epochs = _epochs_of(sizes)
    plan = FaultPlan(points)
    store = target.new_checkpoint_directory()
    run = _run_staged_through_faults if staged else _run_through_faults
    if killed_at is not None:
        try:
            kill_in_child(
                Child(
                    target.connector,
                    dict(session.properties),
                    target.extra_plugins,
                    session.state_directory,
                ),
                store=store,
                epochs=[[session.context.batch(ids) for ids in batches] for batches in epochs],
                point=killed_at,
                plan=plan,
            )
        except AssertionError:
            session.context.close()
            raise
        figures.restarts += 1

    async def scenario() -> tuple[int, Counter[int]]:
        restarts = await run(session, store, epochs, plan)
        return restarts, session.visible()

    with dropping_what_crashes_left():
        restarts, visible = session.run(scenario())
    figures.cases += 1
    figures.restarts += restarts
    figures.faults += len(plan.fired)
    figures.epochs += len(epochs)
    problems = _delivery_problems(visible, epochs, exactly_once)
    guarantee = "exactly once" if exactly_once else "at least once"
    path = "staged by write tasks and committed" if staged else "through the coordinator"
    timeline = Timeline(tuple(plan.trace), tuple(problems))
    if problems:
        figures.timeline = timeline.to_json()
    assert not problems, (
        f"{len(epochs)} epochs {path} with faults "
        f"[{'; '.join(map(str, plan.fired)) or 'none fired'}]: not delivered {guarantee}: "
        + "; ".join(problems)
        + ("\n" + timeline.text() if plan.trace else "")
    )
    return plan.fired


def _points_inside(target: Target, sizes: list[list[int]]) -> FaultPlan:
    """A clean run of ``sizes``: the crash points it reaches inside the sink's calls."""
    session = _Session(target)
    if session.context.committed_ids() is None:
        session.context.close()
        skip("read-back", _UNREADABLE)
    plan = FaultPlan([], discovering=True)
    store = target.new_checkpoint_directory()
    session.run(_run_through_faults(session, store, _epochs_of(sizes), plan), own_threads=True)
    return plan


def _fault_points(epochs: int, points: list[FaultPoint]) -> st.SearchStrategy[list[FaultPoint]]:
    """Lists of up to four of ``points``, each moved to one of the first ``epochs`` epochs."""
    moved = st.tuples(st.sampled_from(points), st.integers(0, epochs - 1)).map(
        lambda chosen: dataclasses.replace(chosen[0], epoch=chosen[1])
    )
    return st.lists(moved, max_size=4)


@dataclasses.dataclass(frozen=True, slots=True)
class StaleSchedule:
    """When the old instance of the stale-instance check stops, and when it goes on.

    :param name: the check's parameter id.
    :param paused_after: how many of its calls for epochs 1 and 2 it makes before the new
        instance opens (``begin_epoch``, ``write_batch``, ``pre_commit``, ``commit_epoch``).
    :param resumes_after_recovery: it goes on right after the new instance recovered, before
        that one writes epoch 1 again; otherwise once it committed epochs 1 and 2.
    :param story: what happens, for the failure message.
    """

    name: str
    paused_after: int
    resumes_after_recovery: bool
    story: str


STALE_SCHEDULES = (
    StaleSchedule(
        "written",
        2,
        False,
        "the old one had written epoch 1; it pre-committed and committed it, and wrote and "
        "committed epoch 2, after the new one had committed both",
    ),
    StaleSchedule(
        "pre-committed",
        3,
        False,
        "the old one had pre-committed epoch 1; it committed it, and wrote and committed "
        "epoch 2, after the new one had committed both",
    ),
    StaleSchedule(
        "pre-committed-then-recovered",
        3,
        True,
        "the old one had pre-committed epoch 1; it committed it, and wrote and committed "
        "epoch 2, right after the new one recovered and before it wrote epoch 1 again",
    ),
)
"""The schedules of the stale-instance check, one case each."""


def _stale_steps(
    session: _Session, stale: SinkConnector, epochs: list[list[int]]
) -> Iterator[Coroutine[object, object, object]]:
    """The old instance's calls for epochs 1 and 2, one coroutine at a time."""
    for epoch in (1, 2):
        yield stale.begin_epoch(epoch)
        yield stale.write_batch(session.context.batch(epochs[epoch]))
        yield stale.pre_commit(epoch)
        yield stale.commit_epoch(epoch)


STALE_PATIENCE_S = 5.0
"""How long a call of the new instance may wait before the old instance goes on meanwhile."""


async def _alongside(
    call: Coroutine[object, object, object],
    steps: Iterator[Coroutine[object, object, object]],
    refused: bool,
) -> bool:
    """Await the new instance's ``call``; ``True`` once the old instance refused.

    A call that waits on what the old instance holds (a row it locked, a transaction it left
    open) would wait for ever in one event loop: when it has not finished within
    :data:`STALE_PATIENCE_S`, the old instance goes on meanwhile, as it would in its own
    process. Either order is a schedule the sink must survive, so how long the call takes
    decides which one runs, not the verdict.
    """
    work = asyncio.ensure_future(call)
    done, _ = await asyncio.wait({work}, timeout=STALE_PATIENCE_S)
    if not done and not refused:
        refused = await _go_on(steps)
    await work
    return refused


async def _go_on(
    steps: Iterator[Coroutine[object, object, object]], calls: int | None = None
) -> bool:
    """Make the next ``calls`` calls of ``steps`` (all when ``None``); ``True`` once one refused.

    A refused call ends the instance's calls: it was fenced, or what it had written was rolled
    back by the new instance. Which exception says so is not this check's concern (the
    contract checks look at error types); what the destination shows is.
    """
    for step in itertools.islice(steps, calls):
        try:
            await step
        except Exception:  # noqa: BLE001 - any refusal stops the old instance, see above
            for left in steps:
                left.close()
            return True
    return False


class SinkRecoverySuite(ConnectorSuite):
    """End to end through the SDK's epoch coordinator, crashing at every protocol step."""

    role: ClassVar[ConnectorRole] = ConnectorRole.SINK

    def _check_run(
        self,
        target: Target,
        figures: Figures,
        sizes: list[list[int]],
        points: list[FaultPoint],
        killed_at: FaultPoint | None = None,
    ) -> list[FaultPoint]:
        return _check_run(target, figures, sizes, points, staged=False, killed_at=killed_at)

    @pytest.mark.parametrize("point", every_fault_point(1), ids=str)
    @check
    def test_delivery_survives_a_fault_at_each_point(
        self, conformance: Target, figures: Figures, point: FaultPoint
    ) -> None:
        """Three epochs; one fault at one point of epoch 1; then recovery and the rest."""
        self._check_run(conformance, figures, [[2, 1], [2, 1], [3]], [point])

    @check
    def test_delivery_survives_a_crash_at_each_point_inside_a_call(
        self, conformance: Target, figures: Figures
    ) -> None:
        """A crash before and after every place a clean run's sink calls leave Python.

        The kit traces the sink's calls (docs/conformance-kit.md, "Crash points"): every
        instruction of the sink's own code that called out of Python — a driver, a C
        extension, the operating system, in the calling thread, an executor thread or a thread
        of the sink's own — is a point, and so is every :func:`laminar_sdk.crash_point` it
        marks. Each run crashes at one point of epoch 1 (or the first epoch that reached it):
        in process, as :class:`~laminar_sdk.SimulatedCrash`, and for a seeded sample (every
        point in a thread of the sink's own) with a real SIGKILL of a child process. A sink
        that publishes its data and its epoch record in two steps loses or doubles data when
        it dies between them.
        """
        sizes = [[2, 1]] * (CRASHES_PER_RUN + 1) + [[3]]
        found = _points_inside(conformance, sizes)
        figures.crash_points = coverage(found, [])
        if not found.reached_inside:
            if _capabilities(conformance).exactly_once:
                skip(
                    "crash-points",
                    "the sink declares exactly_once, but a clean run's calls reached no crash "
                    "point: none of them called out of Python, and none is marked with "
                    "laminar_sdk.crash_point; if the sink's I/O really runs where the kit cannot "
                    "see it (a C library's own threads), mark where each step is durable with "
                    "crash_point, or state why none exists in the context's skip_checks",
                )
            skip("capability", "an at-least-once sink whose calls reached no crash point")

        def check_run(points: list[FaultPoint], killed_at: FaultPoint | None) -> list[FaultPoint]:
            return self._check_run(conformance, figures, sizes, points, killed_at=killed_at)

        profile, seed = conformance.profile, conformance.seed
        crash_at_chosen_points(found, profile, seed, figures, check_run)

    @pytest.mark.parametrize("step", KILL_STEPS, ids=lambda step: step.value)
    @check
    def test_delivery_survives_a_real_kill_after_each_durable_call(
        self, conformance: Target, figures: Figures, step: ProtocolStep
    ) -> None:
        """Three epochs in a child process killed with SIGKILL at ``step`` of epoch 1.

        After ``pre_commit`` returned and the manifest decided the epoch (``commit``), and
        after ``commit_epoch`` returned (``committed-manifest``, ``done``), the sink has
        promised that what it wrote survives a crash. A real kill takes what the process
        held in memory — rows in a file's buffer, a writer thread's queue — which the
        in-process crashes do not: then a new instance recovers, in the kit's process, and
        the run goes on.
        """
        self._check_run(
            conformance, figures, [[2, 1], [2, 1], [3]], [], FaultPoint(step, Fault.KILL, 1)
        )

    @check
    def test_a_query_started_over_on_the_same_destination_loses_nothing(
        self, conformance: Target, figures: Figures
    ) -> None:
        """A new query, with the sink configured as before, is written or refused, never skipped.

        A user who deletes a pipeline's checkpoint locations to start over keeps the sink's
        configuration, and the new query numbers its epochs from 0 again. The kit commits two
        epochs through the coordinator on one checkpoint location, then runs two epochs of
        new records on a new location (and state store) with the same configuration. The
        runtime refuses the new query when the sink reports the epochs its destination holds
        (``last_committed_epoch()``); otherwise the new records must be there. A sink that
        skips them as committed loses them without a word.
        """
        session = _Session(conformance)
        if session.context.committed_ids() is None:
            session.context.close()
            skip("read-back", _UNREADABLE)
        first, again = [[0, 1], [2]], [[3, 4], [5]]

        async def scenario() -> tuple[Counter[int], CheckpointError | None]:
            await _run_query(session, first)
            try:
                await _run_query(session, again)
            except CheckpointError as refused:
                return session.visible(), refused
            return session.visible(), None

        visible, refused = session.run(scenario())
        figures.cases += 1
        figures.epochs += len(first) + len(again)
        written = [record for ids in first for record in ids]
        if refused is not None:
            assert sorted(visible.elements()) == written, (
                f"the new query was refused ({refused}), but a reader sees ids "
                f"{sorted(visible.elements())}, not the first query's {written}: the refusal "
                "came after something of the new query was written"
            )
            return
        new = [record for ids in again for record in ids]
        skipped = [record for record in new if not visible[record]]
        assert not skipped, (
            f"a new query (a new checkpoint location, the sink configured as before) delivered "
            f"epochs 0 and 1 again with new records, and a reader does not see ids {skipped}: "
            "the sink skipped them as committed, by the records of an earlier query in its "
            "destination. Return the newest epoch those records hold from "
            "last_committed_epoch(), so that the runtime refuses a new query it would skip"
        )

    @pytest.mark.parametrize("schedule", STALE_SCHEDULES, ids=lambda schedule: schedule.name)
    @check
    def test_a_stale_instance_that_keeps_going_changes_nothing(
        self, conformance: Target, figures: Figures, schedule: StaleSchedule
    ) -> None:
        """An instance presumed dead that goes on writing and committing changes nothing.

        On Spark a task or a commit worker may be presumed dead and its work run again while
        it still runs (speculation, an executor that comes back, a driver restarted while the
        old one's commit goes on). The old instance commits epoch 0, begins epoch 1 and stops
        where ``schedule`` says; a new instance recovers through the coordinator (which
        rolls back the epoch after its checkpoint) and commits epochs 1 and 2; the old one
        then goes on — commits epoch 1 and writes and commits epoch 2 as well. Each of its
        calls may refuse (it raises, and stops: fenced, or what it staged is gone); the new
        instance's may not. A reader must see every record once.
        """
        _require(conformance, "rollback", "exactly_once", "idempotent")
        session = _Session(conformance)
        if session.context.committed_ids() is None:
            session.context.close()
            skip("read-back", _UNREADABLE)
        exactly_once = _capabilities(conformance).exactly_once
        epochs = [[0, 1], [2, 3], [4]]

        async def scenario() -> list[str]:
            store = checkpoint_store(conformance.new_checkpoint_directory())
            stale = await session.open()
            first = EpochCoordinator(store, {"sink": stale})
            await first.recover()
            await first.run_epoch(0, [session.context.batch(epochs[0])], {})
            steps = _stale_steps(session, stale, epochs)
            refused = await _go_on(steps, schedule.paused_after)
            fresh = await session.open()
            coordinator = EpochCoordinator(store, {"sink": fresh})
            refused = await _alongside(coordinator.recover(), steps, refused)
            if schedule.resumes_after_recovery and not refused:
                refused = await _go_on(steps)
            for epoch in (1, 2):
                written = coordinator.run_epoch(epoch, [session.context.batch(epochs[epoch])], {})
                refused = await _alongside(written, steps, refused)
            if not refused:
                await _go_on(steps)
            await fresh.close()
            with contextlib.suppress(LaminarError):
                await stale.close()
            return _delivery_problems(session.visible(), [[ids] for ids in epochs], exactly_once)

        problems = session.run(scenario())
        figures.cases += 1
        figures.epochs += len(epochs)
        figures.restarts += 1
        assert not problems, (
            f"an old instance went on after a new one had recovered ({schedule.story}): a "
            f"reader of the destination sees {'; '.join(problems)}. The new instance must "
            "fence the old one (its calls then refuse); or a commit must refuse an epoch whose "
            "staged records are gone (a newer instance rolled them back), and check in the "
            "transaction that publishes an epoch that no instance committed it before — not "
            "by what the instance remembers from when it opened"
        )

    @check
    def test_delivery_survives_any_faults(self, conformance: Target, figures: Figures) -> None:
        """Random epochs and several faults at random points, through the coordinator."""

        @given(
            sizes=st.lists(st.lists(st.integers(0, 3), max_size=3), min_size=1, max_size=4),
            points=_fault_points(4, every_fault_point(0)),
        )
        def run(sizes: list[list[int]], points: list[FaultPoint]) -> None:
            self._check_run(conformance, figures, sizes, points)

        conformance.explore(run, conformance.profile.recovery_examples, figures)


async def _run_query(session: _Session, epochs: list[list[int]]) -> None:
    """Run ``epochs`` (ids each) as a new query: a new checkpoint location and state store."""
    target = session.target
    sink = await open_sink(target, session.properties, target.new_state_store())
    try:
        store = checkpoint_store(target.new_checkpoint_directory())
        coordinator = EpochCoordinator(store, {"sink": sink})
        await coordinator.recover()
        for epoch, ids in enumerate(epochs):
            await coordinator.run_epoch(epoch, [session.context.batch(ids)], {})
    finally:
        await sink.close()


def _require_distributed(target: Target, *, parallel: bool = False) -> None:
    """Skip, saying why, unless the sink offers a distributed commit and can be read back.

    :param parallel: for the check of parallel writes, which also stands for ``partitioned``.
    """
    session = _Session(target)

    async def offered() -> tuple[bool, bool]:
        sink = await session.open()
        try:
            readable = session.context.committed_ids() is not None
            return sink.as_distributed_commit() is not None, readable
        finally:
            await sink.close()

    offers, readable = session.run(offered())
    if not offers:
        if parallel and _capabilities(target).partitioned:
            skip(
                "capability",
                "partitioned is declared, but the sink does not offer as_distributed_commit(): "
                "the contract says how several writers of one epoch commit together only "
                "through that extension, so parallel writes are not checked",
            )
        skip("capability", "the sink does not offer as_distributed_commit()")
    if not readable:
        skip("read-back", _UNREADABLE)


class SinkDistributedCommitSuite(ConnectorSuite):
    """``as_distributed_commit()``: tasks' staged shares, committed together, exactly once."""

    role: ClassVar[ConnectorRole] = ConnectorRole.SINK

    @check
    def test_distributed_commit_state_machine(self, conformance: Target, figures: Figures) -> None:
        """Random stages, faults, commits, rollbacks, restarts and re-runs vs a model."""
        _require_distributed(conformance)

        class DistributedCommit(DistributedCommitMachine):
            def __init__(self) -> None:
                super().__init__(conformance, figures)

        # A third of the epoch-protocol schedules: every staging opens an instance of its own.
        examples = max(1, conformance.profile.machine_examples // 3)
        conformance.explore_machine(DistributedCommit, examples, figures)

    @pytest.mark.parametrize("point", every_distributed_fault_point(1), ids=str)
    @check
    def test_staged_delivery_survives_a_fault_at_each_point(
        self, conformance: Target, figures: Figures, point: FaultPoint
    ) -> None:
        """Three epochs staged by tasks, through the coordinator; one fault in epoch 1."""
        _require_distributed(conformance)
        _check_run(conformance, figures, [[2, 1], [2, 1], [3]], [point], staged=True)

    @check
    def test_staged_delivery_survives_any_faults(
        self, conformance: Target, figures: Figures
    ) -> None:
        """Random epochs of tasks, several faults at random points, through the coordinator."""
        _require_distributed(conformance)

        @given(
            sizes=st.lists(
                st.lists(st.integers(0, 3), min_size=1, max_size=3), min_size=1, max_size=4
            ),
            points=_fault_points(4, every_distributed_fault_point(0)),
        )
        def run(sizes: list[list[int]], points: list[FaultPoint]) -> None:
            _check_run(conformance, figures, sizes, points, staged=True)

        # Half the recovery cases: each task of each attempt opens an instance of its own.
        examples = max(1, conformance.profile.recovery_examples // 2)
        conformance.explore(run, examples, figures)

    @check
    def test_nothing_staged_is_visible_before_commit_aggregated(
        self, conformance: Target, figures: Figures
    ) -> None:
        """Staged shares stay invisible until ``commit_aggregated`` publishes them all."""
        _require_distributed(conformance)
        figures.cases += 1
        session = _Session(conformance)

        async def scenario() -> None:
            first = await session.stage(0, "run-0.epoch-0.task-0", [1, 2], [3])
            seen = session.visible()
            assert not seen, f"staged ids {sorted(seen.elements())} are visible before commit"
            second = await session.stage(0, "run-0.epoch-0.task-1", [4])
            seen = session.visible()
            assert not seen, f"staged ids {sorted(seen.elements())} are visible before commit"
            await session.commit_aggregated(0, [first, second])
            assert session.visible() == Counter([1, 2, 3, 4]), (
                "after commit_aggregated of two tasks (ids 1, 2, 3 and 4), a reader sees "
                f"{sorted(session.visible().elements())}"
            )
            figures.epochs += 1

        session.run(scenario())

    @check
    def test_only_the_named_attempts_are_published(
        self, conformance: Target, figures: Figures
    ) -> None:
        """Staging no descriptor names — failed attempts, a crashed run — is never published."""
        _require_distributed(conformance)
        figures.cases += 1
        figures.restarts += 1
        session = _Session(conformance)

        async def scenario() -> None:
            await session.stage(0, "run-0.epoch-0.task-0", [1])  # the run then crashed
            await session.stage(0, "run-1.epoch-0.task-0.attempt-0", [2, 3])  # reply lost
            retried = await session.stage(0, "run-1.epoch-0.task-0.attempt-1", [4, 5])
            other = await session.stage(0, "run-1.epoch-0.task-1.attempt-0", [6])
            await session.commit_aggregated(0, [other, retried])
            await session.stage(0, "run-1.epoch-0.task-1.attempt-1", [7])  # a zombie
            assert session.visible() == Counter([4, 5, 6]), (
                "epoch 0 committed with the descriptors of two attempts (ids 4, 5 and 6), "
                "after a crashed run staged id 1 and a failed attempt ids 2, 3, and before a "
                f"zombie attempt staged id 7: a reader sees {sorted(session.visible().elements())}"
            )
            figures.epochs += 1

        session.run(scenario())

    @check
    def test_commit_aggregated_again_after_a_restart_adds_nothing(
        self, conformance: Target, figures: Figures
    ) -> None:
        """Committing a committed epoch again, on new instances, in any order, does nothing."""
        _require_distributed(conformance)
        figures.cases += 1
        figures.restarts += 2
        session = _Session(conformance)

        async def scenario() -> None:
            zero = [
                await session.stage(0, "run-0.epoch-0.task-0", [1, 2]),
                await session.stage(0, "run-0.epoch-0.task-1", [3]),
            ]
            await session.commit_aggregated(0, zero)
            await session.commit_aggregated(0, zero[::-1])
            one = [await session.stage(1, "run-1.epoch-1.task-0", [4])]
            await session.commit_aggregated(1, one)
            await session.commit_aggregated(0, zero)
            await session.commit_aggregated(1, one)
            assert session.visible() == Counter([1, 2, 3, 4]), (
                "epochs 0 (ids 1, 2, 3) and 1 (id 4), each committed again after a restart: a "
                f"reader sees {sorted(session.visible().elements())}"
            )
            figures.epochs += 2

        session.run(scenario())

    @check
    def test_a_rolled_back_epoch_leaves_no_trace_of_any_task(
        self, conformance: Target, figures: Figures
    ) -> None:
        """``rollback_epoch`` on any instance discards every task's staging of the epoch."""
        _require_distributed(conformance)
        figures.cases += 1
        session = _Session(conformance)

        async def scenario() -> None:
            await session.stage(0, "run-0.epoch-0.task-0", [1])
            await session.stage(0, "run-0.epoch-0.task-1", [2, 3])
            await session.rollback_epoch(0)
            await session.rollback_epoch(0)
            again = await session.stage(0, "run-0.epoch-0.task-0.attempt-1", [4])
            await session.commit_aggregated(0, [again])
            assert session.visible() == Counter([4]), (
                "epoch 0 rolled back after two tasks staged ids 1, 2, 3, then staged again "
                f"(id 4) and committed: a reader sees {sorted(session.visible().elements())}"
            )
            figures.epochs += 1

        session.run(scenario())

    @check
    def test_a_task_with_no_records_stages_and_commits(
        self, conformance: Target, figures: Figures
    ) -> None:
        """A write task of an empty Spark partition hands ``stage`` no batch at all.

        Filters and shuffles leave partitions empty: the task still stages, and its
        descriptor is committed with the others'.
        """
        _require_distributed(conformance)
        figures.cases += 1
        session = _Session(conformance)

        async def scenario() -> None:
            empty = await session.stage(0, "run-0.epoch-0.task-0")
            full = await session.stage(0, "run-0.epoch-0.task-1", [1, 2])
            await session.commit_aggregated(0, [empty, full])
            assert session.visible() == Counter([1, 2]), (
                "epoch 0 staged by a task with no batch and a task with ids 1, 2, then "
                f"committed: a reader sees {sorted(session.visible().elements())}"
            )
            figures.epochs += 1

        session.run(scenario())

    @check
    def test_tasks_staged_in_parallel_are_committed_together(
        self, conformance: Target, figures: Figures
    ) -> None:
        """Four tasks stage one epoch at once, batches interleaved; one commit publishes all.

        This is also the check of ``partitioned``: writes of several partitions of one epoch
        in parallel.
        """
        _require_distributed(conformance, parallel=True)
        figures.cases += 1
        session = _Session(conformance)
        shares = [[[10 * task + n] for n in range(3)] for task in range(4)]

        async def scenario() -> None:
            descriptors = await asyncio.gather(
                *(
                    session.stage(0, f"run-0.epoch-0.task-{task}", *share)
                    for task, share in enumerate(shares)
                )
            )
            assert not session.visible(), "staged shares are visible before commit_aggregated"
            await session.commit_aggregated(0, descriptors)
            expected = Counter(record for share in shares for ids in share for record in ids)
            assert session.visible() == expected, (
                f"four tasks staged ids {sorted(expected)} at once, then one commit: a reader "
                f"sees {sorted(session.visible().elements())}"
            )
            figures.epochs += 1

        session.run(scenario())


class SinkNetworkSuite(ConnectorSuite):
    """Network faults between the sink and its destination, through a proxy."""

    role: ClassVar[ConnectorRole] = ConnectorRole.SINK

    @pytest.mark.parametrize("fault", NETWORK_FAULTS, ids=lambda fault: fault.name)
    @check
    def test_a_network_fault_ends_calls_cleanly_and_loses_nothing(
        self, conformance: Target, fault: NetworkFault
    ) -> None:
        """Three epochs through a proxy that turns ``fault`` on at a step of epoch 1.

        For contexts that name their connector's ``network_endpoint`` and give
        ``config_through(address)``. The fault starts before ``write_batch``,
        ``pre_commit`` or ``commit_epoch`` (one seeded step in ``quick``, each in ``full``) and
        stops when a call under it fails (latency and low bandwidth: after ``commit_epoch``
        too; a reset or blackhole that met no call with network I/O runs on into the next
        epoch). Latency and low bandwidth must only slow the calls down. Under resets and a
        blackhole, the call must end within the runtime's call timeout with a
        ``ConnectorError`` naming the address it connects to (transient for ``commit_epoch``
        and ``rollback_epoch``, which the runtime retries) — not hang, not wait for the
        runtime to cancel it. Then a new instance recovers and runs on: every id must be
        visible once (at least once for an at-least-once sink).
        """
        for step in faulted_steps(conformance, fault):
            _run_under_network_fault(conformance, fault, step)


_FAILURES_AFTER_A_NETWORK_FAULT = 3
"""Epochs that may fail from the fault on: the one it struck, and those that found a connection
it left broken (each fails once and its instance goes; the next opens a new connection)."""


def _run_under_network_fault(target: Target, fault: NetworkFault, step: ProtocolStep) -> None:
    session = _Session(target)
    proxy, config = proxied_config(session.context)
    session.properties = dict(config.properties)
    window = FaultWindow(proxy, fault, step, epoch=1)
    # Epoch 1's 2,000 records take a second through the low-bandwidth link.
    epochs = [[[0, 1]], [list(range(2, 2002))], [[2002, 2003]]]

    async def scenario() -> Counter[int]:
        store = checkpoint_store(target.new_checkpoint_directory())
        policy = RetryPolicy(call_timeout_s=NETWORK_CALL_TIMEOUT_S, attempts=1, backoff_s=0.0)
        epoch, failures = 0, 0
        while epoch < len(epochs):
            sink = WatchedSink(await session.open(), window)
            coordinator = EpochCoordinator(
                store, {"sink": sink}, policy=policy, observer=window.observe
            )
            try:
                await coordinator.recover()
                epoch = coordinator.next_epoch
                while epoch < len(epochs):
                    batches = [session.context.batch(ids) for ids in epochs[epoch]]
                    await coordinator.run_epoch(epoch, batches, {})
                    epoch += 1
            except Exception:
                failures += 1
                if failures > _FAILURES_AFTER_A_NETWORK_FAULT or not window.calls:
                    raise  # not the fault's doing: before it, or long after it cleared
            finally:
                with contextlib.suppress(Exception):
                    await sink.close()
        return session.visible()

    try:
        visible = judged(window, lambda: session.run(scenario()))
    finally:
        window.off()
        proxy.delete()
    problems = _delivery_problems(visible, epochs, _capabilities(target).exactly_once)
    assert not problems, (
        f"after {fault.name} ({fault.happens}) from {step.value} of epoch 1 on, and recovery: "
        + "; ".join(problems)
    )


class SinkSuite(
    SinkContractSuite,
    SinkEpochProtocolSuite,
    SinkRecoverySuite,
    SinkDistributedCommitSuite,
    SinkRuntimeSuite,
    SinkNetworkSuite,
):
    """Every sink check: contract, protocol, recovery, distributed commit, Spark, network."""
