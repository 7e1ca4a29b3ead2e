"""The ``postgres`` sink on a real server: types, tables, modes, and failures mid-write."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import json
import time

import psycopg
import pyarrow as pa
import pytest
from laminar_conformance.services import Toxic, toxiproxy_server
from laminar_sdk import (
    CheckpointError,
    ConfigurationError,
    ConnectorRole,
    EpochCoordinator,
    HealthState,
    PartitionRange,
    SchemaMismatch,
    SourceCheckpoint,
    TransactionError,
    load_connector_registry,
    open_checkpointer,
)
from psycopg import sql

from laminar_plugin_postgres import _sink as sink_module

REGISTRY = load_connector_registry()

WIDE = pa.schema(
    [
        pa.field("i16", pa.int16()),
        pa.field("i32", pa.int32()),
        pa.field("i64", pa.int64()),
        pa.field("f32", pa.float32()),
        pa.field("f64", pa.float64()),
        pa.field("amount", pa.decimal128(12, 3)),
        pa.field("name", pa.string()),
        pa.field("flag", pa.bool_()),
        pa.field("blob", pa.binary()),
        pa.field("day", pa.date32()),
        pa.field("at", pa.timestamp("us")),
        pa.field("at_utc", pa.timestamp("us", "UTC")),
        pa.field("tags", pa.list_(pa.string())),
        pa.field("scores", pa.list_(pa.int64())),
    ]
)
WIDE_ROWS = [
    {
        "i16": -3,
        "i32": 70000,
        "i64": 2**40,
        "f32": 1.5,
        "f64": float("inf"),
        "amount": decimal.Decimal("12345.678"),
        "name": 'comma, "quote", new\nline, back\\slash',
        "flag": True,
        "blob": b"\x00\xff\x10",
        "day": datetime.date(2024, 2, 29),
        "at": datetime.datetime(2024, 1, 2, 3, 4, 5, 678901),
        "at_utc": datetime.datetime(2024, 1, 2, 3, 4, 5, 1, tzinfo=datetime.UTC),
        "tags": ["a", 'b "c"', None, "{d}"],
        "scores": [1, None, 3],
    },
    dict.fromkeys(WIDE.names),
    {**dict.fromkeys(WIDE.names), "name": "", "tags": [], "f64": float("nan")},
]


def properties(database, table, **extra):
    return {**database.properties(), "table": table, **extra}


async def write_epochs(config, epochs, *, start=0, connector="postgres"):
    """Write ``epochs`` (lists of batches) through a new instance of ``connector``."""
    sink, _ = await REGISTRY.open_sink(connector, config)
    try:
        for number, batches in enumerate(epochs, start=start):
            await sink.begin_epoch(number)
            for batch in batches:
                await sink.write_batch(batch)
            await sink.pre_commit(number)
            await sink.commit_epoch(number)
    finally:
        await sink.close()


@pytest.mark.parametrize("connector", ["postgres", "postgres-2pc"])
def test_every_type_is_written_and_read_back_unchanged(database, tmp_path, connector):
    sink_table, batch = database.name(), pa.RecordBatch.from_pylist(WIDE_ROWS, schema=WIDE)
    config = properties(
        database,
        sink_table,
        schema=",".join(f"{f.name} {_alias(f.type)}" for f in WIDE),
        **{"table.create": "true"},
    )
    if connector == "postgres":
        config["staging.location"] = str(tmp_path)
    asyncio.run(write_epochs(config, [[batch]], connector=connector))
    declared = dict(
        database.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s",
            (sink_table,),
        )
    )
    assert declared["i64"] == "bigint"
    assert declared["amount"] == "numeric"
    assert declared["at_utc"] == "timestamp with time zone"
    assert declared["tags"] == "ARRAY"

    async def read_back():
        """The rows as polling reads them, and as range reads (Spark's) do."""
        source, _ = await REGISTRY.open_source(
            "postgres", properties(database, sink_table, key="i64", columns=",".join(WIDE.names))
        )
        try:
            assert source.schema().equals(WIDE), source.schema()
            polled = await source.poll_batch(10)
            assert await source.poll_batch(10) is None
            end = await source.plan_end(SourceCheckpoint(), None)
            ranged = []
            for partition, offset in sorted(end.offsets.items()):
                batches = source.read_range(PartitionRange(partition, None, offset))
                ranged += [batch async for batch in batches]
            return polled.records, ranged
        finally:
            await source.close()

    # The keyset source skips rows whose key is NULL: read the two other rows by their key.
    database.execute(
        sql.SQL("UPDATE {} SET i64 = 0 WHERE i64 IS NULL").format(sql.Identifier(sink_table))
    )
    polled, ranged = asyncio.run(read_back())
    assert all(batch.schema.equals(WIDE) for batch in ranged), [b.schema for b in ranged]
    # The same rows, either way (NaN is in them: compared by repr; the two keys 0 in any order).
    assert sorted(map(repr, pa.Table.from_batches(ranged).to_pylist())) == sorted(
        map(repr, polled.to_pylist())
    )
    rows = polled.to_pylist()
    first = next(row for row in rows if row["i64"] == 2**40)
    assert first == WIDE_ROWS[0] | {"tags": ["a", 'b "c"', None, "{d}"]}
    nulls = [row for row in rows if row["i64"] == 0]
    assert {row["name"] for row in nulls} == {None, ""}
    assert any(row["tags"] == [] for row in nulls)


def _alias(data_type):
    return {
        pa.decimal128(12, 3): "decimal128(12, 3)",
        pa.timestamp("us", "UTC"): "timestamp[us, tz=UTC]",
        pa.list_(pa.string()): "list<string>",
        pa.list_(pa.int64()): "list<int64>",
        pa.float32(): "float",
        pa.float64(): "double",
    }.get(data_type, str(data_type))


def test_an_existing_table_is_checked_naming_the_column_that_does_not_fit(database, tmp_path):
    table = database.name()
    database.execute(f"CREATE TABLE {table} (id bigint NOT NULL, name text, n integer NOT NULL)")
    base = properties(database, table, **{"staging.location": str(tmp_path)})
    cases = [
        ("id int64, name int64, n int32", "column 'name' of table public."),
        ("id int64, nickname string, n int32", "'nickname' is not a column"),
        ("id int64, name string", "column 'n' of table public."),
        ("id int64, name string, n int64", "column 'n' of table"),
    ]

    async def open_with(schema):
        sink, _ = await REGISTRY.open_sink("postgres", {**base, "schema": schema})
        await sink.close()

    for schema, message in cases:
        with pytest.raises(SchemaMismatch, match=message):
            asyncio.run(open_with(schema))
    asyncio.run(open_with("id int64, name string, n int32"))
    with pytest.raises(ConfigurationError, match="does not exist") as caught:
        asyncio.run(open_with_table(database, "missing_table", tmp_path))
    assert caught.value.key == "table"


async def open_with_table(database, table, tmp_path):
    sink, _ = await REGISTRY.open_sink(
        "postgres", properties(database, table, **{"staging.location": str(tmp_path)})
    )
    await sink.close()


def test_a_batch_of_another_schema_is_refused_naming_the_column(database, tmp_path):
    table = database.name()
    database.execute(f"CREATE TABLE {table} (id bigint, name text)")

    async def scenario():
        sink, _ = await REGISTRY.open_sink(
            "postgres", properties(database, table, **{"staging.location": str(tmp_path)})
        )
        await sink.begin_epoch(0)
        try:
            await sink.write_batch(pa.RecordBatch.from_pydict({"id": [1], "name": [2]}))
        finally:
            await sink.close()

    with pytest.raises(SchemaMismatch, match="column 'name' of the batch is int64"):
        asyncio.run(scenario())


def test_upsert_keeps_the_last_row_of_each_key(database):
    table = database.name()
    database.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, v text)")
    config = properties(database, table, key="id")
    first = pa.RecordBatch.from_pydict({"id": [1, 2, 1], "v": ["a", "b", "c"]})
    second = pa.RecordBatch.from_pydict({"id": [2, 3], "v": ["B", "C"]})
    asyncio.run(write_epochs(config, [[first], [second]], connector="postgres-upsert"))
    asyncio.run(
        write_epochs(config, [[second]], start=1, connector="postgres-upsert")
    )  # a replayed epoch changes nothing
    assert database.execute(f"SELECT id, v FROM {table} ORDER BY id") == [
        (1, "c"),
        (2, "B"),
        (3, "C"),
    ]
    database.execute(f"CREATE TABLE {table}_nokey (id bigint, v text)")
    database.tables.append(f"{table}_nokey")
    with pytest.raises(ConfigurationError, match="no primary key or unique index") as caught:
        asyncio.run(
            write_epochs(
                properties(database, f"{table}_nokey", key="id"), [], connector="postgres-upsert"
            )
        )
    assert caught.value.key == "key"


