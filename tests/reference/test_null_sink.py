"""The ``null`` sink: counts what arrives, for tests in another process too."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from laminar_sdk import ConfigurationError, ConnectorConfig, SchemaMismatch, WriteResult
from laminar_sdk.reference import EpochCount, GeneratorSource, NullSink


def generated(run, rows: int) -> pa.RecordBatch:
    source = GeneratorSource()
    run(source.open(ConnectorConfig("generator", {"rows": str(rows)})))
    return run(source.poll_batch(rows)).records


def opened(run, **properties: str) -> NullSink:
    sink = NullSink()
    run(sink.open(ConnectorConfig("null", properties)))
    return sink


def test_counts_records_and_bytes_and_keeps_nothing(run):
    sink = opened(run)
    batch = generated(run, 7)
    run(sink.begin_epoch(0))
    assert run(sink.write_batch(batch)) == WriteResult(7, batch.nbytes)
    run(sink.write_batch(batch))
    run(sink.pre_commit(0))
    run(sink.commit_epoch(0))
    metrics = sink.metrics()
    assert (metrics.records_total, metrics.bytes_total) == (14, 2 * batch.nbytes)


def test_per_epoch_counts_reach_a_reader_through_path(run, tmp_path):
    batch = generated(run, 5)
    sink = opened(run, path=str(tmp_path))
    for epoch, batches in [(0, 2), (1, 1), (0, 1)]:  # epoch 0 delivered twice
        run(sink.begin_epoch(epoch))
        for _ in range(batches):
            run(sink.write_batch(batch))
        run(sink.pre_commit(epoch))
        run(sink.commit_epoch(epoch))
    counts = NullSink.read_counts(tmp_path)
    assert [(c.epoch, c.records_written) for c in counts] == [(0, 10), (0, 5), (1, 5)]
    assert all(c.bytes_written == c.records_written // 5 * batch.nbytes for c in counts)
    for file in tmp_path.iterdir():
        assert json.loads(file.read_text())["records_written"] > 0, "each record is whole JSON"


def test_parallel_writers_of_one_epoch_both_count(run, tmp_path):
    batch = generated(run, 3)
    first, second = opened(run, path=str(tmp_path)), opened(run, path=str(tmp_path))
    for sink in (first, second):
        run(sink.begin_epoch(4))
        run(sink.write_batch(batch))
    for sink in (first, second):
        run(sink.pre_commit(4))
    assert NullSink.read_counts(tmp_path) == [EpochCount(4, 3, batch.nbytes)] * 2
    assert first.capabilities().partitioned


def test_a_rolled_back_epoch_is_not_recorded_and_nothing_claims_exactly_once(run, tmp_path):
    sink = opened(run, path=str(tmp_path))
    run(sink.begin_epoch(0))
    run(sink.write_batch(generated(run, 4)))
    run(sink.rollback_epoch(0))
    run(sink.begin_epoch(1))
    run(sink.write_batch(generated(run, 2)))
    run(sink.commit_epoch(1))
    assert [(c.epoch, c.records_written) for c in NullSink.read_counts(tmp_path)] == [(1, 2)]
    assert sink.metrics().records_total == 6, "metrics count every record received"
    capabilities = sink.capabilities()
    assert not capabilities.exactly_once
    assert not capabilities.two_phase_commit


def test_records_outside_an_epoch_are_recorded_under_none(run, tmp_path):
    sink = opened(run, path=str(tmp_path))
    run(sink.write_batch(generated(run, 2)))
    run(sink.flush())
    run(sink.begin_epoch(3))
    run(sink.write_batch(generated(run, 1)))
    run(sink.begin_epoch(4))  # epoch 3 never committed: its counts are flushed as epoch 3
    run(sink.close())
    assert [(c.epoch, c.records_written) for c in NullSink.read_counts(tmp_path)] == [
        (None, 2),
        (3, 1),
    ]


def test_without_path_nothing_is_written(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sink = opened(run)
    run(sink.begin_epoch(0))
    run(sink.write_batch(generated(run, 2)))
    run(sink.pre_commit(0))
    assert list(tmp_path.iterdir()) == []
    assert NullSink.read_counts(tmp_path / "missing") == []


def test_a_batch_of_another_schema_is_refused(run):
    sink = opened(run, schema="wide")
    with pytest.raises(SchemaMismatch, match="missing column"):
        run(sink.write_batch(generated(run, 1)))


def test_path_must_be_a_directory(run, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(ConfigurationError) as error:
        opened(run, path=str(a_file))
    assert error.value.key == "path"
