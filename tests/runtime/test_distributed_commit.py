"""The coordinator's distributed epoch: tasks stage, one commit publishes, crashes anywhere.

A small model of what Spark does with a distributed-commit sink (the reference ``memory``
sink): each micro-batch's write tasks stage their share on instances of their own — the first
attempt of task 0 dies mid-write and is retried, and an extra attempt of task 0 succeeds but is
not the one Spark keeps — then a commit on a new instance records the descriptors and
publishes them. Spark's own commit log is the batch id of the last micro-batch that finished;
after a crash the query restarts from the one after it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from runtime_testing import CrashAt

from laminar_sdk import (
    CheckpointError,
    EpochCoordinator,
    InvalidState,
    ProtocolStep,
    load_connector_registry,
    open_checkpointer,
)
from laminar_sdk._runtime.coordinator import StepObserver, stage_task
from laminar_sdk.faults import SimulatedCrash
from laminar_sdk.reference import MemorySink, ids_batch

# Three micro-batches of two tasks each; every id once.
EPOCHS = [[[0, 1, 2, 3], [4, 5]], [[6, 7, 8], [9, 10, 11]], [[12], [13, 14, 15, 16]]]
ALL_IDS = sorted(i for tasks in EPOCHS for share in tasks for i in share)
SINK = "out"


class ExecutorLost(Exception):
    """A write task's attempt dies after handing over its first batch."""


@dataclass
class SparkLog:
    """Spark's commit log: the last micro-batch whose commit returned."""

    last_batch: int = -1


def batches(ids: list[int], *, die_after_first: bool = False) -> Iterator[pa.RecordBatch]:
    for start in range(0, len(ids), 2):
        yield ids_batch(ids[start : start + 2])
        if die_after_first:
            raise ExecutorLost("the executor running this attempt was lost")


class Query:
    """One pipeline: a memory sink at ``work/sink``, checkpoints at ``work/checkpoints``."""

    def __init__(self, work: Path, query_id: str = "query-1") -> None:
        self.sink_path = work / "sink"
        self.checkpoints = work / "checkpoints"
        self.query_id = query_id
        self.registry = load_connector_registry()
        self.spark = SparkLog()
        self.descriptors: dict[int, list[str]] = {}

    async def open_sink(self) -> MemorySink:
        sink, _ = await self.registry.open_sink("memory", {"path": str(self.sink_path)})
        assert isinstance(sink, MemorySink)
        return sink

    def coordinator(self, sink: MemorySink, observer: StepObserver | None) -> EpochCoordinator:
        return EpochCoordinator(
            open_checkpointer(str(self.checkpoints)),
            {SINK: sink},
            observer=observer,
            query_id=self.query_id,
        )

    async def stage(
        self,
        epoch: int,
        task: str,
        ids: list[int],
        observer: StepObserver | None,
        *,
        die_after_first: bool = False,
    ) -> str:
        sink = await self.open_sink()
        descriptor = await stage_task(
            SINK,
            sink,
            epoch,
            task,
            batches(ids, die_after_first=die_after_first),
            observer=observer,
        )
        await sink.close()
        return descriptor

    async def run(self, observer: StepObserver | None = None) -> None:
        """Run the query from Spark's commit log to the end (or to a simulated crash)."""
        run = uuid.uuid4().hex[:8]
        for epoch in range(self.spark.last_batch + 1, len(EPOCHS)):
            descriptors = []
            for number, share in enumerate(EPOCHS[epoch]):
                if number == 0:
                    with pytest.raises(ExecutorLost):
                        await self.stage(
                            epoch, f"{number}-0-{run}", share, observer, die_after_first=True
                        )
                descriptors.append(await self.stage(epoch, f"{number}-1-{run}", share, observer))
            # A duplicate attempt of task 0 that also succeeded; Spark keeps the other one.
            await self.stage(epoch, f"0-2-{run}", EPOCHS[epoch][0], observer)
            sink = await self.open_sink()
            coordinator = self.coordinator(sink, observer)
            await coordinator.recover(roll_back_next=False)
            self.descriptors[epoch] = descriptors
            rows = sum(len(share) for share in EPOCHS[epoch])
            await coordinator.commit_staged(epoch, {SINK: descriptors}, rows=rows)
            await sink.close()
            self.spark.last_batch = epoch

    async def abort(self) -> None:
        """What Spark's abort of a micro-batch does: recover, rolling the undecided epoch back."""
        sink = await self.open_sink()
        await self.coordinator(sink, None).recover()
        await sink.close()

    def staging_left(self) -> list[str]:
        staging = self.sink_path / "_staging"
        return sorted(str(p.relative_to(staging)) for p in staging.rglob("*"))


def committed_tasks(query: Query, epoch: int) -> list[str]:
    """The task directories in the committed epoch, which its manifest lists, all of them."""
    directory = query.sink_path / "committed" / f"epoch-{epoch}"
    manifest = json.loads((directory / "_MANIFEST.json").read_text())
    listed = sorted({part.split("/")[0] for part in manifest["parts"]})
    present = sorted(path.name for path in directory.iterdir() if path.is_dir())
    assert present == listed, "nothing but the named staging is in the committed epoch"
    return present


