"""Recovery with the engine's proof: corrupted newest manifests, and locations that disagree.

A model of what Spark does with a sink committed by one instance (the reference ``memory``
sink, through ``run_epoch``): each micro-batch's commit opens a sink and a coordinator, recovers
with the micro-batch's id as the engine's proof (Spark runs batch N only once its commit log
holds every batch before it), and runs the epoch. A crash stops the model like ``kill -9``;
Spark's commit log is the last batch whose commit returned.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from laminar_conformance.checkpointer import Corruption, damage_file
from runtime_testing import CrashAt

from laminar_sdk import (
    CheckpointError,
    CheckpointId,
    EpochCoordinator,
    ProtocolStep,
    load_connector_registry,
    open_checkpointer,
)
from laminar_sdk._checkpointing.recovery import mark_committed
from laminar_sdk.faults import SimulatedCrash
from laminar_sdk.reference import MemorySink, ids_batch

EPOCHS = [[0, 1, 2], [3, 4], [5, 6, 7], [8], [9, 10]]
ALL_IDS = [i for ids in EPOCHS for i in ids]
SINK = "out"
QUERY = "query-1"


class Query:
    """A memory sink at ``work/sink``, checkpoints at ``work/checkpoints``, Spark's commit log."""

    def __init__(self, work: Path) -> None:
        self.sink = work / "sink"
        self.checkpoints = work / "checkpoints"
        self.spark_committed = -1
        self.registry = load_connector_registry()

    async def run(self, observer: CrashAt | None = None, *, through: int | None = None) -> None:
        last = len(EPOCHS) - 1 if through is None else through
        for epoch in range(self.spark_committed + 1, last + 1):
            sink, _ = await self.registry.open_sink("memory", {"path": str(self.sink)})
            coordinator = EpochCoordinator(
                open_checkpointer(str(self.checkpoints)),
                {SINK: sink},
                observer=observer,
                query_id=QUERY,
            )
            await coordinator.recover(engine_epoch=epoch)
            await coordinator.run_epoch(epoch, [ids_batch(EPOCHS[epoch])], {})
            await sink.close()
            self.spark_committed = epoch

    def newest_manifest(self) -> Path:
        return max(self.checkpoints.glob("*/manifest.json"), key=lambda path: path.parent.name)

    def delivered(self) -> list[int]:
        return sorted(MemorySink.committed_ids(self.sink))


@pytest.mark.parametrize("corruption", list(Corruption), ids=lambda how: how.value)
@pytest.mark.parametrize("step", list(ProtocolStep), ids=lambda step: step.value)
def test_a_corrupted_newest_manifest_is_survived_exactly_once(tmp_path, step, corruption):
    query = Query(tmp_path)
    with pytest.raises(SimulatedCrash):
        asyncio.run(query.run(CrashAt(step, 2)))
    damage_file(query.newest_manifest(), corruption)

    asyncio.run(query.run())

    assert query.delivered() == ALL_IDS


def test_the_proof_goes_on_when_no_manifest_is_left_readable(tmp_path, caplog):
    query = Query(tmp_path)
    asyncio.run(query.run(through=0))
    asyncio.run(query.run(through=1))
    for manifest in query.checkpoints.glob("*/manifest.json"):
        damage_file(manifest, Corruption.FLIP_BYTE)

    asyncio.run(query.run())

    assert query.delivered() == ALL_IDS
    warning = next(r.getMessage() for r in caplog.records if "unreadable or missing" in r.message)
    assert "Spark's commit log holds every micro-batch before 2" in warning
    assert "laminar checkpoints quarantine" in warning


