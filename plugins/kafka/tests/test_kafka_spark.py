"""Kafka on both ends of a Spark pipeline (``laminar run``), its driver killed and restarted.

The pipeline reads a topic with the ``kafka`` source, keeps ``key`` and ``value`` with a SQL
transform and writes another topic with the exactly-once ``kafka`` sink. It is SIGKILLed
twice — after an epoch's commit was decided (the sink must publish it from its staged copy in
a new process), then while the source reads a micro-batch — and run a third time to the end.
A ``read_committed`` reader of the output topic then sees every id exactly once.
"""

from __future__ import annotations

import importlib.util

import pytest
from laminar_conformance.spark import run_pipeline_file

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("pyspark") is None, reason="needs laminar-sdk[spark]"
    ),
]

IDS = 600
PARTITIONS = 2
RECORDS_PER_EPOCH = 100

PIPELINE = """\
[source]
connector = "kafka"
"bootstrap.servers" = "{bootstrap}"
topic = "{source_topic}"

[transform]
sql = "SELECT key, value FROM source"

[sink]
connector = "kafka"
"bootstrap.servers" = "{bootstrap}"
topic = "{sink_topic}"

[pipeline]
delivery = "exactly-once"
checkpoint_location = "{checkpoint}"
master = "local[2]"
trigger = "available-now"
max_records_per_batch = {records_per_epoch}
"""


@pytest.mark.parametrize(
    "kills",
    [
        # Nightly too: in CI the Kafka plugin runs against the broker without Spark, and the
        # Spark bridge's kills are the SDK's own tests'.
        pytest.param(("commit:1",), id="in-its-commit", marks=pytest.mark.full),
        # Nightly: a kill in the source's read too (CI kills there with a live source, in the
        # SDK's tests/spark/test_live_source_recovery.py).
        pytest.param(("commit:1", "source-read:3"), id="then-in-a-read", marks=pytest.mark.full),
    ],
)
def test_kafka_to_kafka_killed_delivers_every_id_once(kafka, tmp_path, kills):
    source_topic, sink_topic = kafka.topic(PARTITIONS), kafka.topic(PARTITIONS)
    for partition in range(PARTITIONS):
        ids = range(partition, IDS, PARTITIONS)
        kafka.produce(source_topic, [str(i).encode() for i in ids], partition=partition)
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(
        PIPELINE.format(
            bootstrap=kafka.bootstrap,
            source_topic=source_topic,
            sink_topic=sink_topic,
            checkpoint=tmp_path / "checkpoint",
            records_per_epoch=RECORDS_PER_EPOCH,
        )
    )

    # Without staging.dir, the sink keeps pre-committed epochs in the laminar checkpoint location.
    staging = tmp_path / "checkpoint" / "laminar" / "state" / "sink.kafka"
    for crash_at in kills:
        run = crash_at.split(":")[0]
        log = tmp_path / f"killed-at-{run}.log"
        status = run_pipeline_file(pipeline, log, crash=crash_at)
        assert status != 0, log.read_text(errors="replace")[-3000:]
        crash_record = log.with_suffix(".crash")
        assert crash_record.exists(), f"not killed at {crash_at}: {log.read_text()[-3000:]}"
        if run == "commit":
            staged = [path.name for path in staging.rglob("*.arrow")]
            assert staged == ["epoch-1.arrow"], "the decided epoch waits there for its commit"
    finished = tmp_path / "finished.log"
    assert run_pipeline_file(pipeline, finished) == 0, finished.read_text()[-3000:]

    assert kafka.committed_ids(sink_topic, PARTITIONS) == list(range(IDS))
    assert not list(staging.rglob("*.arrow")), "staged copies left behind"