def test_tasks_stage_in_parallel_and_only_the_named_attempts_are_published(tmp_path):
    query = Query(tmp_path)
    asyncio.run(query.run())

    assert sorted(MemorySink.committed_ids(query.sink_path)) == ALL_IDS
    for epoch, descriptors in query.descriptors.items():
        named = sorted(f"task-{json.loads(d)['task']}" for d in descriptors)
        assert committed_tasks(query, epoch) == named
        assert all("-1-" in task for task in named), "the retried attempts, not the others"
    assert query.staging_left() == [], "failed and duplicate attempts are discarded"


@pytest.mark.parametrize("epoch", [0, 1, 2])
@pytest.mark.parametrize("step", list(ProtocolStep), ids=lambda step: step.value)
def test_a_crash_at_any_step_then_a_restart_publishes_every_id_once(tmp_path, step, epoch):
    query = Query(tmp_path)
    crash = CrashAt(step, epoch)
    with pytest.raises(SimulatedCrash):
        asyncio.run(query.run(crash))
    assert crash.fired

    asyncio.run(query.run())

    assert sorted(MemorySink.committed_ids(query.sink_path)) == ALL_IDS
    assert query.staging_left() == []


def test_a_decided_epoch_is_finished_with_the_recorded_descriptors(tmp_path):
    query = Query(tmp_path)
    with pytest.raises(SimulatedCrash):
        asyncio.run(query.run(CrashAt(ProtocolStep.COMMIT, 1)))
    crashed_run = query.descriptors[1]
    store = open_checkpointer(str(query.checkpoints))
    latest = asyncio.run(store.load_manifest(asyncio.run(store.read_latest())))
    assert latest.epoch == 1
    assert latest.sink_commit_descriptors == {SINK: tuple(crashed_run)}
    assert latest.query_id == "query-1"
    assert sorted(MemorySink.committed_ids(query.sink_path)) == list(range(6)), "undecided"

    asyncio.run(query.run())

    # Spark re-ran micro-batch 1, its tasks staged it again; recovery published the crashed
    # run's staging, which the manifest names, and discarded the re-run's.
    assert committed_tasks(query, 1) == sorted(f"task-{json.loads(d)['task']}" for d in crashed_run)
    assert sorted(MemorySink.committed_ids(query.sink_path)) == ALL_IDS
    assert query.staging_left() == []


def test_an_abort_rolls_back_every_tasks_staging_of_the_undecided_epoch(tmp_path):
    query = Query(tmp_path)
    with pytest.raises(SimulatedCrash):
        asyncio.run(query.run(CrashAt(ProtocolStep.MANIFEST, 1)))
    assert any(name.startswith("epoch-1/") for name in query.staging_left())

    asyncio.run(query.abort())

    assert query.staging_left() == []
    assert sorted(MemorySink.committed_ids(query.sink_path)) == list(range(6))


def test_checkpoints_of_another_query_are_refused_before_anything_is_touched(tmp_path):
    first = Query(tmp_path, query_id="query-1")
    with pytest.raises(SimulatedCrash):
        asyncio.run(first.run(CrashAt(ProtocolStep.COMMIT, 1)))
    # Spark's checkpoint is gone: a new query id, batch ids from 0 again.
    second = Query(tmp_path, query_id="query-2")

    with pytest.raises(CheckpointError, match="belong to streaming query query-1") as error:
        asyncio.run(second.run())

    assert "this is query query-2" in str(error.value)
    assert "Delete both" in str(error.value)
    assert "laminar.checkpoint.location" in str(error.value)
    assert sorted(MemorySink.committed_ids(tmp_path / "sink")) == list(range(6)), (
        "the decided epoch 1 of the other query is not finished, nothing is skipped or written"
    )


def test_a_coordinator_without_a_query_id_accepts_the_checkpoints_of_any(tmp_path):
    query = Query(tmp_path)
    asyncio.run(query.run())

    async def recovered_epoch() -> int:
        sink = await query.open_sink()
        store = open_checkpointer(str(query.checkpoints))
        manifest = await EpochCoordinator(store, {SINK: sink}).recover()
        await sink.close()
        assert manifest is not None
        return manifest.epoch

    assert asyncio.run(recovered_epoch()) == len(EPOCHS) - 1


def test_commit_staged_needs_a_distributed_sink_with_descriptors(tmp_path):
    registry = load_connector_registry()

    async def scenario() -> None:
        null, _ = await registry.open_sink("null", {})
        coordinator = EpochCoordinator(open_checkpointer(str(tmp_path / "a")), {SINK: null})
        await coordinator.recover()
        with pytest.raises(InvalidState, match="to be a distributed-commit sink"):
            await coordinator.commit_staged(0, {SINK: []})

        memory, _ = await registry.open_sink("memory", {"path": str(tmp_path / "sink")})
        descriptor = await stage_task(SINK, memory, 0, "t", [ids_batch([1, 2])])
        coordinator = EpochCoordinator(open_checkpointer(str(tmp_path / "b")), {SINK: memory})
        await coordinator.recover(roll_back_next=False)
        with pytest.raises(InvalidState, match="commit descriptors for sink 'out'"):
            await coordinator.commit_staged(0, {"other": [descriptor]})
        assert coordinator.last_manifest is None

    asyncio.run(scenario())
    assert MemorySink.committed_ids(tmp_path / "sink") == []
    assert not (tmp_path / "sink" / "_staging" / "epoch-0").exists(), "rolled back"
