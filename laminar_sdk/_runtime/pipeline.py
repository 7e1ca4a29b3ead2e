"""The in-process pipeline: one source feeding sinks through the epoch coordinator, no Spark.

It is what the conformance kit's fast layer drives plugins through, and the reference for what
the Spark bridge must do with each micro-batch.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from laminar_sdk._checkpointing.checkpointer import Checkpointer
from laminar_sdk._contract.checkpoint import SourceCheckpoint
from laminar_sdk._contract.connector import SinkConnector, SourceConnector
from laminar_sdk._contract.errors import SchemaMismatch
from laminar_sdk._contract.types import DeliveryGuarantee
from laminar_sdk._plugins.registry import ConnectorRegistry, ConnectorRole
from laminar_sdk._runtime.coordinator import (
    EpochCoordinator,
    EpochResult,
    RetryPolicy,
    SimulatedCrash,
    StepObserver,
)
from laminar_sdk._runtime.delivery import validate_delivery_guarantee

logger = logging.getLogger("laminar_sdk.runtime")


@dataclass(frozen=True, slots=True)
class ConnectorRef:
    """A connector by registered name, with its configuration as the user wrote it."""

    connector: str
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PipelineSpec:
    """What to run: a source, named sinks, the guarantee, and epoch sizing.

    :param source: the source connector.
    :param sinks: sink name (as recorded in checkpoints) to sink connector.
    :param guarantee: the delivery guarantee; checked before anything is opened.
    :param max_records_per_epoch: an epoch ends after this many records (or when the source is
        idle, or when it asks for a checkpoint).
    :param poll_records: ``max_records`` passed to each ``poll_batch``.
    :param idle_timeout_s: how long an idle pipeline waits between polls of a source that
        offers no ``data_ready_notify`` event (one that does is awaited, not polled).
    """

    source: ConnectorRef
    sinks: Mapping[str, ConnectorRef]
    guarantee: DeliveryGuarantee = DeliveryGuarantee.AT_LEAST_ONCE
    max_records_per_epoch: int = 100_000
    poll_records: int = 10_000
    idle_timeout_s: float = 0.05


@dataclass(frozen=True, slots=True)
class PipelineReport:
    """What a run did, epoch by epoch."""

    epochs: tuple[EpochResult, ...]

    @property
    def rows(self) -> int:
        """Rows written by the epochs of this run (re-deliveries excluded)."""
        return sum(epoch.rows for epoch in self.epochs)


SOURCE_NAME = "source"
"""The name the pipeline's source has in checkpoint manifests."""


class Pipeline:
    """Runs :class:`PipelineSpec` in this process, epoch by epoch, resuming from checkpoints.

    :param spec: what to run.
    :param registry: where connectors are looked up.
    :param checkpointer: where epochs are recorded.
    :param policy: call timeouts and retries.
    :param observer: called at each protocol step (fault injection, tracing).
    :param on_epoch: called after each epoch, e.g. to print progress.
    """

    def __init__(
        self,
        spec: PipelineSpec,
        registry: ConnectorRegistry,
        checkpointer: Checkpointer,
        *,
        policy: RetryPolicy | None = None,
        observer: StepObserver | None = None,
        on_epoch: Callable[[EpochResult], None] | None = None,
    ) -> None:
        self._spec = spec
        self._registry = registry
        self._checkpointer = checkpointer
        self._policy = policy
        self._observer = observer
        self._on_epoch = on_epoch or (lambda result: None)

    async def run(
        self, *, max_epochs: int | None = None, stop_when_idle: bool = True
    ) -> PipelineReport:
        """Recover, then run epochs until the source is idle (or ``max_epochs`` ran).

        :raises ConfigurationError: for unknown connectors, bad configuration or a guarantee
            the connectors cannot keep — before anything is opened.
        """
        spec = self._spec
        source_spec = self._registry.get(spec.source.connector, ConnectorRole.SOURCE)
        sink_specs = {
            n: self._registry.get(r.connector, ConnectorRole.SINK) for n, r in spec.sinks.items()
        }
        source_config = source_spec.configure(spec.source.properties)
        sink_configs = {n: sink_specs[n].configure(r.properties) for n, r in spec.sinks.items()}
        source = self._registry.create_source(spec.source.connector)
        sinks = {n: self._registry.create_sink(r.connector) for n, r in spec.sinks.items()}
        validate_delivery_guarantee(
            spec.guarantee,
            sources={spec.source.connector: source},
            sinks={f"{n} ({r.connector})": sinks[n] for n, r in spec.sinks.items()},
            checkpointing_enabled=True,
        )
        opened: list[SourceConnector | SinkConnector] = []
        try:
            await source.open(source_config)
            opened.append(source)
            for name, sink in sinks.items():
                await sink.open(sink_configs[name])
                opened.append(sink)
            return await self._run_opened(source, sinks, max_epochs, stop_when_idle)
        except SimulatedCrash:
            opened.clear()  # a killed process closes nothing
            raise
        finally:
            for connector in reversed(opened):
                try:
                    await connector.close()
                except Exception:
                    logger.exception("closing %s failed", type(connector).__name__)

    async def _run_opened(
        self,
        source: SourceConnector,
        sinks: Mapping[str, SinkConnector],
        max_epochs: int | None,
        stop_when_idle: bool,
    ) -> PipelineReport:
        coordinator = EpochCoordinator(
            self._checkpointer, sinks, policy=self._policy, observer=self._observer
        )
        manifest = await coordinator.recover()
        if manifest is not None and SOURCE_NAME in manifest.source_offsets:
            await source.restore(manifest.source_offsets[SOURCE_NAME])
        results: list[EpochResult] = []
        while max_epochs is None or len(results) < max_epochs:
            reader = _EpochReader(source, self._spec)
            if not await reader.wait_for_first_batch(stop_when_idle=stop_when_idle):
                break
            result = await coordinator.run_epoch(
                coordinator.next_epoch, reader.batches(), reader.checkpoint
            )
            reader.checkpoint_taken()
            results.append(result)
            self._on_epoch(result)
        return PipelineReport(tuple(results))