def test_the_connection_dropped_mid_copy_is_a_clear_error_and_commits_nothing(database, tmp_path):
    table = database.name()
    database.execute(f"CREATE TABLE {table} (id bigint, payload text)")
    config = properties(database, table, **{"staging.location": str(tmp_path)})
    rows = 1_500_000
    big = pa.RecordBatch.from_pydict(
        {"id": pa.array(range(rows), pa.int64()), "payload": pa.array(["x" * 40] * rows)}
    )

    async def terminate_the_copy():
        while True:
            found = database.execute(
                "SELECT pid FROM pg_stat_activity WHERE query LIKE 'COPY %%' "
                "AND state = 'active' AND pid <> pg_backend_pid()"
            )
            if found:
                database.execute("SELECT pg_terminate_backend(%s)", (found[0][0],))
                return
            await asyncio.sleep(0.005)

    async def scenario():
        sink, _ = await REGISTRY.open_sink("postgres", config)
        await sink.begin_epoch(0)
        await sink.write_batch(
            pa.RecordBatch.from_pydict({"id": pa.array([-1], pa.int64()), "payload": ["first"]})
        )
        killer = asyncio.create_task(terminate_the_copy())

        async def write_and_pre_commit():
            # The COPY streams in the background: the loss surfaces in either call.
            await sink.write_batch(big)
            await sink.pre_commit(0)

        with pytest.raises(TransactionError) as caught:
            await write_and_pre_commit()
        await killer
        await sink.rollback_epoch(0)
        # The epoch, written again whole on the same instance, commits once.
        await sink.begin_epoch(0)
        await sink.write_batch(
            pa.RecordBatch.from_pydict({"id": pa.array([1, 2], pa.int64()), "payload": ["a", "b"]})
        )
        await sink.pre_commit(0)
        await sink.commit_epoch(0)
        await sink.close()
        return str(caught.value)

    message = asyncio.run(scenario())
    assert "connection was lost while writing epoch 0" in message
    assert "nothing of it was committed" in message
    assert database.ids(table) == [1, 2]


