"""The ``memory`` sink: two-phase commit on the filesystem, surviving restarts."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from laminar_sdk import (
    ConfigurationError,
    ConnectorConfig,
    InvalidState,
    SchemaMismatch,
    WriteResult,
)
from laminar_sdk.reference import IDS_SCHEMA, WIDE_SCHEMA, GeneratorSource, MemorySink, ids_batch


def opened(run, path: Path, schema: str = "ids") -> MemorySink:
    sink = MemorySink()
    run(sink.open(ConnectorConfig("memory", {"path": str(path), "schema": schema})))
    return sink


def write_epoch(run, sink: MemorySink, epoch: int, *batches: list[int], commit: bool = True):
    run(sink.begin_epoch(epoch))
    for ids in batches:
        run(sink.write_batch(ids_batch(ids)))
    run(sink.pre_commit(epoch))
    if commit:
        run(sink.commit_epoch(epoch))


def test_an_epoch_becomes_visible_at_commit_and_not_before(run, tmp_path):
    sink = opened(run, tmp_path)
    run(sink.begin_epoch(0))
    assert run(sink.write_batch(ids_batch([1, 2]))) == WriteResult(2, ids_batch([1, 2]).nbytes)
    run(sink.write_batch(ids_batch([3])))
    assert MemorySink.committed_ids(tmp_path) == []
    run(sink.pre_commit(0))
    assert MemorySink.committed_ids(tmp_path) == [], "pre-committed is not visible"
    run(sink.commit_epoch(0))
    assert MemorySink.committed_ids(tmp_path) == [1, 2, 3]
    run(sink.commit_epoch(0))
    assert MemorySink.committed_ids(tmp_path) == [1, 2, 3], "committing again does nothing"
    write_epoch(run, sink, 1, [4])
    assert MemorySink.committed_table(tmp_path).equals(
        pa.Table.from_batches([ids_batch([1, 2]), ids_batch([3]), ids_batch([4])])
    )


def test_an_empty_epoch_commits_and_is_recognised_later(run, tmp_path):
    write_epoch(run, opened(run, tmp_path), 0)
    assert MemorySink.committed_ids(tmp_path) == []
    replay = opened(run, tmp_path)
    run(replay.begin_epoch(0))
    assert run(replay.write_batch(ids_batch([1]))) == WriteResult(0)


def test_a_rolled_back_epoch_leaves_no_trace(run, tmp_path):
    sink = opened(run, tmp_path)
    write_epoch(run, sink, 0, [1])
    write_epoch(run, sink, 1, [2, 3], commit=False)
    run(sink.rollback_epoch(1))
    run(sink.rollback_epoch(1))  # idempotent
    run(sink.rollback_epoch(7))  # never begun: nothing to do
    assert MemorySink.committed_ids(tmp_path) == [1]
    assert list((tmp_path / "_staging").iterdir()) == []
    with pytest.raises(InvalidState, match="rolled back"):
        run(sink.commit_epoch(1))


def test_a_new_instance_rolls_back_an_epoch_pre_committed_before_a_crash(run, tmp_path):
    crashed = opened(run, tmp_path)
    write_epoch(run, crashed, 0, [1])
    write_epoch(run, crashed, 1, [2, 3], commit=False)
    del crashed  # dies without close()

    restarted = opened(run, tmp_path)
    run(restarted.rollback_epoch(1))
    assert MemorySink.committed_ids(tmp_path) == [1]
    write_epoch(run, restarted, 1, [2, 3])  # the replay
    assert MemorySink.committed_ids(tmp_path) == [1, 2, 3]


def test_a_new_instance_commits_an_epoch_another_pre_committed(run, tmp_path):
    writer = opened(run, tmp_path)
    write_epoch(run, writer, 4, [7, 8], commit=False)
    run(writer.close())  # a pre-committed epoch survives close()
    committer = opened(run, tmp_path)  # e.g. Spark's commit() on a fresh writer instance
    run(committer.commit_epoch(4))
    assert MemorySink.committed_ids(tmp_path) == [7, 8]
    assert committer.metrics().custom["epochs_committed"] == 1


def test_a_committed_epoch_delivered_again_after_a_restart_is_skipped(run, tmp_path):
    write_epoch(run, opened(run, tmp_path), 0, [1, 2])
    restarted = opened(run, tmp_path)
    run(restarted.begin_epoch(0))
    assert run(restarted.write_batch(ids_batch([1, 2]))) == WriteResult(0)
    run(restarted.pre_commit(0))
    run(restarted.rollback_epoch(0))  # even a rollback of the replay keeps what was committed
    assert MemorySink.committed_ids(tmp_path) == [1, 2]
    write_epoch(run, restarted, 0, [1, 2])
    assert MemorySink.committed_ids(tmp_path) == [1, 2]
    assert restarted.metrics().custom["epochs_skipped"] == 2
    assert restarted.metrics().records_total == 0


def test_an_epoch_half_written_before_a_crash_starts_afresh(run, tmp_path):
    crashed = opened(run, tmp_path)
    run(crashed.begin_epoch(0))
    run(crashed.write_batch(ids_batch([1, 2])))
    del crashed
    restarted = opened(run, tmp_path)
    with pytest.raises(InvalidState, match="never pre-committed"):
        run(restarted.commit_epoch(0))
    write_epoch(run, restarted, 0, [1, 2])
    assert MemorySink.committed_ids(tmp_path) == [1, 2]


def test_a_new_attempt_at_an_epoch_discards_what_an_earlier_attempt_staged(run, tmp_path):
    crashed = opened(run, tmp_path)
    write_epoch(run, crashed, 0, [1, 2], [3], commit=False)  # pre-committed, then lost
    retry = opened(run, tmp_path)
    run(retry.begin_epoch(0))
    run(retry.write_batch(ids_batch([9])))
    with pytest.raises(InvalidState, match="never pre-committed"):
        run(opened(run, tmp_path).commit_epoch(0))
    run(retry.pre_commit(0))
    run(retry.commit_epoch(0))
    assert MemorySink.committed_ids(tmp_path) == [9]


def test_calls_out_of_protocol_order_are_refused(run, tmp_path):
    sink = opened(run, tmp_path)
    with pytest.raises(InvalidState, match="begin_epoch"):
        run(sink.write_batch(ids_batch([1])))
    run(sink.begin_epoch(0))
    with pytest.raises(InvalidState, match="while epoch 0 is being written"):
        run(sink.begin_epoch(1))
    with pytest.raises(InvalidState, match="pre_commit"):
        run(sink.commit_epoch(0))
    with pytest.raises(InvalidState, match="begin_epoch"):
        run(sink.pre_commit(1))
    run(sink.pre_commit(0))
    with pytest.raises(InvalidState, match="pre-committed"):
        run(sink.write_batch(ids_batch([1])))
    with pytest.raises(ValueError, match="epoch"):
        run(sink.rollback_epoch(-1))


def test_the_sink_declares_exactly_once_with_two_phase_commit():
    capabilities = MemorySink().capabilities()
    assert capabilities.exactly_once
    assert capabilities.two_phase_commit
    assert capabilities.idempotent
    assert not capabilities.partitioned


@pytest.mark.parametrize(
    ("batch", "named"),
    [
        (ids_batch([1]).drop_columns(["value"]), "missing column(s) value"),
        (
            ids_batch([1]).append_column("extra", pa.array([1])),
            "unexpected column(s) extra",
        ),
        (
            ids_batch([1]).set_column(0, "id", pa.array(["1"])),
            "column 'id' is string, expected int64",
        ),
        (ids_batch([1]).select(["partition", "id", "value"]), "order partition, id, value"),
    ],
)
def test_a_batch_of_another_schema_is_refused_naming_the_difference(run, tmp_path, batch, named):
    sink = opened(run, tmp_path)
    run(sink.begin_epoch(0))
    with pytest.raises(SchemaMismatch) as error:
        run(sink.write_batch(batch))
    assert named in str(error.value)


def test_non_nullable_columns_are_accepted_where_the_schema_allows_nulls(run, tmp_path):
    strict = pa.schema([pa.field(f.name, f.type, nullable=False) for f in IDS_SCHEMA])
    batch = pa.RecordBatch.from_arrays(ids_batch([5]).columns, schema=strict)
    write_epoch(run, opened(run, tmp_path), 0, [1])
    sink = opened(run, tmp_path)
    run(sink.begin_epoch(1))
    run(sink.write_batch(batch))
    run(sink.pre_commit(1))
    run(sink.commit_epoch(1))
    assert MemorySink.committed_table(tmp_path).schema.equals(IDS_SCHEMA)
    assert MemorySink.committed_ids(tmp_path) == [1, 5]


def test_the_wide_schema_takes_the_generators_wide_rows(run, tmp_path):
    source = GeneratorSource()
    run(source.open(ConnectorConfig("generator", {"schema": "wide", "rows": "5"})))
    sink = opened(run, tmp_path, schema="wide")
    run(sink.begin_epoch(0))
    run(sink.write_batch(run(source.poll_batch(10)).records))
    run(sink.pre_commit(0))
    run(sink.commit_epoch(0))
    table = MemorySink.committed_table(tmp_path)
    assert table.schema.equals(WIDE_SCHEMA)
    assert table.column("id").to_pylist() == [0, 1, 2, 3, 4]


def test_a_path_keeps_the_schema_it_was_first_opened_with(run, tmp_path):
    opened(run, tmp_path, schema="ids")
    with pytest.raises(ConfigurationError, match="'ids'") as error:
        opened(run, tmp_path, schema="wide")
    assert error.value.key == "schema"


def test_configuration_errors_name_the_key(run, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("")
    for properties, key in [
        ({}, "path"),
        ({"path": str(a_file)}, "path"),
        ({"path": str(tmp_path / "under-a-file")}, "schema"),
    ]:
        if key == "schema":
            properties["schema"] = "idz"
        with pytest.raises(ConfigurationError) as error:
            run(MemorySink().open(ConnectorConfig("memory", properties)))
        assert error.value.key == key


def test_reading_a_path_no_sink_was_opened_at(tmp_path):
    assert MemorySink.committed_ids(tmp_path) == []
    with pytest.raises(InvalidState, match="no memory sink"):
        MemorySink.committed_table(tmp_path)


CRASHING_WRITER = """
import asyncio, os, signal, sys
import pyarrow as pa
from laminar_sdk import load_connector_registry

