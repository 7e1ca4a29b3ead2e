"""The in-process pipeline and the two signals of a source: its event and its checkpoint flag.

An idle pipeline whose source offers an event awaits it — it does not poll on a timer — and
wakes as soon as the source sets it. A source that raises its checkpoint flag has its epoch
ended after the batch it raised it in, and the flag is cleared only once that epoch's
checkpoint is durable.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from laminar_sdk import (
    ConnectorRef,
    DeliveryGuarantee,
    EpochResult,
    Pipeline,
    PipelineSpec,
    ProtocolStep,
    SourceBatch,
    load_connector_registry,
    open_checkpointer,
)
from laminar_sdk.reference import MemorySink, MemorySource

IDLE_S = 1.0
POLL_INTERVAL_S = 0.05  # the pipeline's timer while idle, for a source without an event


class CountingSource(MemorySource):
    """The memory source, counting its polls; the last instance made is kept for the test."""

    latest: CountingSource | None = None

    def __init__(self) -> None:
        super().__init__()
        self.polls = 0
        CountingSource.latest = self

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        self.polls += 1
        return await super().poll_batch(max_records)


class NotifyingSource(CountingSource):
    """Offers an event the test sets when it appends records."""

    def __init__(self) -> None:
        super().__init__()
        self.ready = asyncio.Event()

    def data_ready_notify(self) -> asyncio.Event:
        return self.ready


class RequestingSource(CountingSource):
    """Raises its checkpoint flag when it returns its ``request_at``-th batch."""

    request_at = 2

    def __init__(self) -> None:
        super().__init__()
        self.requested = threading.Event()

    def checkpoint_requested(self) -> threading.Event:
        return self.requested

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        batch = await super().poll_batch(max_records)
        if batch is not None and self.polls == self.request_at:
            self.requested.set()  # a client library would set it from its own thread
        return batch


@pytest.fixture
def registry():
    registry = load_connector_registry()
    for name, source in [
        ("counting", CountingSource),
        ("notifying", NotifyingSource),
        ("requesting", RequestingSource),
    ]:
        registry.add_source(name, source, config_keys=MemorySource.CONFIG_KEYS)
    return registry


def pipeline(registry, tmp_path: Path, source: str, **kwargs) -> Pipeline:
    spec = PipelineSpec(
        source=ConnectorRef(source, {"path": str(tmp_path / "source")}),
        sinks={"out": ConnectorRef("memory", {"path": str(tmp_path / "sink")})},
        guarantee=DeliveryGuarantee.EXACTLY_ONCE,
        max_records_per_epoch=100,
        poll_records=2,
        idle_timeout_s=POLL_INTERVAL_S,
    )
    return Pipeline(spec, registry, open_checkpointer(str(tmp_path / "checkpoints")), **kwargs)


async def until(condition: Callable[[], bool], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def idle_then_append(registry, tmp_path: Path, source_name: str) -> int:
    """Run until epoch 0 is committed, stay idle, append; how often it polled while idle.

    The run must then commit the appended records within 10 s: a source with an event that
    is never polled on a timer (at most once while idle) is woken up by its event alone.
    """
    MemorySource.append(tmp_path / "source", [0, 1, 2])
    run = asyncio.create_task(
        pipeline(registry, tmp_path, source_name).run(max_epochs=2, stop_when_idle=False)
    )
    await until(lambda: MemorySink.committed_ids(tmp_path / "sink") == [0, 1, 2])
    source = CountingSource.latest
    assert source is not None
    before = source.polls
    await asyncio.sleep(IDLE_S)
    idle_polls = source.polls - before
    MemorySource.append(tmp_path / "source", [3, 4])
    if isinstance(source, NotifyingSource):
        source.ready.set()
    report = await asyncio.wait_for(run, 10)
    assert [epoch.rows for epoch in report.epochs] == [3, 2]
    assert sorted(MemorySink.committed_ids(tmp_path / "sink")) == [0, 1, 2, 3, 4]
    return idle_polls


def test_an_idle_pipeline_awaits_the_sources_event_instead_of_polling(registry, tmp_path):
    idle_polls = asyncio.run(idle_then_append(registry, tmp_path, "notifying"))
    assert idle_polls <= 1, f"{idle_polls} polls in {IDLE_S}s of idling: it polls on a timer"


def test_without_an_event_an_idle_pipeline_polls_on_its_timer(registry, tmp_path):
    idle_polls = asyncio.run(idle_then_append(registry, tmp_path, "counting"))
    assert idle_polls >= IDLE_S / POLL_INTERVAL_S / 4, "the control: a timer does poll"


def test_a_checkpoint_request_ends_the_epoch_and_is_cleared_once_it_is_durable(registry, tmp_path):
    MemorySource.append(tmp_path / "source", list(range(10)))
    flag_at: dict[str, bool] = {}

    def observe(step: ProtocolStep, epoch: int) -> None:
        source = CountingSource.latest
        if epoch == 0 and isinstance(source, RequestingSource):
            flag_at.setdefault(step.value, source.requested.is_set())

    epochs: list[EpochResult] = []
    report = asyncio.run(
        pipeline(registry, tmp_path, "requesting", observer=observe, on_epoch=epochs.append).run()
    )
    # Batches of 2 records: the flag went up with the 2nd, so epoch 0 ends there, not at
    # max_records_per_epoch (100): the rest follows in the next epoch.
    assert [epoch.rows for epoch in report.epochs] == [4, 6]
    assert sorted(MemorySink.committed_ids(tmp_path / "sink")) == list(range(10))
    assert flag_at["manifest"], "the flag was cleared before the epoch's checkpoint was taken"
    source = CountingSource.latest
    assert isinstance(source, RequestingSource)
    assert not source.requested.is_set(), "the flag stays raised after the checkpoint"