def test_two_phase_recovers_orphans_and_reports_them(database):
    table = database.name()
    database.execute(f"CREATE TABLE {table} (id bigint)")
    config = properties(database, table)
    batch = pa.RecordBatch.from_pydict({"id": pa.array([7, 8], pa.int64())})

    async def scenario():
        crashed, _ = await REGISTRY.open_sink("postgres-2pc", config)
        await crashed.begin_epoch(0)
        await crashed.write_batch(batch)
        await crashed.pre_commit(0)  # prepared; the process dies here, undecided
        restarted, _ = await REGISTRY.open_sink("postgres-2pc", config)
        prepared = database.execute("SELECT gid FROM pg_prepared_xacts")
        health = await restarted.health_check()
        await restarted.begin_epoch(0)  # the runtime replays the undecided epoch
        await restarted.write_batch(batch)
        await restarted.pre_commit(0)
        await restarted.commit_epoch(0)
        await restarted.commit_epoch(0)  # again, as recovery may: nothing happens
        left = database.execute("SELECT gid FROM pg_prepared_xacts")
        await restarted.close()
        return prepared, health, left

    prepared, health, left = asyncio.run(scenario())
    assert [gid for (gid,) in prepared if gid.startswith(f"laminar:public.{table}:0:")]
    assert health.is_healthy, "a transaction prepared a moment ago is no cause for concern"
    assert not [gid for (gid,) in left if table in gid]
    assert database.ids(table) == [7, 8]
    markers = database.execute(
        "SELECT partition, epoch FROM laminar_sink_epochs WHERE sink_id = %s",
        (f"public.{table}",),
    )
    assert markers == [("*", 0)]


