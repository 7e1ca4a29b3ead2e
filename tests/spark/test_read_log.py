"""The read log: a polled micro-batch's records, stored in slices, read back, deleted."""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pyarrow as pa
import pytest
from spark_pipelines import ids_batch

from laminar_sdk import CheckpointError, CheckpointId, ReadError, open_checkpointer
from laminar_sdk._checkpointing.file_store import FileCheckpointer
from laminar_sdk._spark import read_log
from laminar_sdk._spark.read_log import ReadLog, ReadLogEntry
from laminar_sdk.reference import IDS_SCHEMA


def log_at(directory: Path, source: str = "my source/1") -> ReadLog:
    return ReadLog(open_checkpointer(str(directory)), source)


def read_ids(log: ReadLog, entry: ReadLogEntry) -> list[int]:
    async def read() -> list[int]:
        ids: list[int] = []
        for logged in entry.slices:
            for batch in await log.read(logged):
                assert batch.schema.equals(IDS_SCHEMA)
                ids += batch.column("id").to_pylist()
        return ids

    return asyncio.run(read())


def test_a_micro_batch_is_logged_in_slices_and_read_back_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = [ids_batch(first, 100) for first in range(0, 1000, 100)]
    monkeypatch.setattr(read_log, "SLICE_BYTES", batches[0].nbytes * 3)
    log = log_at(tmp_path)

    entry = asyncio.run(log.append(batches, IDS_SCHEMA))

    assert [logged.rows for logged in entry.slices] == [300, 300, 300, 100]
    assert entry.rows == 1000
    assert read_ids(log, entry) == list(range(1000))
    assert all("/operators/source.my_source_1/" in s.path for s in entry.slices)
    assert ReadLogEntry.from_dict(entry.to_dict()) == entry, "it travels in Spark's offsets"


def test_slices_are_stored_compressed_and_read_back_whole(tmp_path: Path) -> None:
    # Two of the three columns repeat one value: LZ4 stores them in a fraction of their size.
    batch = ids_batch(0, 200_000)
    log = log_at(tmp_path)

    entry = asyncio.run(log.append([batch], IDS_SCHEMA))

    stored = (tmp_path / entry.slices[0].path).stat().st_size
    assert stored < batch.nbytes / 2, f"{stored} bytes stored for {batch.nbytes} of Arrow"
    assert read_ids(log, entry) == list(range(200_000))


def test_a_corrupted_slice_is_an_error_naming_it(tmp_path: Path) -> None:
    log = log_at(tmp_path)
    entry = asyncio.run(log.append([ids_batch(0, 10)], IDS_SCHEMA))
    stored = tmp_path / entry.slices[0].path
    data = bytearray(stored.read_bytes())
    data[-1] ^= 0xFF
    stored.write_bytes(bytes(data))

    with pytest.raises(ReadError, match="corrupted") as error:
        read_ids(log, entry)

    assert entry.slices[0].path in str(error.value)
    assert "Spark's checkpoint" in str(error.value)