def test_without_a_proof_a_corrupted_location_stops_and_names_the_command(tmp_path):
    query = Query(tmp_path)
    with pytest.raises(SimulatedCrash):
        asyncio.run(query.run(CrashAt(ProtocolStep.DONE, 0)))
    manifest = query.newest_manifest()
    damage_file(manifest, Corruption.FLIP_BYTE)
    store = open_checkpointer(str(query.checkpoints))
    checkpoint_id = manifest.parent.name

    with pytest.raises(CheckpointError, match="proves nothing yet") as error:
        asyncio.run(query.run())

    command = f"laminar checkpoints quarantine {store.location} {checkpoint_id}"
    assert command in str(error.value)
    assert query.delivered() == EPOCHS[0], "nothing was rolled back or written"

    moved = asyncio.run(store.quarantine_checkpoint(CheckpointId.parse(checkpoint_id)))
    assert moved == [f"quarantine/{checkpoint_id}/manifest.json"]
    assert (query.checkpoints / moved[0]).read_bytes() != b""
    # The location now holds no checkpoint, and the sink has epoch 0: as for a new query,
    # the run stops and says how to record that epoch 0 is this query's own.
    with pytest.raises(CheckpointError, match="records epochs up to 0 as committed") as refused:
        asyncio.run(query.run())
    command = f"laminar checkpoints mark-committed {store.location} --epoch 0 --query-id {QUERY}"
    assert command in str(refused.value)
    assert query.delivered() == EPOCHS[0]

    asyncio.run(mark_committed(store, 0, query_id=QUERY))
    asyncio.run(query.run())
    assert query.delivered() == ALL_IDS


def test_a_query_started_over_on_a_sink_that_has_its_epochs_stops_before_skipping_them(tmp_path):
    # Both locations deleted "to start over", the sink left as it was: the new query would
    # number its epochs from 0 again, and the sink would skip them as committed.
    query = Query(tmp_path)
    asyncio.run(query.run())
    shutil.rmtree(query.checkpoints)
    query.spark_committed = -1

    with pytest.raises(CheckpointError) as refused:
        asyncio.run(query.run())

    message = str(refused.value)
    assert "holds no checkpoint, so this query numbers its epochs from 0" in message
    assert f"sink {SINK!r} records epochs up to {len(EPOCHS) - 1} as committed" in message
    assert "give the sink an identity of its own" in message
    assert query.delivered() == ALL_IDS, "nothing was skipped, written or rolled back"


@pytest.mark.parametrize("lost", ["deleted", "restored from an older backup"])
def test_a_laminar_location_behind_spark_stops_until_marked_committed(tmp_path, lost):
    query = Query(tmp_path)
    asyncio.run(query.run(through=1))
    backup = tmp_path / "backup"
    shutil.copytree(query.checkpoints, backup)
    asyncio.run(query.run(through=2))
    shutil.rmtree(query.checkpoints)
    if lost != "deleted":
        shutil.copytree(backup, query.checkpoints)

    with pytest.raises(CheckpointError, match="laminar checkpoints mark-committed") as error:
        asyncio.run(query.run())

    newest = "holds no checkpoint" if lost == "deleted" else "ends at epoch 1"
    assert newest in str(error.value)
    assert f"--epoch 2 --query-id {QUERY}" in str(error.value)
    assert query.delivered() == sorted(EPOCHS[0] + EPOCHS[1] + EPOCHS[2])

    asyncio.run(mark_committed(open_checkpointer(str(query.checkpoints)), 2, query_id=QUERY))
    asyncio.run(query.run())

    assert query.delivered() == ALL_IDS


def test_a_spark_checkpoint_behind_the_laminar_location_stops(tmp_path):
    query = Query(tmp_path)
    asyncio.run(query.run(through=2))
    query.spark_committed = 0  # Spark's checkpointLocation restored from an older backup

    with pytest.raises(CheckpointError, match="Spark's checkpoint is older") as error:
        asyncio.run(query.run())

    assert "runs micro-batch 1, but later epochs were committed (up to 2)" in str(error.value)
    assert query.delivered() == sorted(EPOCHS[0] + EPOCHS[1] + EPOCHS[2])


def test_mark_committed_refuses_to_go_back(tmp_path):
    query = Query(tmp_path)
    asyncio.run(query.run(through=2))

    with pytest.raises(CheckpointError, match="already records epoch 2"):
        asyncio.run(mark_committed(open_checkpointer(str(query.checkpoints)), 1))
