"""The epoch coordinator: two-phase commit of sinks, with a durable record of every epoch.

For each epoch: ``begin_epoch`` → ``write_batch``… → ``pre_commit`` on every sink → the
checkpoint manifest with every sink *pending* is saved and the latest pointer moved to it (the
commit decision: from here on the epoch is committed, whatever happens) → ``commit_epoch`` on
every sink → the manifest is saved again with the sinks *committed*. A failure before the
latest pointer names the manifest rolls the epoch back on every sink.

Recovery reads the newest valid manifest: sinks still pending there are committed (the
decision was taken), and every sink rolls back the epoch after it, which may have been
pre-committed but never decided. An epoch at or before the manifest's is never written again.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import time
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

import pyarrow as pa

from laminar_sdk._checkpoint import SourceCheckpoint
from laminar_sdk._checkpointing.checkpointer import Checkpointer
from laminar_sdk._checkpointing.manifest import CheckpointManifest, SinkEpochStatus
from laminar_sdk._checkpointing.recovery import load_latest_valid
from laminar_sdk._connector import SinkConnector
from laminar_sdk._errors import ConnectorError, InvalidState, LaminarError, SchemaMismatch, Timeout

logger = logging.getLogger("laminar_sdk.runtime")


class ProtocolStep(enum.Enum):
    """The points of the epoch protocol where the coordinator hands control to an observer.

    The numbers are the crash points of the design notes that fall between two calls; crash
    points inside a sink call (3, 6) are reached by the sink itself.
    """

    WRITE = "write"
    """Before each ``write_batch`` (crash point 1)."""
    PRE_COMMIT = "pre-commit"
    """After the last write, before ``pre_commit`` (crash point 2)."""
    MANIFEST = "manifest"
    """After ``pre_commit``, before the manifest is durable (crash point 4)."""
    COMMIT = "commit"
    """After the manifest is durable, before ``commit_epoch`` (crash point 5)."""
    COMMITTED_MANIFEST = "committed-manifest"
    """After ``commit_epoch``, before the manifest says committed (crash point 7)."""
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
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        sinks: Mapping[str, SinkConnector],
        *,
        policy: RetryPolicy | None = None,
        observer: StepObserver | None = None,
    ) -> None:
        if not sinks:
            raise InvalidState("at least one sink", "no sinks")
        self._checkpointer = checkpointer
        self._sinks = dict(sinks)
        self._policy = policy or RetryPolicy()
        self._observer = observer or (lambda step, epoch: None)
        self._last: CheckpointManifest | None = None
        self._recovered = False

    @property
    def last_manifest(self) -> CheckpointManifest | None:
        """The manifest of the newest committed epoch, or ``None`` before the first."""
        return self._last

    @property
    def next_epoch(self) -> int:
        """The epoch after the newest committed one (0 when none was)."""
        return 0 if self._last is None else self._last.epoch + 1

    def is_committed(self, epoch: int) -> bool:
        """Whether ``epoch`` was already committed (a re-delivery must be skipped)."""
        return self._last is not None and epoch <= self._last.epoch

    async def recover(self) -> CheckpointManifest | None:
        """Bring the sinks to the newest valid checkpoint; call once, before any epoch.

        Sinks pending in that checkpoint are committed; the epoch after it is rolled back on
        every sink. Returns the checkpoint's manifest, whose ``source_offsets`` tell sources
        where to resume, or ``None`` when there is none.

        :raises CheckpointError: when checkpoints exist but none is valid.
        """
        recovered = await load_latest_valid(self._checkpointer)
        manifest = None if recovered is None else recovered.manifest
        if manifest is not None:
            manifest = await self._finish_commit(manifest)
        self._last = manifest
        self._recovered = True
        await self._rollback_all(self.next_epoch)
        if manifest is not None:
            logger.info(
                "recovered at epoch %d (checkpoint %s)", manifest.epoch, manifest.checkpoint_id
            )
        return manifest

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
        if not self._recovered:
            raise InvalidState("recover() called first", "no recovery run")
        if self.is_committed(epoch):
            logger.info("epoch %d is already committed: skipping its re-delivery", epoch)
            return EpochResult(epoch, 0, skipped=True, commit_latency_s=0.0)
        if self._last is not None and epoch != self.next_epoch:
            raise InvalidState(f"epoch {self.next_epoch}", f"epoch {epoch}")
        try:
            rows = await self._write_and_prepare(epoch, batches)
            self._observer(ProtocolStep.MANIFEST, epoch)
            offsets = source_offsets() if callable(source_offsets) else source_offsets
            manifest = CheckpointManifest.new(epoch)
            for name, checkpoint in offsets.items():
                manifest = manifest.with_source_offset(name, checkpoint.with_epoch(epoch))
            for name in self._sinks:
                manifest = manifest.with_sink_status(name, SinkEpochStatus.PENDING)
            started = time.monotonic()
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

    async def _write_and_prepare(
        self, epoch: int, batches: Iterable[pa.RecordBatch] | AsyncIterable[pa.RecordBatch]
    ) -> int:
        for name, sink in self._sinks.items():
            await self._bounded(name, "begin_epoch", sink.begin_epoch(epoch))
        rows = 0
        async for batch in _aiter(batches):
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
            await self._retrying(
                name, "commit_epoch", functools.partial(sink.commit_epoch, manifest.epoch)
            )
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


def _check_schema(name: str, sink: SinkConnector, batch: pa.RecordBatch) -> None:
    expected = sink.schema()
    if not batch.schema.equals(expected):
        raise SchemaMismatch(
            f"sink {name!r} expects schema {_describe(expected)}, but the batch has "
            f"{_describe(batch.schema)}; add a transform that casts or selects the columns"
        )


def _describe(schema: pa.Schema) -> str:
    return "(" + ", ".join(f"{field.name}: {field.type}" for field in schema) + ")"


async def _aiter(
    batches: Iterable[pa.RecordBatch] | AsyncIterable[pa.RecordBatch],
) -> AsyncIterable[pa.RecordBatch]:
    if isinstance(batches, AsyncIterable):
        async for batch in batches:
            yield batch
    else:
        for batch in batches:
            yield batch
