"""A Spark pipeline into a Delta table (``laminar run``, ``local[2]``), killed three times.

``generator → delta``: the sink is a distributed-commit sink, so Spark's write tasks write the
data files of each micro-batch in parallel and the driver commits them in one Delta
transaction. The pipeline is killed (SIGKILL) while a write task stages its files, inside the
driver's commit, and after an epoch's commit was recorded but before Spark's own commit log
(Spark then runs the micro-batch again), and finally runs to its end. Then every id is in the
table exactly once for each outside reader: ``deltalake``'s snapshot, its change data feed
(what an incremental reader such as a Delta streaming source sees), Polars' Delta reader, and
Spark with Delta's own connector (delta-spark's jars from Maven Central, in a process of its
own: ``delta_spark.py`` says which build reads on which Spark).
Four Spark drivers take about two minutes on two cores, so the module runs under ``full``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from laminar_conformance.spark import run_pipeline_file

from laminar_plugin_delta import APP_ID_PREFIX

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.full,
    pytest.mark.skipif(
        importlib.util.find_spec("pyspark") is None, reason="needs laminar-sdk[spark]"
    ),
]

HERE = Path(__file__).parent
ROWS = 1200
PER_EPOCH = 200
KILLS = ("pre-commit-inside:1", "commit-inside:2", "done:3")

GENERATOR_TO_DELTA = """\
[source]
connector = "generator"
rows = {rows}
partitions = 2

[sink]
connector = "delta"
path = "{table}"
"sink.id" = "spark-test"
schema = "id int64, partition int32, value double"
"table.create" = true
partition_by = "partition"
"table.properties" = "delta.enableChangeDataFeed=true"

[pipeline]
delivery = "exactly-once"
checkpoint_location = "{checkpoint}"
max_records_per_batch = {per_epoch}
"""


def inserted_ids(table: DeltaTable) -> list[int]:
    """Every id any version of ``table`` inserted, as its change data feed gives them."""
    changes = pa.table(table.load_cdf(starting_version=0))
    change_type = changes.column("_change_type").cast(pa.string())
    return sorted(pc.filter(changes.column("id"), pc.equal(change_type, "insert")).to_pylist())


def spark_delta_ids(table: Path) -> list[int]:
    """The table's ids as Spark with Delta's connector reads them, in a process of its own."""
    read = "import json, sys; from delta_spark import read_delta_ids; "
    read += "print(json.dumps(read_delta_ids(sys.argv[1])))"
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    result = subprocess.run(
        [sys.executable, "-c", read, str(table)],
        capture_output=True,
        text=True,
        env=environment,
        check=False,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ids: list[int] = json.loads(result.stdout.strip().splitlines()[-1])
    return ids


def test_generator_to_delta_killed_three_times_holds_every_id_once(tmp_path):
    table_path = tmp_path / "table"
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(
        GENERATOR_TO_DELTA.format(
            rows=ROWS // 2,  # per partition
            per_epoch=PER_EPOCH,
            table=table_path,
            checkpoint=tmp_path / "checkpoint",
        )
    )
    for number, crash_at in enumerate(KILLS):
        log = tmp_path / f"killed-{number}.log"
        assert run_pipeline_file(pipeline, log, crash=crash_at) != 0, log.read_text()[-3000:]
        assert log.with_suffix(".crash").exists(), f"not killed at {crash_at}"
    log = tmp_path / "finished.log"
    assert run_pipeline_file(pipeline, log) == 0, log.read_text(errors="replace")[-3000:]

    expected = list(range(ROWS))
    table = DeltaTable(str(table_path))
    snapshot = table.to_pyarrow_table(columns=["id"]).column("id").to_pylist()
    assert sorted(snapshot) == expected
    assert inserted_ids(table) == expected
    assert table.transaction_version(APP_ID_PREFIX + "spark-test") == ROWS // PER_EPOCH - 1
    if importlib.util.find_spec("polars") is not None:
        import polars as pl  # noqa: PLC0415

        assert sorted(pl.read_delta(str(table_path))["id"].to_list()) == expected
    assert spark_delta_ids(table_path) == expected
