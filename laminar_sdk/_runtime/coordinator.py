"""The epoch coordinator: two-phase commit of sinks, with a durable record of every epoch.

For each epoch: ``begin_epoch`` → ``write_batch``… → ``pre_commit`` on every sink → the
checkpoint manifest with every sink *pending* is saved and the latest pointer moved to it (the
commit decision: from here on the epoch is committed, whatever happens) → ``commit_epoch`` on
every sink → the manifest is saved again with the sinks *committed*. A failure before the
latest pointer names the manifest rolls the epoch back on every sink.

A sink whose write tasks stage an epoch in parallel (a :class:`DistributedCommitSink`) takes
another path, in two parts: :func:`stage_task` runs in each write task and returns the task's
commit descriptor; :meth:`EpochCoordinator.commit_staged` runs once with the descriptors of the
tasks that succeeded, records them in the manifest with the sink *pending* (the decision, as
above) and then publishes them with ``commit_aggregated``.

Recovery reads the newest valid manifest: sinks still pending there are committed (the
decision was taken) — with the recorded descriptors for a distributed sink — and every sink
rolls back the epoch after it, which may have been pre-committed (or staged) but never decided.
An epoch at or before the manifest's is never written again.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import time
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass

import pyarrow as pa

from laminar_sdk._checkpointing.checkpointer import Checkpointer
from laminar_sdk._checkpointing.errors import CheckpointStoreError
from laminar_sdk._checkpointing.ids import checkpoint_of
from laminar_sdk._checkpointing.manifest import CheckpointManifest, SinkEpochStatus
from laminar_sdk._checkpointing.recovery import load_latest_valid, search_latest_valid
from laminar_sdk._contract.checkpoint import SourceCheckpoint
from laminar_sdk._contract.connector import SinkConnector
from laminar_sdk._contract.errors import (
    CheckpointError,
    ConnectorError,
    InvalidState,
    LaminarError,
    SchemaMismatch,
    Timeout,
)
from laminar_sdk._contract.parallel import DistributedCommitSink

logger = logging.getLogger("laminar_sdk.runtime")


class ProtocolStep(enum.Enum):
    """The points of the epoch protocol where the coordinator hands control to an observer.

    The numbers are those of the crash points docs/epoch-protocol.md lists that fall between
    two calls; crash points inside a sink call (3, 6) are reached by the sink itself.
    """

    WRITE = "write"
    """Before each ``write_batch`` (crash point 1); in a write task, before each batch it
    hands to ``stage``."""
    PRE_COMMIT = "pre-commit"
    """After the last write, before ``pre_commit`` (crash point 2); in a write task, after
    ``stage`` took the last batch, before it returns."""
    MANIFEST = "manifest"
    """After ``pre_commit`` (or every task's ``stage``), before the manifest is durable
    (crash point 4)."""
    COMMIT = "commit"
    """After the manifest is durable, before ``commit_epoch`` / ``commit_aggregated`` (crash
    point 5)."""
    COMMITTED_MANIFEST = "committed-manifest"
    """After ``commit_epoch`` / ``commit_aggregated``, before the manifest says committed
    (crash point 7)."""
    DONE = "done"
    """After the manifest says committed (crash point 8: the engine may re-deliver)."""


class SimulatedCrash(BaseException):
    """Raised by a fault injector to stop the runtime as a killed process would stop.

    Nothing catches it: no rollback, no close, no clean-up runs, so recovery has to deal with
    whatever was left, exactly as after ``kill -9``. Every other exception (including
    ``KeyboardInterrupt``) rolls the open epoch back.
    """


StepObserver = Callable[[ProtocolStep, int], None]
"""Called with each step and its epoch; raising from it fails the epoch right there (the
conformance kit injects faults and process kills through it)."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Time bounds and retries of connector calls.

    Every call is bounded by ``call_timeout_s``. The calls the contract makes idempotent
    (``commit_epoch``, ``rollback_epoch``) are retried up to ``attempts`` times when they fail
    with a transient error, waiting ``backoff_s``, doubling up to ``max_backoff_s``. A failed
    ``begin_epoch``, ``write_batch`` or ``pre_commit`` fails the whole epoch instead, which is
    rolled back: retrying one alone could begin an epoch twice or write a batch twice.
    """

    call_timeout_s: float = 60.0
    attempts: int = 5
    backoff_s: float = 0.05
    max_backoff_s: float = 2.0


@dataclass(frozen=True, slots=True)
class EpochResult:
    """What one epoch did.

    :param rows: rows written to each sink.
    :param skipped: whether it was a re-delivery of a committed epoch, and so not written.
    :param commit_latency_s: how long the commit phase (manifest and ``commit_epoch``) took.
    """

    epoch: int
    rows: int
    skipped: bool
    commit_latency_s: float


class EpochCoordinator:
    """Drives sinks through epochs with two-phase commit and recovers after a crash.

    :param checkpointer: where the manifest of every epoch is kept.
    :param sinks: the sinks, opened, by the name recorded in manifests.
    :param policy: call timeouts and retries.
    :param observer: called at each :class:`ProtocolStep`, for fault injection and tracing.
    :param query_id: the engine's id of the streaming query whose epochs these are (Spark's
        query id), recorded in every manifest and checked by :meth:`recover`; ``None`` when
        the engine has none.
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        sinks: Mapping[str, SinkConnector],
        *,
        policy: RetryPolicy | None = None,
        observer: StepObserver | None = None,
        query_id: str | None = None,
    ) -> None:
        if not sinks:
            raise InvalidState("at least one sink", "no sinks")
        self._checkpointer = checkpointer
        self._sinks = dict(sinks)
        self._policy = policy or RetryPolicy()
        self._observer = observer or _ignore
        self._query_id = query_id
        self._last: CheckpointManifest | None = None
        self._engine_committed: int | None = None
        self._recovered = False

    @property
    def last_manifest(self) -> CheckpointManifest | None:
        """The manifest of the newest committed epoch, or ``None`` before the first."""
        return self._last

    @property
    def next_epoch(self) -> int:
        """The epoch after the newest committed one (0 when none was)."""
        return self._committed_through() + 1

    def is_committed(self, epoch: int) -> bool:
        """Whether ``epoch`` was already committed (a re-delivery must be skipped)."""
        return epoch <= self._committed_through()

    def _committed_through(self) -> int:
        """The newest committed epoch, by the manifests or the engine's proof; -1 for none."""
        recorded = -1 if self._last is None else self._last.epoch
        return max(recorded, -1 if self._engine_committed is None else self._engine_committed)

    async def recover(
        self, *, roll_back_next: bool = True, engine_epoch: int | None = None
    ) -> CheckpointManifest | None:
        """Bring the sinks to the newest valid checkpoint; call once, before any epoch.

        Sinks pending in that checkpoint are committed; the epoch after it is rolled back on
        every sink. Returns the checkpoint's manifest, whose ``source_offsets`` tell sources
        where to resume, or ``None`` when there is none.

        :param roll_back_next: ``False`` leaves the epoch after the checkpoint alone: pass it
            right before :meth:`commit_staged` of that epoch, whose write tasks have staged it
            already (``commit_aggregated`` discards whatever other staging of it there is).
        :param engine_epoch: the epoch the engine runs next — Spark's batch id, which it runs
            only once its own commit log holds every batch before it. That proof stands in
            for newest manifests that are unreadable or missing (a torn write, a bad disk
            block): recovery then goes on from ``engine_epoch``, rolled back on every sink and
            written again (an exactly-once sink skips an epoch it committed before). When the
            manifests and the engine disagree otherwise — one of the two locations deleted,
            or restored from an older backup — recovery stops before touching anything.
        :raises CheckpointError: when checkpoints exist but none is valid and nothing proves
            what was committed, when they belong to another query than ``query_id``, when
            they disagree with ``engine_epoch``, or when there are none but a sink's
            destination records committed epochs (:meth:`SinkConnector.last_committed_epoch`:
            the sink would skip this query's epochs); nothing is touched then but the rollback
            of the next epoch's staging. Each names the files and what repairs the location.
        """
        search = await search_latest_valid(self._checkpointer)
        manifest = None if search.recovered is None else search.recovered.manifest
        if manifest is not None:
            self._check_query(manifest)
        elif not search.skipped and not engine_epoch:
            await self._refuse_a_destination_ahead()
        if engine_epoch is not None:
            self._engine_committed = self._reconcile(manifest, search.skipped, engine_epoch)
        elif manifest is None and search.skipped:
            await load_latest_valid(self._checkpointer, on_skip=_ignore_skip)  # raises for them
        if manifest is not None:
            manifest = await self._finish_commit(manifest)
        self._last = manifest
        self._recovered = True
        if roll_back_next:
            await self._rollback_all(self.next_epoch)
        if manifest is not None:
            logger.info(
                "recovered at epoch %d (checkpoint %s)", manifest.epoch, manifest.checkpoint_id
            )
        return manifest

    async def _refuse_a_destination_ahead(self) -> None:
        """Raise when a sink records committed epochs but the checkpoints hold none.

        The query numbers its epochs from 0, and the sink would skip those it finds committed:
        an earlier query's, with the same sink identity. The next epoch's staging (write
        tasks of a distributed commit) is rolled back first, so that nothing is left behind.
        """
        for name, sink in self._sinks.items():
            committed = await sink.last_committed_epoch()
            if committed is None or committed < 0:
                continue
            await self._rollback_all(0)
            raise destination_ahead(self._checkpointer.location, name, committed, self._query_id)

    def _reconcile(
        self,
        manifest: CheckpointManifest | None,
        skipped: Sequence[CheckpointError],
        engine_epoch: int,
    ) -> int | None:
        """The newest epoch only the engine proves committed (``None``: none), or raise.

        :param skipped: why completed checkpoints newer than ``manifest`` (or the latest
            pointer) could not be loaded.
        """
        location = self._checkpointer.location
        recorded = -1 if manifest is None else manifest.epoch
        lost = sorted(
            {
                error.path
                for error in skipped
                if isinstance(error, CheckpointStoreError)
                and error.path != self._checkpointer.latest_path()
            }
        )
        if recorded > engine_epoch or (lost and recorded >= engine_epoch):
            raise CheckpointError(
                f"Spark's checkpoint is older than the laminar checkpoint location {location}: "
                f"Spark runs micro-batch {engine_epoch}, but later epochs were committed "
                f"(up to {recorded}{' and beyond, in ' + ', '.join(lost) if lost else ''}). "
                "Was Spark's checkpointLocation restored from an older backup, or replaced? Its "
                "micro-batches would be planned anew and skipped as committed, and their "
                "records lost. Restore Spark's checkpointLocation and the laminar location from "
                "the same moment, or delete both to start over"
            )
        proof = f"Spark's commit log holds every micro-batch before {engine_epoch}"
        if lost and engine_epoch == 0:
            ids = " ".join(sorted({str(checkpoint_of(path)) for path in lost}))
            raise CheckpointError(
                f"the newest checkpoints at {location} are unreadable or missing "
                f"({', '.join(lost)}), and nothing proves what they held: Spark runs "
                "micro-batch 0, so its commit log proves nothing yet, and they may belong to "
                "an earlier query whose Spark checkpointLocation was deleted. If they belong to "
                f"this query, set them aside with `laminar checkpoints quarantine {location} "
                f"{ids}` and restart (epoch 0 is written again, or, when the sink records it as "
                "committed, the restart says how to record that); for a new query, point "
                "laminar.checkpoint.location at a new location"
            )
        if lost:
            logger.warning(
                "the newest checkpoints at %s are unreadable or missing (%s); %s, which proves "
                "what was committed: going on with epoch %d, rolled back and written again (an "
                "exactly-once sink skips it if it was committed). Restore the bad files from a "
                "backup or set them aside with `laminar checkpoints quarantine %s ID...` when "
                "convenient. %s",
                location,
                ", ".join(lost),
                proof,
                engine_epoch,
                location,
                "; ".join(str(error) for error in skipped),
            )
            return engine_epoch - 1 if engine_epoch > recorded + 1 else None
        if engine_epoch <= recorded + 1:
            return None  # the manifests and the engine agree
        newest = "holds no checkpoint" if manifest is None else f"ends at epoch {recorded}"
        raise CheckpointError(
            f"the laminar checkpoint location {location} {newest}, but {proof}: the location "
            "was deleted, changed or restored from an older backup while Spark's "
            "checkpointLocation was kept, and no corrupted checkpoint explains it. If the sink "
            "holds those micro-batches (only the laminar location was lost), record that with "
            f"`laminar checkpoints mark-committed {location} --epoch {engine_epoch - 1}"
            f"{' --query-id ' + self._query_id if self._query_id else ''}` and restart; "
            "otherwise delete Spark's checkpointLocation as well, to start over"
        )

    async def run_epoch(
        self,
        epoch: int,
        batches: Iterable[pa.RecordBatch] | AsyncIterable[pa.RecordBatch],
        source_offsets: Mapping[str, SourceCheckpoint]
        | Callable[[], Mapping[str, SourceCheckpoint]],
    ) -> EpochResult:
        """Write ``batches`` to every sink as ``epoch`` and commit it, exactly once.

        An epoch that is already committed is skipped without a call to any sink.

        :param source_offsets: where each source resumes *after* this epoch (or a callable
            that says so once the batches are consumed), recorded in the manifest.
        :raises LaminarError: when the epoch fails before its commit decision; it was rolled
            back on every sink and may be run again.
        """
        if self._skips(epoch):
            return EpochResult(epoch, 0, skipped=True, commit_latency_s=0.0)
        try:
            rows = await self._write_and_prepare(epoch, batches)
            offsets = source_offsets() if callable(source_offsets) else source_offsets
            manifest = self._pending_manifest(epoch, offsets, {})
        except SimulatedCrash:
            raise
        except BaseException:
            await self._rollback_all(epoch)
            raise
        return await self._decide_and_commit(manifest, rows)

    async def commit_staged(
        self,
        epoch: int,
        descriptors: Mapping[str, Sequence[str]],
        *,
        rows: int = 0,
        source_offsets: Mapping[str, SourceCheckpoint] | None = None,
    ) -> EpochResult:
        """Commit ``epoch``, which write tasks staged with :func:`stage_task`, exactly once.

        Records ``descriptors`` in the epoch's manifest with the sinks pending (the commit
        decision), then calls each sink's ``commit_aggregated`` with its descriptors. An
        epoch that is already committed is skipped without a call to any sink. Run
        :meth:`recover` with ``roll_back_next=False`` first: rolling the epoch back would
        discard the staging about to be committed.

        :param descriptors: for every sink, the descriptors of the tasks that succeeded;
            staging no descriptor names (failed attempts, crashed runs) is never published.
        :param rows: how many rows the tasks staged, for the result.
        :param source_offsets: where each source resumes *after* this epoch.
        :raises InvalidState: when a sink is not a distributed-commit sink, or lacks
            descriptors.
        :raises LaminarError: when the epoch fails before its commit decision; it was rolled
            back on every sink and may be staged and committed again.
        """
        if self._skips(epoch):
            return EpochResult(epoch, 0, skipped=True, commit_latency_s=0.0)
        try:
            for name, sink in self._sinks.items():
                _distributed(name, sink)
                if name not in descriptors:
                    raise InvalidState(
                        f"commit descriptors for sink {name!r}", f"sinks {sorted(descriptors)}"
                    )
            manifest = self._pending_manifest(epoch, source_offsets or {}, descriptors)
        except SimulatedCrash:
            raise
        except BaseException:
            await self._rollback_all(epoch)
            raise
        return await self._decide_and_commit(manifest, rows)

    def _skips(self, epoch: int) -> bool:
        """Whether ``epoch`` is a re-delivery of a committed epoch; checks the order."""
        if not self._recovered:
            raise InvalidState("recover() called first", "no recovery run")
        if self.is_committed(epoch):
            logger.info("epoch %d is already committed: skipping its re-delivery", epoch)
            return True
        if self._last is not None and epoch != self.next_epoch:
            raise InvalidState(f"epoch {self.next_epoch}", f"epoch {epoch}")
        return False

    def _pending_manifest(
        self,
        epoch: int,
        offsets: Mapping[str, SourceCheckpoint],
        descriptors: Mapping[str, Sequence[str]],
    ) -> CheckpointManifest:
        self._observer(ProtocolStep.MANIFEST, epoch)
        manifest = CheckpointManifest.new(epoch, query_id=self._query_id)
        for name, checkpoint in offsets.items():
            manifest = manifest.with_source_offset(name, checkpoint.with_epoch(epoch))
        for name in self._sinks:
            manifest = manifest.with_sink_status(name, SinkEpochStatus.PENDING)
            if name in descriptors:
                manifest = manifest.with_sink_commit_descriptors(name, descriptors[name])
        return manifest

    async def _decide_and_commit(self, manifest: CheckpointManifest, rows: int) -> EpochResult:
        epoch = manifest.epoch
        started = time.monotonic()
        try:
            await self._checkpointer.save_manifest(manifest)
            await self._checkpointer.update_latest(manifest.checkpoint_id)
        except SimulatedCrash:
            raise
        except BaseException:
            await self._rollback_all(epoch)
            raise
        # The decision is durable: from here on, failures are finished by recovery, never
        # rolled back.
        self._observer(ProtocolStep.COMMIT, epoch)
        self._last = await self._finish_commit(manifest)
        self._observer(ProtocolStep.DONE, epoch)
        return EpochResult(epoch, rows, skipped=False, commit_latency_s=time.monotonic() - started)

    def _check_query(self, manifest: CheckpointManifest) -> None:
        recorded = manifest.query_id
        if self._query_id is None or recorded is None or recorded == self._query_id:
            return
        raise CheckpointError(
            f"the checkpoints at {self._checkpointer.location} belong to streaming query "
            f"{recorded}, up to its epoch {manifest.epoch}, but this is query {self._query_id}, "
            "whose epochs are numbered afresh: its epochs would be skipped as committed. This "
            "happens when Spark's checkpointLocation was deleted or changed but not the laminar "
            "checkpoint location. Delete both to start over, or point "
            "laminar.checkpoint.location at a new location for the new query"
        )

    async def _write_and_prepare(
        self, epoch: int, batches: Iterable[pa.RecordBatch] | AsyncIterable[pa.RecordBatch]
    ) -> int:
        for name, sink in self._sinks.items():
            await self._bounded(name, "begin_epoch", sink.begin_epoch(epoch))
        rows = 0
        async for batch in as_async_batches(batches):
            for name, sink in self._sinks.items():
                _check_schema(name, sink, batch)
                self._observer(ProtocolStep.WRITE, epoch)
                await self._bounded(name, "write_batch", sink.write_batch(batch))
            rows += batch.num_rows
        self._observer(ProtocolStep.PRE_COMMIT, epoch)
        for name, sink in self._sinks.items():
            await self._bounded(name, "pre_commit", sink.pre_commit(epoch))
        return rows

    async def _finish_commit(self, manifest: CheckpointManifest) -> CheckpointManifest:
        pending = [n for n, s in manifest.sink_statuses.items() if s is SinkEpochStatus.PENDING]
        for name in pending:
            sink = self._sinks.get(name)
            if sink is None:
                raise InvalidState(
                    f"sink {name!r} of epoch {manifest.epoch} present to finish its commit",
                    f"sinks {sorted(self._sinks)}; restart with the same sinks",
                )
            descriptors = manifest.sink_commit_descriptors.get(name)
            if descriptors is None:
                commit = functools.partial(sink.commit_epoch, manifest.epoch)
                await self._retrying(name, "commit_epoch", commit)
            else:
                commit = functools.partial(
                    _distributed(name, sink).commit_aggregated, manifest.epoch, descriptors
                )
                await self._retrying(name, "commit_aggregated", commit)
        if not pending:
            return manifest
        self._observer(ProtocolStep.COMMITTED_MANIFEST, manifest.epoch)
        for name in pending:
            manifest = manifest.with_sink_status(name, SinkEpochStatus.COMMITTED)
        await self._checkpointer.save_manifest(manifest)
        return manifest

    async def _rollback_all(self, epoch: int) -> None:
        for name, sink in self._sinks.items():
            try:
                await self._retrying(
                    name, "rollback_epoch", functools.partial(sink.rollback_epoch, epoch)
                )
            except LaminarError:
                logger.exception("sink %r failed to roll back epoch %d", name, epoch)
                raise

    async def _bounded(self, sink: str, call: str, awaitable: Awaitable[object]) -> None:
        timeout = self._policy.call_timeout_s
        try:
            await asyncio.wait_for(awaitable, timeout)
        except TimeoutError:
            raise Timeout(
                f"sink {sink!r}: {call} did not finish within {timeout:g}s", timeout_s=timeout
            ) from None

    async def _retrying(
        self, sink: str, call: str, make_call: Callable[[], Awaitable[object]]
    ) -> None:
        delay = self._policy.backoff_s
        for attempt in range(1, self._policy.attempts + 1):
            try:
                await self._bounded(sink, call, make_call())
            except ConnectorError as error:
                if not error.is_transient or attempt == self._policy.attempts:
                    raise
                logger.warning(
                    "sink %r: %s failed (%s); retry %d of %d in %.2fs",
                    sink,
                    call,
                    error,
                    attempt,
                    self._policy.attempts - 1,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._policy.max_backoff_s)
            else:
                return