def batch(ids):
    return pa.RecordBatch.from_pydict({
        "id": pa.array(ids, pa.int64()),
        "partition": pa.array([0] * len(ids), pa.int32()),
        "value": pa.array([float(i) for i in ids]),
    })

async def main():
    sink, _ = await load_connector_registry().open_sink("memory", {"path": sys.argv[1]})
    await sink.begin_epoch(0)
    await sink.write_batch(batch([1, 2]))
    await sink.pre_commit(0)
    await sink.commit_epoch(0)
    await sink.begin_epoch(1)
    await sink.write_batch(batch([3]))
    await sink.pre_commit(1)
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


def test_a_killed_process_leaves_state_a_new_process_recovers(run, tmp_path):
    """Nothing the recovery needs lives in the killed process's memory."""
    killed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CRASHING_WRITER), str(tmp_path)], check=False
    )
    assert killed.returncode == -signal.SIGKILL
    assert MemorySink.committed_ids(tmp_path) == [1, 2]
    restarted = opened(run, tmp_path)
    run(restarted.rollback_epoch(1))  # its runtime record never said "commit"
    write_epoch(run, restarted, 0, [1, 2])  # Spark re-runs epoch 0 too: skipped
    write_epoch(run, restarted, 1, [3])
    assert MemorySink.committed_ids(tmp_path) == [1, 2, 3]


