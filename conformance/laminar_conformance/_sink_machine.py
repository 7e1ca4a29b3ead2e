"""The epoch protocol as a Hypothesis state machine, checked against a :class:`Ledger`.

Each rule is one thing the runtime does to a sink (begin, write, pre-commit, commit, roll
back, restart, re-deliver a committed epoch), with a fault injected around the call. The
runtime's reaction is the coordinator's: a failure before the commit decision rolls the epoch
back; after it, ``commit_epoch`` is called again; a crash abandons the instance and a new one
recovers (commits the decided epoch, rolls back the next one). After every rule the reader's
view of the destination must be what the sink's capabilities promise.
"""

from __future__ import annotations

import asyncio
import enum
from collections import Counter
from collections.abc import Awaitable, Callable

import pyarrow as pa
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from laminar_conformance._call_times import CALL_TIMES
from laminar_conformance._faults import Fault, InjectedFault, inject
from laminar_conformance._figures import Figures
from laminar_conformance._ledger import Attempt, AttemptStatus, Ledger
from laminar_conformance._suite import Target
from laminar_sdk import ForwardingSink, SinkConnector, StateStore, WriteResult
from laminar_sdk.faults import SimulatedCrash

FAULTS = st.sampled_from(
    [Fault.NONE] * 8
    + [Fault.ERROR_BEFORE, Fault.ERROR_AFTER] * 2
    + [Fault.CRASH_BEFORE, Fault.CRASH_AFTER]
)
"""No fault in most calls, an error in some, a crash in a few; shrinks towards none."""


class _Outcome(enum.Enum):
    OK = "ok"
    ERROR = "error"
    CRASH = "crash"


async def open_sink(
    target: Target, properties: dict[str, str], state_store: StateStore
) -> SinkConnector:
    """A new instance of the sink under test, opened through the registry.

    :param state_store: the destination's state store, as the Spark bridge gives one.
    """
    with CALL_TIMES.timing("the sink's open()"):
        sink, _ = await target.plugins.registry.open_sink(
            target.connector, properties, state_store=state_store
        )
    return TimedSink(sink)


class TimedSink(ForwardingSink):
    """An opened sink whose protocol calls are timed (see :mod:`._call_times`)."""

    async def begin_epoch(self, epoch: int) -> None:
        """``begin_epoch``, timed."""
        with CALL_TIMES.timing("begin_epoch"):
            await self.wrapped.begin_epoch(epoch)

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        """``write_batch``, timed."""
        with CALL_TIMES.timing("write_batch"):
            return await self.wrapped.write_batch(batch)

    async def pre_commit(self, epoch: int) -> None:
        """``pre_commit``, timed."""
        with CALL_TIMES.timing("pre_commit"):
            await self.wrapped.pre_commit(epoch)

    async def commit_epoch(self, epoch: int) -> None:
        """``commit_epoch``, timed."""
        with CALL_TIMES.timing("commit_epoch"):
            await self.wrapped.commit_epoch(epoch)

    async def rollback_epoch(self, epoch: int) -> None:
        """``rollback_epoch``, timed."""
        with CALL_TIMES.timing("rollback_epoch"):
            await self.wrapped.rollback_epoch(epoch)

    async def close(self) -> None:
        """``close``, timed."""
        with CALL_TIMES.timing("the sink's close()"):
            await self.wrapped.close()