def destination_ahead(
    location: str, sink: str, committed: int, query_id: str | None = None
) -> CheckpointError:
    """Why a query must not start: its checkpoint location is empty, its sink's destination not.

    The location holds no checkpoint, while ``sink``'s destination records epochs up to
    ``committed`` (:meth:`SinkConnector.last_committed_epoch`): the sink would skip the
    query's first epochs as committed.
    """
    query = f" --query-id {query_id}" if query_id else ""
    skipped = "epoch 0" if committed == 0 else f"epochs 0 to {committed}"
    return CheckpointError(
        f"the checkpoint location {location} holds no checkpoint, so this query numbers "
        f"its epochs from 0, but sink {sink!r} records epochs up to {committed} as committed "
        "in its destination (an earlier query's, written with the same sink identity): it "
        f"would skip {skipped} as committed, and their records would be lost. To write "
        "everything again, give the sink an identity of its own for this query (for example "
        "a new sink.id, or a new path for a files sink) and restart; to go on with the "
        "earlier query, point the checkpoint locations back at its own. If those epochs are "
        "this query's own (its checkpoints were lost), record it with `laminar checkpoints "
        f"mark-committed {location} --epoch {committed}{query}` and restart"
    )


async def stage_task(
    name: str,
    sink: SinkConnector,
    epoch: int,
    task: str,
    batches: Iterable[pa.RecordBatch] | AsyncIterable[pa.RecordBatch],
    *,
    observer: StepObserver | None = None,
) -> str:
    """Stage ``batches`` as write task ``task``'s share of ``epoch``; return its descriptor.

    The part of the distributed epoch that runs in each write task, on a sink opened there;
    :meth:`EpochCoordinator.commit_staged` commits the descriptors of all tasks. The observer
    sees :attr:`ProtocolStep.WRITE` before each batch the sink takes and
    :attr:`ProtocolStep.PRE_COMMIT` after the last one. A failure leaves staging that no
    descriptor will name; it is never published.

    :param name: the sink's name, for messages.
    :param task: unique per attempt and per run (see ``DistributedCommitSink.stage``).
    :raises InvalidState: when the sink is not a distributed-commit sink.
    :raises SchemaMismatch: when a batch does not have the sink's schema.
    """
    observe = observer or _ignore

    async def observed() -> AsyncIterator[pa.RecordBatch]:
        async for batch in as_async_batches(batches):
            _check_schema(name, sink, batch)
            observe(ProtocolStep.WRITE, epoch)
            yield batch
        observe(ProtocolStep.PRE_COMMIT, epoch)

    return await _distributed(name, sink).stage(epoch, task, observed())


