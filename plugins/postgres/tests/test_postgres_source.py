"""The ``postgres`` (keyset) and ``postgres-cdc`` sources on a real server."""

from __future__ import annotations

import asyncio

import pytest
from laminar_sdk import (
    ConfigurationError,
    HealthState,
    PartitionRange,
    ReadError,
    SourceCheckpoint,
    load_connector_registry,
)

from laminar_plugin_postgres import create_slot, drop_slot

REGISTRY = load_connector_registry()


async def drain(source, max_records=1000):
    batches = []
    while (polled := await source.poll_batch(max_records)) is not None:
        batches.append(polled)
    return batches


def test_keyset_reads_a_composite_key_in_order_and_resumes_after_the_checkpoint(database):
    table = database.name()
    database.execute(f"CREATE TABLE {table} (updated_at timestamptz, id bigint, v text)")
    database.execute(
        f"INSERT INTO {table} SELECT '2024-01-01'::timestamptz + (i / 3) * interval '1 second', "
        f"i, 'v' || i FROM generate_series(1, 30) AS i"
    )
    config = {**database.properties(), "table": table, "key": "updated_at, id"}

    async def scenario():
        source, _ = await REGISTRY.open_source("postgres", config)
        first = await source.poll_batch(7)
        checkpoint = source.checkpoint()
        await source.close()
        database.execute(f"INSERT INTO {table} VALUES ('2030-01-01', 31, 'late')")
        restored, _ = await REGISTRY.open_source("postgres", config)
        await restored.restore(SourceCheckpoint.from_json(checkpoint.to_json()))
        rest = await drain(restored)
        await restored.close()
        return first, checkpoint, rest

    first, checkpoint, rest = asyncio.run(scenario())
    assert first.records.column("id").to_pylist() == list(range(1, 8))
    assert checkpoint.offsets == {"p0": '["2024-01-01 00:00:02+00", "7"]'}
    ids = [i for batch in rest for i in batch.records.column("id").to_pylist()]
    assert ids == list(range(8, 32))


def test_keyset_hash_partitions_split_the_rows_and_ranges_replay_them(database):
    table = database.name()
    database.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY)")
    database.execute(f"INSERT INTO {table} SELECT generate_series(1, 200)")
    config = {**database.properties(), "table": table, "key": "id", "partitions": "4"}

    async def scenario():
        source, _ = await REGISTRY.open_source("postgres", config)
        polled = await drain(source, 25)
        end = await source.plan_end(SourceCheckpoint(), None)
        ranges = {}
        for partition, offset in end.offsets.items():
            batches = source.read_range(PartitionRange(partition, None, offset))
            ranges[partition] = [i async for b in batches for i in b.column("id").to_pylist()]
        await source.close()
        return polled, ranges

    polled, ranges = asyncio.run(scenario())
    by_partition = {}
    for batch in polled:
        by_partition.setdefault(batch.partition.id, []).extend(
            batch.records.column("id").to_pylist()
        )
    assert sorted(by_partition) == ["p0", "p1", "p2", "p3"]
    assert sorted(i for ids in by_partition.values() for i in ids) == list(range(1, 201))
    assert all(ids == sorted(ids) for ids in by_partition.values())
    assert ranges == by_partition


def test_keyset_names_a_missing_key_column(database):
    table = database.name()
    database.execute(f"CREATE TABLE {table} (id bigint)")
    with pytest.raises(ConfigurationError, match="'nope'") as caught:
        asyncio.run(
            REGISTRY.open_source(
                "postgres", {**database.properties(), "table": table, "key": "nope"}
            )
        )
    assert caught.value.key == "key"


def cdc_table(database, identity_full=False):
    table = database.name("cdc")
    database.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, v text, n int)")
    if identity_full:
        database.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
    database.execute(f"CREATE PUBLICATION {table} FOR TABLE {table}")
    return table


def cdc_config(database, table, **extra):
    return {
        **database.properties(),
        "table": table,
        "slot": table,
        "publication": table,
        **extra,
    }


def drop_publication(database, table):
    database.execute(f"DROP PUBLICATION IF EXISTS {table}")


