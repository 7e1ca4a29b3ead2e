"""The distributed commit of a ``DistributedCommitSink`` as a state machine, against a Ledger.

Each rule is one thing Spark and the runtime do to such a sink: a write task stages its share
of the open epoch on an instance of its own — a fault may hit before the call, inside it (the
task dies after handing over its first batch) or after it (the reply is lost); the task is
then retried as a new attempt under a new name — the runtime records the descriptors of the
attempts that succeeded and commits them together, or rolls the epoch back; the driver crashes
and recovers (rolling the next epoch back, or leaving a crashed run's staging behind); a
committed epoch is committed again after a restart; Spark re-runs the tasks of a committed
micro-batch, whose commit the runtime then skips. After every rule a reader must see exactly
the records of the committed epochs' named attempts, once: nothing staged before its commit,
nothing of an abandoned or rolled-back attempt, ever.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import pyarrow as pa
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from laminar_conformance._call_times import CALL_TIMES
from laminar_conformance._faults import Fault, InjectedFault, inject
from laminar_conformance._figures import Figures
from laminar_conformance._ledger import Attempt, AttemptStatus, Ledger
from laminar_conformance._sink_machine import FAULTS, open_sink
from laminar_conformance._suite import Target
from laminar_sdk import DistributedCommitSink, SinkConnector, SinkConnectorCapabilities
from laminar_sdk.faults import SimulatedCrash

PROMISED = SinkConnectorCapabilities(exactly_once=True, two_phase_commit=True)
"""What every distributed-commit sink promises of its staged output, whatever it declares."""


def distributed(sink: SinkConnector, instance: str) -> DistributedCommitSink:
    """``sink.as_distributed_commit()``, which must not be ``None`` on ``instance``."""
    offered = sink.as_distributed_commit()
    assert offered is not None, (
        f"as_distributed_commit() returned None on {instance}, though the sink offers it: "
        "offer it on every opened instance"
    )
    return offered


class TaskBatches:
    """The batches a write task hands to ``stage``; ``fault`` strikes after the first one.

    Control passes to the event loop between batches, so tasks staged at once interleave.

    :param batches: the task's share of the epoch.
    :param fault: what happens after the first batch (a task dying mid-write).
    :param epoch: the epoch, for messages.
    """

    def __init__(self, batches: Sequence[pa.RecordBatch], fault: Fault, epoch: int) -> None:
        self._batches = batches
        self._fault = fault
        self._epoch = epoch
        self.struck = False
        """Whether the fault struck."""

    def __aiter__(self) -> AsyncIterator[pa.RecordBatch]:
        """The batches, one by one.

        :raises SimulatedCrash: after the first batch, for a crash.
        :raises InjectedFault: after the first batch, for an error.
        """
        return self._stream()

    async def _stream(self) -> AsyncIterator[pa.RecordBatch]:
        for number, batch in enumerate(self._batches):
            if number == 1 and self._fault is not Fault.NONE:
                self.struck = True
                where = "stage, after its first batch,"
                await inject(self._fault, where, self._epoch, lambda: asyncio.sleep(0))
            yield batch
            await asyncio.sleep(0)


def split(ids: list[int], parts: int) -> list[list[int]]:
    """``ids`` in ``parts`` consecutive slices (some may be empty)."""
    size = -(-len(ids) // parts) if ids else 0
    return [ids[size * part : size * (part + 1)] for part in range(parts)]


class _Outcome(enum.Enum):
    OK = "ok"
    ERROR = "error"
    CRASH = "crash"


class DistributedCommitMachine(RuleBasedStateMachine):
    """Drives one destination through staged epochs, faults, restarts and re-runs.

    :param target: the sink under test, which offers ``as_distributed_commit()``.
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
        self._ledger = Ledger(commit_call="commit_aggregated")
        self._run = 0
        self._tasks = itertools.count()
        self._attempts: list[Attempt] = []
        """Every attempt at the open epoch (the one after the newest committed)."""
        self._staged: dict[str, tuple[Attempt, str]] = {}
        """The open epoch's attempts that returned a descriptor, with it, by task."""
        self._descriptors: dict[int, list[str]] = {}
        self._driver = self._runner.run(open_sink(target, self._properties, self._state))
        self._runner.run(self._driver.rollback_epoch(self._ledger.next_epoch))

    def teardown(self) -> None:
        """Close the driver's instance and the context."""
        try:
            self._runner.run(self._driver.close())
            self._context.close()
        finally:
            self._runner.close()

    # Rules ---------------------------------------------------------------------------------

    @rule(count=st.integers(0, 5), parts=st.integers(1, 3), fault=FAULTS, inside=FAULTS)
    def stage(self, count: int, parts: int, fault: Fault, inside: Fault) -> None:
        """A write task stages ``count`` new records of the open epoch, in ``parts`` batches."""
        epoch = self._ledger.next_epoch
        attempt = self._attempt(epoch)
        self._attempts.append(attempt)
        descriptor = self._stage(attempt, count, parts, fault, inside)
        if descriptor is not None:
            assert attempt.task is not None
            attempt.status = AttemptStatus.PRE_COMMITTED
            self._staged[attempt.task] = (attempt, descriptor)

    @precondition(lambda self: bool(self._staged))
    @rule(on_driver=st.booleans(), fault=FAULTS, data=st.data())
    def commit_aggregated(self, on_driver: bool, fault: Fault, data: st.DataObject) -> None:
        """Record the staged attempts' descriptors (the decision), then commit them together.

        The descriptors come in any order; attempts that failed are not named.
        """
        epoch = self._ledger.next_epoch
        order = data.draw(st.permutations(sorted(self._staged)), label="tasks named, in order")
        named = [self._staged[task] for task in order]
        descriptors = [descriptor for _, descriptor in named]
        for attempt in self._attempts:
            if attempt.status is AttemptStatus.PRE_COMMITTED:
                attempt.status = AttemptStatus.DECIDED
        outcome = self._call(
            "commit_aggregated", fault, epoch, lambda: self._commit(epoch, descriptors, on_driver)
        )
        if outcome is _Outcome.CRASH:
            self._restart(clean=False, roll_back=False, recommit=(epoch, descriptors))
        elif outcome is _Outcome.ERROR:
            self._runner.run(self._commit(epoch, descriptors, on_driver))
        self._ledger.commit(epoch, [attempt for attempt, _ in named])
        self._descriptors[epoch] = descriptors
        self._give_up(AttemptStatus.ABANDONED)
        self._figures.epochs += 1

    @precondition(lambda self: bool(self._attempts))
    @rule(fault=FAULTS)
    def rollback_epoch(self, fault: Fault) -> None:
        """Roll the open, undecided epoch back: everything staged for it, by any task."""
        epoch = self._ledger.next_epoch
        outcome = self._call(
            "rollback_epoch", fault, epoch, lambda: self._driver.rollback_epoch(epoch)
        )
        if outcome is _Outcome.CRASH:
            self._restart(clean=False, roll_back=True)
            return
        if outcome is _Outcome.ERROR:
            self._runner.run(self._driver.rollback_epoch(epoch))
        self._give_up(AttemptStatus.ROLLED_BACK)

    @precondition(lambda self: bool(self._attempts or self._descriptors))
    @rule(clean=st.booleans(), roll_back=st.booleans())
    def restart(self, clean: bool, roll_back: bool) -> None:
        """The driver stops (or dies) and a new run recovers.

        Recovery rolls the open epoch back, or — as when a zombie task stages after the
        rollback — leaves the crashed run's staging for ``commit_aggregated`` to ignore.
        """
        self._restart(clean=clean, roll_back=roll_back)

    @precondition(lambda self: bool(self._descriptors))
    @rule(data=st.data())
    def commit_a_committed_epoch_again(self, data: st.DataObject) -> None:
        """After a crash inside ``commit_aggregated``, recovery commits the epoch again."""
        epoch = data.draw(st.sampled_from(sorted(self._descriptors)), label="epoch")
        self._restart(clean=False, roll_back=True)
        descriptors = data.draw(st.permutations(self._descriptors[epoch]), label="in order")
        self._runner.run(self._commit(epoch, descriptors, on_driver=True))

    @precondition(lambda self: bool(self._descriptors))
    @rule(count=st.integers(1, 4), data=st.data())
    def rerun_a_task_of_a_committed_epoch(self, count: int, data: st.DataObject) -> None:
        """Spark re-runs a committed micro-batch; the runtime skips its commit."""
        epoch = data.draw(st.sampled_from(sorted(self._descriptors)), label="epoch")
        attempt = self._attempt(epoch)
        self._stage(attempt, count, 1, Fault.NONE, Fault.NONE)
        attempt.status = AttemptStatus.ABANDONED

    # Invariants ----------------------------------------------------------------------------

    @invariant()
    def destination_matches_the_model(self) -> None:
        """A reader sees exactly the committed epochs' named attempts, once."""
        with CALL_TIMES.timing("the test context's committed_ids()"):
            visible = self._context.committed_ids()
        if visible is None:
            return
        problems = self._ledger.problems(visible, PROMISED)
        assert not problems, f"distributed-commit sink {self._target.connector!r}: " + "; ".join(
            problems
        )

    # The runtime's side --------------------------------------------------------------------

    def _attempt(self, epoch: int) -> Attempt:
        task = f"run-{self._run}.epoch-{epoch}.attempt-{next(self._tasks)}"
        return self._ledger.begin(epoch, task)

    def _stage(
        self, attempt: Attempt, count: int, parts: int, fault: Fault, inside: Fault
    ) -> str | None:
        """Stage ``attempt`` on a new instance; its descriptor, or ``None`` when it failed."""
        assert attempt.task is not None
        task = attempt.task
        ids = self._ledger.fresh_ids(attempt, count)
        batches = [self._context.batch(chunk) for chunk in split(ids, parts)]
        if inside is not Fault.NONE and len(batches) > 1:
            self._figures.faults += 1
        else:
            inside = Fault.NONE
        descriptors: list[str] = []

        async def call() -> None:
            sink = await open_sink(self._target, self._properties, self._state)
            stream = TaskBatches(batches, inside, attempt.epoch)
            try:
                staging = distributed(sink, "an instance opened in a write task")
                descriptors.append(await staging.stage(attempt.epoch, task, stream))
            except Exception:
                if not stream.struck:
                    raise
                # The task died mid-stream, however the sink reports it.
                raise InjectedFault(f"write task {task} died after its first batch") from None
            await sink.close()

        outcome = self._call("stage", fault, attempt.epoch, call)
        if outcome is _Outcome.CRASH:
            self._restart(clean=False, roll_back=True)
            return None
        if outcome is _Outcome.ERROR:
            attempt.status = AttemptStatus.ABANDONED
            return None
        (descriptor,) = descriptors
        assert isinstance(descriptor, str), (
            f"stage() returned {descriptor!r}, not a descriptor (str) naming the staged output"
        )
        return descriptor

    async def _commit(self, epoch: int, descriptors: Sequence[str], on_driver: bool) -> None:
        if on_driver:
            await distributed(self._driver, "the driver's instance").commit_aggregated(
                epoch, descriptors
            )
            return
        sink = await open_sink(self._target, self._properties, self._state)
        await distributed(sink, "a new instance").commit_aggregated(epoch, descriptors)
        await sink.close()

    def _call(
        self, where: str, fault: Fault, epoch: int, call: Callable[[], Awaitable[object]]
    ) -> _Outcome:
        if fault is not Fault.NONE:
            self._figures.faults += 1
        try:
            self._runner.run(inject(fault, where, epoch, call))
        except SimulatedCrash:
            return _Outcome.CRASH
        except InjectedFault:
            return _Outcome.ERROR
        return _Outcome.OK

    def _give_up(self, status: AttemptStatus) -> None:
        """End the open epoch's attempts that are not committed with ``status``."""
        for attempt in self._attempts:
            if attempt.status is not AttemptStatus.COMMITTED:
                attempt.status = status
        self._attempts = []
        self._staged = {}

    def _restart(
        self, *, clean: bool, roll_back: bool, recommit: tuple[int, list[str]] | None = None
    ) -> None:
        """A new run: a new driver's instance, and recovery.

        Recovery commits ``recommit`` (an epoch and its descriptors) when the decision was
        taken; otherwise it rolls the open epoch back (``roll_back``) or leaves its staging.
        """
        if clean:
            self._runner.run(self._driver.close())
        self._run += 1
        self._figures.restarts += 1
        self._driver = self._runner.run(open_sink(self._target, self._properties, self._state))
        if recommit is not None:
            self._runner.run(self._commit(*recommit, on_driver=True))
            return
        if roll_back:
            self._runner.run(self._driver.rollback_epoch(self._ledger.next_epoch))
        self._give_up(AttemptStatus.ROLLED_BACK if roll_back else AttemptStatus.ABANDONED)