def test_two_phase_an_old_instance_that_goes_on_commits_nothing_twice(database):
    # Presumed dead while writing epoch 0, the old instance goes on once a new one committed
    # epochs 0 and 1: it prepares epoch 0 again and commits it.
    table = database.name()
    database.execute(f"CREATE TABLE {table} (id bigint)")
    config = properties(database, table)

    def ids(*values):
        return pa.RecordBatch.from_pydict({"id": pa.array(values, pa.int64())})

    async def scenario():
        old, _ = await REGISTRY.open_sink("postgres-2pc", config)
        await old.begin_epoch(0)
        await old.write_batch(ids(1, 2))
        await write_epochs(config, [[ids(1, 2)], [ids(3)]], connector="postgres-2pc")
        await old.pre_commit(0)
        await old.commit_epoch(0)
        left = database.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (f"%{table}%",)
        )
        await old.close()
        return left

    assert asyncio.run(scenario()) == [], "the old instance's transaction is left prepared"
    assert sorted(database.ids(table)) == [1, 2, 3]


def test_a_prepared_transaction_rolled_back_by_hand_is_an_error_not_silent_loss(database):
    table = database.name()
    database.execute(f"CREATE TABLE {table} (id bigint)")
    config = properties(database, table)

    async def scenario():
        crashed, _ = await REGISTRY.open_sink("postgres-2pc", config)
        await crashed.begin_epoch(0)
        await crashed.write_batch(pa.RecordBatch.from_pydict({"id": pa.array([1], pa.int64())}))
        await crashed.pre_commit(0)
        (gid,) = database.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (f"%{table}%",)
        )[0]
        database.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        restarted, _ = await REGISTRY.open_sink("postgres-2pc", config)
        try:
            await restarted.commit_epoch(0)
        finally:
            await restarted.close()

    with pytest.raises(TransactionError, match="rolled back by hand"):
        asyncio.run(scenario())


def test_health_and_metrics(database, tmp_path):
    table = database.name()
    database.execute(f"CREATE TABLE {table} (id bigint)")
    config = properties(database, table, **{"staging.location": str(tmp_path)})
    batch = pa.RecordBatch.from_pydict({"id": pa.array([1, 2, 3], pa.int64())})

    async def scenario():
        sink, _ = await REGISTRY.open_sink("postgres", config)
        for _ in range(2):  # the second delivery of epoch 0 is skipped
            await sink.begin_epoch(0)
            await sink.write_batch(batch)
            await sink.pre_commit(0)
            await sink.commit_epoch(0)
        metrics, health = sink.metrics(), await sink.health_check()
        await sink.close()
        return metrics, health

    metrics, health = asyncio.run(scenario())
    assert health.is_healthy
    assert metrics.records_total == 3
    assert metrics.custom["epochs_skipped"] == 1
    assert json.dumps(metrics.custom)
    assert not list(tmp_path.rglob("*.arrow")), "the committed epoch's staged copy is removed"
    assert REGISTRY.get("postgres", ConnectorRole.SINK)


def test_health_reports_prepared_transactions_left_waiting(database, monkeypatch):
    monkeypatch.setattr(sink_module, "STALE_PREPARED_S", 0.0)
    table = database.name()
    database.execute(f"CREATE TABLE {table} (id bigint)")
    config = properties(database, table)

    async def scenario():
        crashed, _ = await REGISTRY.open_sink("postgres-2pc", config)
        await crashed.begin_epoch(0)
        await crashed.write_batch(pa.RecordBatch.from_pydict({"id": pa.array([1], pa.int64())}))
        await crashed.pre_commit(0)
        restarted, _ = await REGISTRY.open_sink("postgres-2pc", config)
        try:
            return await restarted.health_check()
        finally:
            await restarted.close()

    health = asyncio.run(scenario())
    assert health.state is HealthState.DEGRADED
    assert f"laminar:public.{table}:0:" in health.reason