@pytest.mark.parametrize("identity_full", [False, True])
def test_cdc_returns_inserts_updates_and_deletes_with_keys_and_old_rows(database, identity_full):
    table = cdc_table(database, identity_full)
    config = cdc_config(database, table, **{"slot.create": "true"})

    async def scenario():
        source, _ = await REGISTRY.open_source("postgres-cdc", config)
        database.execute(f"INSERT INTO {table} VALUES (1, 'a', 10), (2, 'b', 20)")
        database.execute(f"UPDATE {table} SET v = 'A' WHERE id = 1")
        database.execute(f"DELETE FROM {table} WHERE id = 2")
        database.execute(f"TRUNCATE {table}")
        rows = [r for batch in await drain(source) for r in batch.records.to_pylist()]
        await source.close()
        return rows

    rows = asyncio.run(scenario())
    drop_publication(database, table)
    assert [r["op"] for r in rows] == ["insert", "insert", "update", "delete", "truncate"]
    assert [r["key"] for r in rows[:4]] == [{"id": 1}, {"id": 2}, {"id": 1}, {"id": 2}]
    assert rows[2]["after"] == {"id": 1, "v": "A", "n": 10}
    assert rows[3]["after"] is None
    if identity_full:
        assert rows[2]["before"] == {"id": 1, "v": "a", "n": 10}
        assert rows[3]["before"] == {"id": 2, "v": "b", "n": 20}
    else:
        assert rows[2]["before"] is None
        assert rows[3]["before"] is None
    assert rows[0]["xid"] == rows[1]["xid"] != rows[2]["xid"]
    assert rows[0]["commit_lsn"] < rows[2]["commit_lsn"] < rows[3]["commit_lsn"]
    assert rows[0]["commit_ts"].tzinfo is not None


def test_cdc_advances_the_slot_only_on_restore_and_refuses_an_older_checkpoint(database):
    table = cdc_table(database)
    config = cdc_config(database, table)
    lsn = asyncio.run(create_slot(config))
    assert "/" in lsn

    def confirmed():
        return database.execute(
            "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s",
            (table,),
        )[0][0]

    async def scenario():
        source, _ = await REGISTRY.open_source("postgres-cdc", config)
        database.execute(f"INSERT INTO {table} (id) SELECT generate_series(1, 5)")
        database.execute(f"INSERT INTO {table} (id) SELECT generate_series(6, 8)")
        first = await source.poll_batch(3)  # in the middle of the first transaction
        middle = source.checkpoint()
        await drain(source)
        end = source.checkpoint()
        before = confirmed()
        await source.close()
        resumed, _ = await REGISTRY.open_source("postgres-cdc", config)
        await resumed.restore(middle)  # durable: the slot moves to its last whole transaction
        after_middle = confirmed()
        rest = [r["after"]["id"] for b in await drain(resumed) for r in b.records.to_pylist()]
        await resumed.restore(end)
        after_end = confirmed()
        health = await resumed.health_check()
        metrics = resumed.metrics()
        await resumed.close()
        late, _ = await REGISTRY.open_source("postgres-cdc", config)
        try:
            with pytest.raises(ReadError, match="cannot be read again"):
                await late.restore(middle)
        finally:
            await late.close()
        return first, middle, end, before, after_middle, rest, after_end, health, metrics

    first, middle, end, before, after_middle, rest, after_end, health, metrics = asyncio.run(
        scenario()
    )
    assert [r["after"]["id"] for r in first.records.to_pylist()] == [1, 2, 3]
    assert middle.offsets[table].endswith("+3")
    assert before == lsn, "reading never moves the slot"
    assert after_middle == before, "the middle of the first transaction: nothing whole yet"
    assert rest == [4, 5, 6, 7, 8]
    assert str(after_end) == end.offsets[table]
    assert health.is_healthy
    assert metrics.custom["retained_wal_bytes"] > 0
    assert asyncio.run(drop_slot(config)) is True
    assert asyncio.run(drop_slot(config)) is False
    drop_publication(database, table)


def test_cdc_health_degrades_when_the_slot_retains_too_much_wal(database):
    table = cdc_table(database)
    config = cdc_config(database, table, **{"slot.create": "true", "max.retained.bytes": "1"})

    async def scenario():
        source, _ = await REGISTRY.open_source("postgres-cdc", config)
        database.execute(f"INSERT INTO {table} (id) SELECT generate_series(1, 100)")
        health = await source.health_check()
        await source.close()
        return health

    health = asyncio.run(scenario())
    drop_publication(database, table)
    assert health.state is HealthState.DEGRADED
    assert "retains" in health.reason


def test_cdc_setup_errors_say_how_to_fix_them(database):
    table = cdc_table(database)
    missing_slot = cdc_config(database, table)
    with pytest.raises(ConfigurationError, match="pg_create_logical_replication_slot") as caught:
        asyncio.run(REGISTRY.open_source("postgres-cdc", missing_slot))
    assert caught.value.key == "slot"
    other = database.name()
    database.execute(f"CREATE TABLE {other} (id bigint PRIMARY KEY)")
    with pytest.raises(ConfigurationError, match="CREATE PUBLICATION") as caught:
        asyncio.run(REGISTRY.open_source("postgres-cdc", {**missing_slot, "table": other}))
    assert caught.value.key == "publication"
    drop_publication(database, table)