class _EpochReader:
    """The batches of one epoch.

    Read until the epoch is full, the source is idle, or the source asks for a checkpoint.
    """

    def __init__(self, source: SourceConnector, spec: PipelineSpec) -> None:
        self._source = source
        self._spec = spec
        self._first: pa.RecordBatch | None = None
        self._requested: threading.Event | None = None

    def checkpoint(self) -> dict[str, SourceCheckpoint]:
        """Where the source resumes after this epoch (read once the batches are consumed)."""
        return {SOURCE_NAME: self._source.checkpoint()}

    async def _poll(self, max_records: int) -> pa.RecordBatch | None:
        ready = self._source.data_ready_notify()
        if ready is not None:
            ready.clear()
        batch = await self._source.poll_batch(max_records)
        if batch is None or not batch.num_rows:
            return None
        _check_batch(batch.records, self._source)
        return batch.records

    async def wait_for_first_batch(self, *, stop_when_idle: bool) -> bool:
        """Poll until the epoch has its first batch; ``False`` when idle and told to stop."""
        while True:
            self._first = await self._poll(
                min(self._spec.poll_records, self._spec.max_records_per_epoch)
            )
            if self._first is not None:
                return True
            if stop_when_idle:
                return False
            await _wait_for_data(self._source.data_ready_notify(), self._spec.idle_timeout_s)

    async def batches(self) -> AsyncIterator[pa.RecordBatch]:
        """The first batch, then more until the epoch is full or the source idle."""
        assert self._first is not None, "wait_for_first_batch() comes first"
        requested = self._source.checkpoint_requested()
        batch: pa.RecordBatch | None = self._first
        remaining = self._spec.max_records_per_epoch
        while batch is not None:
            remaining -= batch.num_rows
            yield batch
            if remaining <= 0:
                return
            if requested is not None and requested.is_set():
                self._requested = requested  # cleared once the epoch's checkpoint is durable
                return
            batch = await self._poll(min(self._spec.poll_records, remaining))

    def checkpoint_taken(self) -> None:
        """The epoch is committed: lower the source's checkpoint flag if it ended the epoch."""
        if self._requested is not None:
            self._requested.clear()


def _check_batch(records: pa.RecordBatch, source: SourceConnector) -> None:
    if not records.schema.equals(source.schema()):
        raise SchemaMismatch(
            f"source {type(source).__name__} returned a batch whose schema "
            f"({records.schema.to_string(show_schema_metadata=False)}) differs from the schema "
            "it declares; the source is broken: report it to its authors"
        )


async def _wait_for_data(ready: asyncio.Event | None, timeout_s: float) -> None:
    # A source with an event sets it when data arrives (it was cleared before the last poll,
    # so data that came since has set it again): nothing to poll until then.
    if ready is None:
        await asyncio.sleep(timeout_s)
    else:
        await ready.wait()