@pytest.mark.parametrize("connector", ["postgres", "postgres-2pc"])
def test_a_query_started_over_with_the_same_sink_id_is_refused_until_given_a_new_one(
    database, tmp_path, connector
):
    # The finding: both checkpoint locations deleted "to start over", the same pipeline run
    # again; the sink skipped the new query's epochs as committed and the run said written.
    table = database.name()
    database.execute(f"CREATE TABLE {table} (id bigint)")
    # The append sink stages its pre-committed epochs; the two-phase one prepares them.
    staged = {"staging.location": str(tmp_path / "staging")} if connector == "postgres" else {}
    config = properties(database, table, **{"sink.id": f"loader-{table}"}, **staged)

    async def query(location, ids, sink_config):
        sink, _ = await REGISTRY.open_sink(connector, sink_config)
        try:
            coordinator = EpochCoordinator(open_checkpointer(str(location)), {"out": sink})
            await coordinator.recover()
            for epoch, batch in enumerate(ids):
                records = pa.RecordBatch.from_pydict({"id": pa.array(batch, pa.int64())})
                await coordinator.run_epoch(epoch, [records], {})
        finally:
            await sink.close()

    asyncio.run(query(tmp_path / "first", [[1, 2], [3]], config))
    with pytest.raises(CheckpointError) as refused:
        asyncio.run(query(tmp_path / "again", [[4, 5], [6]], config))
    message = str(refused.value)
    assert "sink 'out' records epochs up to 1 as committed" in message
    assert "a new sink.id" in message
    assert database.ids(table) == [1, 2, 3], "nothing of the new query was written"
    assert not database.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'laminar:%'")

    asyncio.run(query(tmp_path / "afresh", [[4, 5], [6]], {**config, "sink.id": f"{table}-2"}))
    assert database.ids(table) == [1, 2, 3, 4, 5, 6]


def test_a_call_whose_connection_keeps_answering_is_not_cut_however_long_it_takes(database):
    # network.timeout.s bounds silence, not work: through a link that delays every answer by
    # 0.4 s, a call of several round trips takes longer than the 1 s allowed, answered all
    # along, and must not be cut.
    table = database.name()
    database.execute(f"CREATE TABLE {table} (id bigint)")
    server = psycopg.conninfo.conninfo_to_dict(database.service.dsn)
    proxy = toxiproxy_server().proxy(f"{server['host']}:{server['port']}")
    host, _, port = proxy.listen.rpartition(":")
    dsn = psycopg.conninfo.make_conninfo(database.service.dsn, host=host, port=port)
    config = properties(database, table, dsn=dsn, **{"network.timeout.s": "1"})
    rows = pa.RecordBatch.from_pydict({"id": pa.array(range(1000), pa.int64())})
    seconds: dict[str, float] = {}

    async def timed(name, call):
        started = time.monotonic()
        await call
        seconds[name] = time.monotonic() - started

    async def scenario():
        sink, _ = await REGISTRY.open_sink("postgres-2pc", config)
        proxy.add(Toxic("slow", "latency", "downstream", {"latency": 400, "jitter": 0}))
        await timed("begin_epoch", sink.begin_epoch(0))
        await timed("write_batch", sink.write_batch(rows))
        await timed("pre_commit", sink.pre_commit(0))
        await timed("commit_epoch", sink.commit_epoch(0))
        proxy.clear()
        await sink.close()

    try:
        asyncio.run(scenario())
    finally:
        proxy.delete()
    assert max(seconds.values()) > 1.2, f"no call outlasted the timeout: {seconds}"
    assert sorted(database.ids(table)) == list(range(1000))