class SinkProtocolMachine(RuleBasedStateMachine):
    """Drives one destination through epochs, faults, restarts and re-deliveries.

    :param target: the sink under test.
    :param figures: counters this case adds to.
    """

    def __init__(self, target: Target, figures: Figures) -> None:
        super().__init__()
        figures.cases += 1
        self._target = target
        self._figures = figures
        self._context = target.sink_context()
        self._properties = self._context.config().properties
        self._state = target.new_state_store()
        self._runner = asyncio.Runner()
        self._ledger = Ledger()
        self._attempt: Attempt | None = None
        self._records_total = 0
        self._commits_since_restart = 0
        self._sink = self._runner.run(open_sink(target, self._properties, self._state))
        self._capabilities = self._sink.capabilities()
        self._runner.run(self._sink.rollback_epoch(self._ledger.next_epoch))

    def teardown(self) -> None:
        """Close the current instance and the context."""
        try:
            self._runner.run(self._sink.close())
            self._context.close()
        finally:
            self._runner.close()

    # Rules ---------------------------------------------------------------------------------

    @initialize(batches=st.lists(st.integers(1, 4), max_size=3))
    def commit_a_clean_epoch_first(self, batches: list[int]) -> None:
        """Write ``batches`` in an epoch and commit it, without faults (no epoch when empty).

        Most schedules then start from committed records, so that a sink losing records of
        the plainest epoch is caught within the first cases, whatever the rest draws; an
        empty list keeps the first epoch's faults explored.
        """
        if not batches:
            return
        self.begin_epoch(Fault.NONE)
        for count in batches:
            self.write_batch(count, Fault.NONE)
        self.pre_commit(Fault.NONE)
        self.commit_epoch(Fault.NONE)

    @precondition(lambda self: self._attempt is None)
    @rule(fault=FAULTS)
    def begin_epoch(self, fault: Fault) -> None:
        """Begin the next epoch (the one after the newest committed)."""
        attempt = self._attempt = self._ledger.begin(self._ledger.next_epoch)
        outcome = self._call("begin_epoch", fault, lambda: self._sink.begin_epoch(attempt.epoch))
        self._react_before_decision(outcome)

    @precondition(
        lambda self: self._attempt is not None and self._attempt.status is AttemptStatus.WRITING
    )
    @rule(count=st.integers(0, 4), fault=FAULTS)
    def write_batch(self, count: int, fault: Fault) -> None:
        """Write ``count`` new records in the open epoch."""
        assert self._attempt is not None
        batch = self._context.batch(self._ledger.fresh_ids(self._attempt, count))
        outcome = self._call("write_batch", fault, lambda: self._sink.write_batch(batch))
        self._react_before_decision(outcome)

    @precondition(
        lambda self: self._attempt is not None and self._attempt.status is AttemptStatus.WRITING
    )
    @rule(fault=FAULTS)
    def pre_commit(self, fault: Fault) -> None:
        """Pre-commit the open epoch."""
        attempt = self._attempt
        assert attempt is not None
        outcome = self._call("pre_commit", fault, lambda: self._sink.pre_commit(attempt.epoch))
        if outcome is _Outcome.OK:
            attempt.status = AttemptStatus.PRE_COMMITTED
        self._react_before_decision(outcome)

    @precondition(
        lambda self: (
            self._attempt is not None and self._attempt.status is AttemptStatus.PRE_COMMITTED
        )
    )
    @rule(fault=FAULTS)
    def commit_epoch(self, fault: Fault) -> None:
        """Record the decision durably (as the runtime's manifest does), then commit."""
        attempt = self._attempt
        assert attempt is not None
        attempt.status = AttemptStatus.DECIDED
        outcome = self._call("commit_epoch", fault, lambda: self._sink.commit_epoch(attempt.epoch))
        if outcome is _Outcome.CRASH:
            self._restart(clean=False)
            return
        if outcome is _Outcome.ERROR:
            self._runner.run(self._sink.commit_epoch(attempt.epoch))
        self._committed(attempt)

    @precondition(
        lambda self: (
            self._attempt is not None
            and self._attempt.status in (AttemptStatus.WRITING, AttemptStatus.PRE_COMMITTED)
        )
    )
    @rule(fault=FAULTS)
    def rollback_epoch(self, fault: Fault) -> None:
        """Roll the open, undecided epoch back."""
        attempt = self._attempt
        assert attempt is not None
        outcome = self._call(
            "rollback_epoch", fault, lambda: self._sink.rollback_epoch(attempt.epoch)
        )
        if outcome is _Outcome.CRASH:
            self._restart(clean=False)
            return
        if outcome is _Outcome.ERROR:
            self._runner.run(self._sink.rollback_epoch(attempt.epoch))
        self._rolled_back(attempt)

    @precondition(lambda self: self._attempt is None and self._commits_since_restart > 0)
    @rule(clean=st.booleans())
    def restart(self, clean: bool) -> None:
        """After an epoch, close the instance (or let it die) and recover on a new one.

        Restarts with an epoch open come from the crashes injected into the calls.
        """
        self._restart(clean=clean)

    @precondition(lambda self: self._attempt is None and self._commits_since_restart > 0)
    @rule(data=st.data())
    def redeliver_committed_epoch(self, data: st.DataObject) -> None:
        """After a crash, hand a new instance an epoch it committed before, as Spark does."""
        epoch = data.draw(st.sampled_from(sorted(self._ledger.committed)), label="epoch")
        self._restart(clean=False)
        before = self._visible()
        ids = self._ledger.committed[epoch]
        self._runner.run(self._sink.begin_epoch(epoch))
        self._runner.run(self._sink.write_batch(self._context.batch(ids)))
        self._runner.run(self._sink.pre_commit(epoch))
        self._runner.run(self._sink.commit_epoch(epoch))
        after = self._visible()
        if self._capabilities.idempotent and before is not None and after is not None:
            grown = [record for record in ids if after[record] > before[record]]
            assert not grown, (
                f"the sink declares idempotent, but writing committed epoch {epoch} again "
                f"duplicated ids {grown[:8]}"
            )

    # Invariants ----------------------------------------------------------------------------

    @invariant()
    def destination_matches_the_model(self) -> None:
        """What a reader sees is what the capabilities promise."""
        with CALL_TIMES.timing("the test context's committed_ids()"):
            visible = self._context.committed_ids()
        if visible is None:
            return
        problems = self._ledger.problems(visible, self._capabilities)
        claims = ", ".join(self._capabilities.names()) or "at-least-once"
        assert not problems, f"sink {self._target.connector!r} ({claims}): " + "; ".join(problems)

    @invariant()
    def metrics_are_sane(self) -> None:
        """Counters are never negative, and ``records_total`` never decreases."""
        metrics = self._sink.metrics()
        counters = {
            "records_total": metrics.records_total,
            "bytes_total": metrics.bytes_total,
            "errors_total": metrics.errors_total,
            "lag": metrics.lag,
        }
        negative = {name: value for name, value in counters.items() if value < 0}
        assert not negative, f"negative metrics: {negative}"
        assert metrics.records_total >= self._records_total, (
            f"records_total went down from {self._records_total} to {metrics.records_total}"
        )
        self._records_total = metrics.records_total

    # The runtime's side --------------------------------------------------------------------

    def _call(self, where: str, fault: Fault, call: Callable[[], Awaitable[object]]) -> _Outcome:
        assert self._attempt is not None
        if fault is not Fault.NONE:
            self._figures.faults += 1
        try:
            self._runner.run(inject(fault, where, self._attempt.epoch, call))
        except SimulatedCrash:
            return _Outcome.CRASH
        except InjectedFault:
            return _Outcome.ERROR
        return _Outcome.OK

    def _react_before_decision(self, outcome: _Outcome) -> None:
        attempt = self._attempt
        assert attempt is not None
        if outcome is _Outcome.CRASH:
            self._restart(clean=False)
        elif outcome is _Outcome.ERROR:
            self._runner.run(self._sink.rollback_epoch(attempt.epoch))
            self._rolled_back(attempt)

    def _restart(self, *, clean: bool) -> None:
        if clean:
            self._runner.run(self._sink.close())
        self._sink = self._runner.run(open_sink(self._target, self._properties, self._state))
        self._records_total = 0
        self._commits_since_restart = 0
        self._figures.restarts += 1
        attempt = self._attempt
        if attempt is not None and attempt.status is AttemptStatus.DECIDED:
            self._runner.run(self._sink.commit_epoch(attempt.epoch))
            self._committed(attempt)
        elif attempt is not None:
            self._rolled_back(attempt)
        self._runner.run(self._sink.rollback_epoch(self._ledger.next_epoch))

    def _committed(self, attempt: Attempt) -> None:
        self._ledger.commit(attempt.epoch, [attempt])
        self._attempt = None
        self._commits_since_restart += 1
        self._figures.epochs += 1

    def _rolled_back(self, attempt: Attempt) -> None:
        self._ledger.roll_back(attempt)
        self._attempt = None

    def _visible(self) -> Counter[int] | None:
        visible = self._context.committed_ids()
        return None if visible is None else Counter(visible)