def test_discarding_a_committed_entry_deletes_it_and_old_orphans_only(tmp_path: Path) -> None:
    log = log_at(tmp_path)
    other = log_at(tmp_path, "another")
    orphan = asyncio.run(log.append([ids_batch(0, 5)], IDS_SCHEMA))
    committed = asyncio.run(log.append([ids_batch(5, 5)], IDS_SCHEMA))
    planned = asyncio.run(log.append([ids_batch(10, 5)], IDS_SCHEMA))
    not_ours = asyncio.run(other.append([ids_batch(0, 5)], IDS_SCHEMA))

    def left() -> set[str]:
        return {path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*.snap")}

    asyncio.run(log.discard(committed))
    kept = {orphan.slices[0].path, planned.slices[0].path, not_ours.slices[0].path}
    assert left() == kept, "a recent orphan may still be in flight"
    asyncio.run(log.discard(committed, grace_s=0))
    assert left() == {planned.slices[0].path, not_ours.slices[0].path}
    assert read_ids(log, planned) == list(range(10, 15))
    assert orphan.checkpoint_id < committed.checkpoint_id < planned.checkpoint_id


def test_an_orphan_younger_than_the_grace_is_kept(tmp_path: Path) -> None:
    log = log_at(tmp_path)
    orphan = asyncio.run(log.append([ids_batch(0, 5)], IDS_SCHEMA))
    committed = asyncio.run(log.append([ids_batch(5, 5)], IDS_SCHEMA))
    stored = tmp_path / orphan.slices[0].path
    an_hour_ago = time.time() - 3600
    os.utime(stored, (an_hour_ago, an_hour_ago))  # age is the id's, not the file's

    asyncio.run(log.discard(committed))

    assert stored.exists()


@pytest.mark.parametrize(
    "logged",
    [
        None,
        {"id": "nope", "slices": []},
        {"id": str(CheckpointId.new()), "slices": [{"path": "x", "sha256": "y", "rows": 1}]},
        {"id": str(CheckpointId.new())},
    ],
)
def test_a_malformed_entry_in_the_offset_log_is_an_error(logged: object) -> None:
    with pytest.raises(CheckpointError, match="offset log edited by hand"):
        ReadLogEntry.from_dict(logged)


def test_the_log_holds_every_column_type_spark_hands_over(tmp_path: Path) -> None:
    schema = pa.schema([("s", pa.string()), ("t", pa.timestamp("us", tz="UTC"))])
    batch = pa.record_batch(
        [pa.array(["a", None]), pa.array([1, 2], pa.timestamp("us", "UTC"))], schema=schema
    )
    log = log_at(tmp_path)
    entry = asyncio.run(log.append([batch], schema))

    async def read() -> pa.Table:
        return (await log.read(entry.slices[0])).read_all()

    assert asyncio.run(read()).to_batches()[0].equals(batch)


class _Polled:
    """A source's polls as a plugin that never awaits writes them: batches of 10 ids."""

    def __init__(self, batches: int, fail_at: int | None = None) -> None:
        self.batches, self.fail_at = batches, fail_at
        self.polled = 0
        self.exhausted = threading.Event()

    async def __aiter__(self) -> AsyncIterator[pa.RecordBatch]:
        for number in range(self.batches):
            if number == self.fail_at:
                raise ReadError("the source's disk went away")
            self.polled += 1
            yield ids_batch(number * 10, 10)
        self.exhausted.set()


class _GatedStore(FileCheckpointer):
    """A file store whose first slice is stored only once ``gate`` opens (or 10 s pass)."""

    def __init__(self, location: str, gate: threading.Event) -> None:
        super().__init__(location)
        self.gate, self.gate_opened = gate, False

    async def save_snapshot(
        self, checkpoint_id: CheckpointId, operator: str, partition: int, data: bytes
    ) -> str:
        if partition == 0:
            self.gate_opened = await asyncio.to_thread(self.gate.wait, 10)
        return await super().save_snapshot(checkpoint_id, operator, partition, data)


def test_the_source_is_polled_on_while_a_slice_is_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two slices of five batches: the first slice's store waits for the source's last poll,
    # which comes only if polling does not wait for the store.
    monkeypatch.setattr(read_log, "SLICE_BYTES", ids_batch(0, 10).nbytes * 5)
    source = _Polled(10)
    store = _GatedStore(str(tmp_path), source.exhausted)

    entry = asyncio.run(ReadLog(store, "polled").append(source, IDS_SCHEMA))

    assert store.gate_opened, "polling stopped until the first slice was stored"
    assert [logged.rows for logged in entry.slices] == [50, 50]
    assert read_ids(ReadLog(store, "polled"), entry) == list(range(100))


def test_the_event_loop_runs_between_two_polls_of_a_source_that_never_awaits(
    tmp_path: Path,
) -> None:
    # The slices being stored get on only when the loop runs: a source whose poll_batch
    # never awaits would otherwise hold it from the first batch to the last.
    async def append_counting_loop_turns() -> list[int]:
        loop, turns = asyncio.get_running_loop(), [0]

        def turn() -> None:
            turns[0] += 1
            loop.call_soon(turn)

        loop.call_soon(turn)
        seen = []

        async def polled() -> AsyncIterator[pa.RecordBatch]:
            for number in range(20):
                seen.append(turns[0])
                yield ids_batch(number * 10, 10)

        await log_at(tmp_path).append(polled(), IDS_SCHEMA)
        return seen

    seen = asyncio.run(append_counting_loop_turns())

    assert all(before < after for before, after in itertools.pairwise(seen)), seen


def _slices_in_the_making() -> list[asyncio.Task[object]]:
    return [
        task
        for task in asyncio.all_tasks()
        if not task.done()
        and getattr(task.get_coro(), "__qualname__", None) == ReadLog._store_slice.__qualname__
    ]


def test_a_slice_that_cannot_be_stored_stops_the_polling_and_leaves_no_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(read_log, "SLICE_BYTES", ids_batch(0, 10).nbytes)
    source = _Polled(100)
    store = FileCheckpointer(str(tmp_path))

    async def failing_save(*_: object) -> str:
        raise CheckpointError(f"cannot write under {tmp_path}: disk full")

    monkeypatch.setattr(store, "save_snapshot", failing_save)

    async def append() -> list[asyncio.Task[object]]:
        with pytest.raises(CheckpointError, match="disk full"):
            await ReadLog(store, "polled").append(source, IDS_SCHEMA)
        return _slices_in_the_making()

    assert asyncio.run(append()) == [], "a slice's task is left running"
    assert source.polled <= 2 + read_log.SLICES_IN_FLIGHT, "it polled on past the failure"


def test_a_source_that_fails_mid_poll_has_its_error_raised_and_leaves_no_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(read_log, "SLICE_BYTES", ids_batch(0, 10).nbytes)
    source = _Polled(10, fail_at=6)

    async def append() -> list[asyncio.Task[object]]:
        with pytest.raises(ReadError, match="disk went away"):
            await log_at(tmp_path).append(source, IDS_SCHEMA)
        return _slices_in_the_making()

    assert asyncio.run(append()) == [], "a slice's task is left running"
