"""PostgreSQL at both ends of real Spark pipelines (``laminar run``, ``local[2]``).

- ``generator → postgres-2pc``: the two-phase sink is a distributed-commit sink, so each Spark
  write task prepares a transaction of its own and the driver commits them all;
- ``postgres-cdc → files``: a table's changes, read from a replication slot advanced at each
  micro-batch's start (``slot.advance=on-restore``), published as Parquet files exactly once.

Each pipeline runs to its end once, and once more killed (SIGKILL) — after epoch 1's commit
was decided, or while the source reads it — and restarted: either way a reader sees every id
exactly once. Each run starts a Spark driver (about half a minute on two cores), so the
module runs under ``full``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from laminar_conformance.spark import run_pipeline_file

from laminar_plugin_postgres import create_slot

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.full,
    pytest.mark.skipif(
        importlib.util.find_spec("pyspark") is None, reason="needs laminar-sdk[spark]"
    ),
]

ROWS = 1200
PER_EPOCH = 300

GENERATOR_TO_POSTGRES = """\
[source]
connector = "generator"
rows = {rows}
partitions = 2

[sink]
connector = "postgres-2pc"
dsn = "{dsn}"
"password.file" = "{password_file}"
table = "{table}"
schema = "id int64, partition int32, value double"
"table.create" = true

[pipeline]
delivery = "exactly-once"
checkpoint_location = "{checkpoint}"
max_records_per_batch = {per_epoch}
"""

CDC_TO_FILES = """\
[source]
connector = "postgres-cdc"
dsn = "{dsn}"
"password.file" = "{password_file}"
table = "{table}"
slot = "{table}"
publication = "{table}"

[transform]
sql = "SELECT after.id AS id, op FROM source WHERE op = 'insert'"

[sink]
connector = "files"
path = "{output}"
schema = '{schema}'

[pipeline]
delivery = "exactly-once"
checkpoint_location = "{checkpoint}"
max_records_per_batch = {per_epoch}
"""


def run_killed_then_to_the_end(pipeline: Path, crash_at: str | None) -> None:
    if crash_at is not None:
        log = pipeline.with_name("killed.log")
        assert run_pipeline_file(pipeline, log, crash=crash_at) != 0, log.read_text()[-3000:]
        assert log.with_suffix(".crash").exists(), f"not killed at {crash_at}"
    log = pipeline.with_name("finished.log")
    assert run_pipeline_file(pipeline, log) == 0, log.read_text(errors="replace")[-3000:]


@pytest.mark.parametrize("crash_at", [None, "commit:1"], ids=["clean", "killed"])
def test_generator_to_postgres_in_parallel_prepared_transactions(database, tmp_path, crash_at):
    table = database.name("spark_sink")
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(
        GENERATOR_TO_POSTGRES.format(
            rows=ROWS // 2,  # per partition
            per_epoch=PER_EPOCH,
            dsn=database.service.dsn,
            password_file=database.service.password_file,
            table=table,
            checkpoint=tmp_path / "checkpoint",
        )
    )
    run_killed_then_to_the_end(pipeline, crash_at)
    assert database.ids(table) == list(range(ROWS))
    assert not database.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (f"%{table}%",)
    )
    committed = database.execute(
        "SELECT epoch FROM laminar_sink_epochs WHERE sink_id = %s AND partition = '*'",
        (f"public.{table}",),
    )
    assert committed == [(ROWS // PER_EPOCH - 1,)]


@pytest.mark.parametrize(
    "crash_at",
    [None, "source-read:1"],
    ids=["clean", "killed"],
)
def test_postgres_changes_to_files_exactly_once(database, tmp_path, crash_at):
    table = database.name("spark_cdc")
    database.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, note text)")
    database.execute(f"CREATE PUBLICATION {table} FOR TABLE {table}")
    created_at = asyncio.run(create_slot({**database.properties(), "slot": table}))
    for start in range(0, ROWS, 100):  # twelve transactions
        database.execute(
            f"INSERT INTO {table} SELECT i, 'n' FROM generate_series({start}, {start + 99}) i"
        )
    database.execute(f"UPDATE {table} SET note = 'changed' WHERE id < 10")
    schema = json.dumps([{"name": "id", "type": "int64"}, {"name": "op", "type": "string"}])
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(
        CDC_TO_FILES.format(
            dsn=database.service.dsn,
            password_file=database.service.password_file,
            table=table,
            output=tmp_path / "out",
            schema=schema,
            checkpoint=tmp_path / "checkpoint",
            per_epoch=PER_EPOCH,
        )
    )
    run_killed_then_to_the_end(pipeline, crash_at)
    table_read = ds.dataset(str(tmp_path / "out"), format="parquet").to_table()
    assert sorted(table_read.column("id").to_pylist()) == list(range(ROWS))
    advanced = database.execute(
        "SELECT confirmed_flush_lsn > %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
        (created_at, table),
    )
    assert advanced == [(True,)], "the slot was never advanced past what the pipeline committed"
    database.execute(f"DROP PUBLICATION {table}")