def _distributed(name: str, sink: SinkConnector) -> DistributedCommitSink:
    distributed = sink.as_distributed_commit()
    if distributed is None:
        raise InvalidState(
            f"sink {name!r} to be a distributed-commit sink (as_distributed_commit())",
            "a sink that commits from one instance only",
        )
    return distributed


def _ignore(step: ProtocolStep, epoch: int) -> None:
    """The observer when none is given."""


def _ignore_skip(error: CheckpointError) -> None:
    """Recovery reported the skipped checkpoint already."""


def _check_schema(name: str, sink: SinkConnector, batch: pa.RecordBatch) -> None:
    expected = sink.schema()
    if not batch.schema.equals(expected):
        raise SchemaMismatch(
            f"sink {name!r} expects schema {_describe(expected)}, but the batch has "
            f"{_describe(batch.schema)}; add a transform that casts or selects the columns"
        )


def _describe(schema: pa.Schema) -> str:
    return "(" + ", ".join(f"{field.name}: {field.type}" for field in schema) + ")"


async def as_async_batches(
    batches: Iterable[pa.RecordBatch] | AsyncIterable[pa.RecordBatch],
) -> AsyncIterator[pa.RecordBatch]:
    """``batches``, plain or asynchronous, as an asynchronous iterator."""
    if isinstance(batches, AsyncIterable):
        async for batch in batches:
            yield batch
    else:
        for batch in batches:
            yield batch