class SinkProtocol(RuleBasedStateMachine):
    """Any order of epochs, crashes and recoveries a runtime may produce.

    The model is what a reader must see: the ids of each committed epoch, once.
    """

    def __init__(self) -> None:
        super().__init__()
        self.path = Path(tempfile.mkdtemp())
        self.sink = self._new_sink()
        self.committed: dict[int, list[int]] = {}
        self.open_epoch: int | None = None
        self.phase = ""  # "writing", "pre-committed" or "skipping" while an epoch is open
        self.written: list[int] = []
        self.pre_committed_by_crashed: dict[int, list[int]] = {}
        self.abandoned: set[int] = set()  # epochs a crashed instance left half written
        self.next_epoch = 0
        self.next_id = 0

    def _new_sink(self) -> MemorySink:
        sink = MemorySink()
        asyncio.run(sink.open(ConnectorConfig("memory", {"path": str(self.path)})))
        return sink

    def teardown(self) -> None:
        shutil.rmtree(self.path)

    @precondition(lambda self: self.open_epoch is None)
    @rule(data=st.data())
    def begin(self, data):
        candidates = [
            self.next_epoch,
            *self.committed,
            *self.pre_committed_by_crashed,
            *self.abandoned,
        ]
        epoch = data.draw(st.sampled_from(candidates), label="epoch")
        asyncio.run(self.sink.begin_epoch(epoch))
        self.next_epoch = max(self.next_epoch, epoch + 1)
        self.pre_committed_by_crashed.pop(epoch, None)  # a new attempt starts afresh
        self.abandoned.discard(epoch)
        self.open_epoch, self.written = epoch, []
        self.phase = "skipping" if epoch in self.committed else "writing"

    @precondition(lambda self: self.phase in ("writing", "skipping"))
    @rule(count=st.integers(0, 3))
    def write(self, count):
        ids = list(range(self.next_id, self.next_id + count))
        self.next_id += count
        result = asyncio.run(self.sink.write_batch(ids_batch(ids)))
        if self.phase == "writing":
            self.written += ids
            assert result.records_written == count
        else:
            assert result == WriteResult(0)

    @precondition(lambda self: self.open_epoch is not None)
    @rule()
    def pre_commit(self):
        asyncio.run(self.sink.pre_commit(self.open_epoch))
        if self.phase == "writing":
            self.phase = "pre-committed"

    @precondition(lambda self: self.phase in ("pre-committed", "skipping"))
    @rule()
    def commit(self):
        asyncio.run(self.sink.commit_epoch(self.open_epoch))
        if self.phase == "pre-committed":
            self.committed[self.open_epoch] = self.written
        self.open_epoch, self.phase = None, ""

    @precondition(lambda self: self.open_epoch is not None)
    @rule()
    def rollback(self):
        asyncio.run(self.sink.rollback_epoch(self.open_epoch))
        self.open_epoch, self.phase = None, ""

    @rule()
    def crash(self):
        if self.phase == "pre-committed":
            self.pre_committed_by_crashed[self.open_epoch] = self.written
        elif self.phase == "writing":
            self.abandoned.add(self.open_epoch)
        self.sink = self._new_sink()
        self.open_epoch, self.phase = None, ""

    @precondition(lambda self: self.open_epoch is None and self.pre_committed_by_crashed)
    @rule(data=st.data(), decided=st.booleans())
    def recover(self, data, decided):
        """The runtime commits a pending epoch whose record says so, else rolls it back."""
        epoch = data.draw(st.sampled_from(sorted(self.pre_committed_by_crashed)), label="pending")
        ids = self.pre_committed_by_crashed.pop(epoch)
        if decided:
            asyncio.run(self.sink.commit_epoch(epoch))
            self.committed[epoch] = ids
        else:
            asyncio.run(self.sink.rollback_epoch(epoch))

    @invariant()
    def readers_see_each_committed_epoch_once(self):
        expected = [i for epoch in sorted(self.committed) for i in self.committed[epoch]]
        assert MemorySink.committed_ids(self.path) == expected


SinkProtocol.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
test_sink_protocol = SinkProtocol.TestCase
