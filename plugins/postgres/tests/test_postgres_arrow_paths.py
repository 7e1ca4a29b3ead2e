"""The binary paths on a real server: the sinks' COPY (pgpq, or CSV) and the source's (ADBC).

The format a sink chose is seen on the server: its ``COPY ... FROM STDIN`` stays open, in
``pg_stat_activity``, between ``write_batch`` and ``pre_commit``.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import zoneinfo

import pyarrow as pa
import pytest
from laminar_sdk import (
    ConnectionFailed,
    PartitionRange,
    ReadError,
    SerdeError,
    SourceCheckpoint,
    load_connector_registry,
)
from psycopg import sql

REGISTRY = load_connector_registry()
UTC = datetime.UTC
PARIS = zoneinfo.ZoneInfo("Europe/Paris")


def properties(database, table, **extra):
    return {**database.properties(), "table": table, **extra}


def sink_config(database, table, schema, tmp_path, connector):
    extra = {"schema": schema}
    if connector == "postgres":
        extra["staging.location"] = str(tmp_path)
    if connector == "postgres-upsert":
        extra["key"] = "id"
    return properties(database, table, **extra)


def copies_into(database, table):
    """The ``COPY`` statements the server is running into ``table``, as their text."""
    return [
        query
        for (query,) in database.execute(
            "SELECT query FROM pg_stat_activity WHERE query LIKE 'COPY %%' "
            "AND pid <> pg_backend_pid()"
        )
        if table in query
    ]


async def write_one_epoch(connector, config, batch, database, table):
    """Write ``batch`` as epoch 0; the ``COPY`` statements running right after ``write_batch``."""
    sink, _ = await REGISTRY.open_sink(connector, config)
    try:
        await sink.begin_epoch(0)
        await sink.write_batch(batch)
        running = copies_into(database, table)
        await sink.pre_commit(0)
        await sink.commit_epoch(0)
    finally:
        await sink.close()
    return running


def read_back(database, table, names):
    """The rows of ``table`` by psycopg; ``real`` as ``double precision``, which holds it exactly.

    (psycopg reads a ``real`` through its shortest text: 0.10000000149011612 comes back as 0.1.)
    """
    types = dict(
        database.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s",
            (table,),
        )
    )
    selected = [
        sql.SQL("{0}::double precision AS {0}" if types[name] == "real" else "{0}").format(
            sql.Identifier(name)
        )
        for name in names
    ]
    query = sql.SQL("SELECT {} FROM {} ORDER BY id").format(
        sql.SQL(", ").join(selected), sql.Identifier(table)
    )
    return [dict(zip(names, row, strict=True)) for row in database.execute(query)]


def comparable(rows):
    """``rows`` with floats as their ``repr`` and zoned times in UTC.

    NaN then equals NaN, and -0.0 differs from 0.0; a time in a zone's repeated hour (``fold``)
    compares unequal to any other zone's (PEP 495), the same instant too.
    """

    def plain(value):
        if isinstance(value, float):
            return repr(value)
        if isinstance(value, datetime.datetime) and value.tzinfo is not None:
            return value.astimezone(UTC)
        return value

    return [{name: plain(value) for name, value in row.items()} for row in rows]


# Sinks: binary where every column matches exactly, CSV otherwise ----------------------------

EXACT_TABLE = (
    "id bigint PRIMARY KEY, i16 smallint, i16_in_int integer, i32_in_bigint bigint, "
    "f32 real, f64 double precision, flag boolean, name text, label varchar(80), blob bytea, "
    "day date, at timestamp, at_utc timestamptz, at_paris timestamptz"
)
EXACT = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("i16", pa.int16()),
        pa.field("i16_in_int", pa.int16()),  # a narrower integer: widened exactly
        pa.field("i32_in_bigint", pa.int32()),
        pa.field("f32", pa.float32()),
        pa.field("f64", pa.float64()),
        pa.field("flag", pa.bool_()),
        pa.field("name", pa.string()),
        pa.field("label", pa.string()),
        pa.field("blob", pa.binary()),
        pa.field("day", pa.date32()),
        pa.field("at", pa.timestamp("us")),
        pa.field("at_utc", pa.timestamp("us", "UTC")),
        pa.field("at_paris", pa.timestamp("us", "Europe/Paris")),  # the same instants as UTC
    ]
)
EXACT_SCHEMA = (
    "id int64, i16 int16, i16_in_int int16, i32_in_bigint int32, f32 float, f64 double, "
    "flag bool, name string, label string, blob binary, day date32, at timestamp[us], "
    "at_utc timestamp[us, tz=UTC], at_paris timestamp[us, tz=Europe/Paris]"
)
AWKWARD_TEXT = 'comma, "quote", new\nline, cr\r, tab\t, back\\slash, \\N, é 漢 🙂'
EXACT_ROWS = [
    {
        "id": 1,
        "i16": -32768,
        "i16_in_int": 32767,
        "i32_in_bigint": -(2**31),
        "f32": 0.1,
        "f64": 0.1,
        "flag": True,
        "name": AWKWARD_TEXT,
        "label": "NULL",
        "blob": b"\x00\xff\x10\\,\n",
        "day": datetime.date(1, 1, 1),
        "at": datetime.datetime(1, 1, 1, 0, 0, 0, 1),
        "at_utc": datetime.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        "at_paris": datetime.datetime(2024, 3, 31, 1, 59, 59, 999999, tzinfo=UTC),
    },
    {
        "id": 2,
        "i16": 32767,
        "i16_in_int": -32768,
        "i32_in_bigint": 2**31 - 1,
        "f32": 3.4028234663852886e38,
        "f64": 5e-324,
        "flag": False,
        "name": "",
        "label": "",
        "blob": b"",
        "day": datetime.date(9999, 12, 31),
        "at": datetime.datetime(9999, 12, 31, 23, 59, 59, 999999),
        "at_utc": datetime.datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        "at_paris": datetime.datetime(2024, 10, 27, 1, 30, tzinfo=UTC),
    },
    {**dict.fromkeys(EXACT.names), "id": 3, "f32": float("nan"), "f64": -0.0},
    {**dict.fromkeys(EXACT.names), "id": 4, "f32": float("-inf"), "f64": float("inf")},
    {**dict.fromkeys(EXACT.names), "id": 5, "f64": 1 / 3},
]


@pytest.mark.parametrize("connector", ["postgres", "postgres-2pc", "postgres-upsert"])
def test_batches_whose_columns_all_match_the_table_go_in_binary_and_are_stored_exactly(
    database, tmp_path, connector
):
    table = database.name()
    database.execute(f"CREATE TABLE {table} ({EXACT_TABLE})")
    batch = pa.RecordBatch.from_pylist(EXACT_ROWS, schema=EXACT)
    config = sink_config(database, table, EXACT_SCHEMA, tmp_path, connector)

    running = asyncio.run(write_one_epoch(connector, config, batch, database, table))

    if connector == "postgres":  # its COPY stays open until pre_commit: the server shows it
        assert len(running) == 1, running
        assert running[0].endswith("FROM STDIN (FORMAT binary)"), running
    stored = read_back(database, table, EXACT.names)
    # Arrow's own values: the float32 ones as real holds them (0.1 is 0.10000000149011612).
    expected = pa.Table.from_batches([batch]).to_pylist()
    assert expected[0]["f32"] == 0.10000000149011612
    assert comparable(stored) == comparable(expected)
    assert stored[1]["at_utc"] == datetime.datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=UTC)


MIXED_TABLE = (
    "id bigint PRIMARY KEY, f32_in_double double precision, name text, blob bytea, "
    "at_utc timestamptz"
)
MIXED = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("f32_in_double", pa.float32()),  # real into double precision: not exact
        pa.field("name", pa.string()),
        pa.field("blob", pa.binary()),
        pa.field("at_utc", pa.timestamp("us", "UTC")),
    ]
)
MIXED_SCHEMA = (
    "id int64, f32_in_double float, name string, blob binary, at_utc timestamp[us, tz=UTC]"
)


@pytest.mark.parametrize("connector", ["postgres", "postgres-2pc", "postgres-upsert"])
def test_a_real_into_double_precision_goes_as_csv_and_keeps_the_value_written(
    database, tmp_path, connector
):
    # Widened in binary, float32's 0.1 would be stored as 0.10000000149011612; as CSV its
    # shortest text, 0.1, is stored.
    table = database.name()
    database.execute(f"CREATE TABLE {table} ({MIXED_TABLE})")
    floats = [0.1, 1 / 3, 16777217.0, 3.4028234663852886e38, -0.0, float("nan"), None]
    at = datetime.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    batch = pa.RecordBatch.from_pydict(
        {
            "id": list(range(len(floats))),
            "f32_in_double": floats,
            "name": [AWKWARD_TEXT, "", None, "NULL", "\\N", '"', ","],
            "blob": [b"\x00\xff\x10\\,\n", b"", None, b"N", b'"', b"\\", b","],
            "at_utc": [at, None, at, at, at, at, at],
        },
        schema=MIXED,
    )
    config = sink_config(database, table, MIXED_SCHEMA, tmp_path, connector)

    running = asyncio.run(write_one_epoch(connector, config, batch, database, table))

    if connector == "postgres":
        assert len(running) == 1, running
        assert running[0].endswith("FROM STDIN (FORMAT csv)"), running
    stored = read_back(database, table, MIXED.names)
    assert [repr(row["f32_in_double"]) for row in stored] == [
        "0.1",
        "0.33333334",
        "16777216.0",
        "3.4028235e+38",
        "-0.0",
        "nan",
        "None",
    ]
    others = [{k: v for k, v in row.items() if k != "f32_in_double"} for row in stored]
    assert others == batch.drop_columns(["f32_in_double"]).to_pylist()


NUL_CASES = {  # the COPY format: the table's columns, the batches' schema, their other columns
    "binary": ("id bigint, name text", "id int64, name string", {}),
    "csv": (
        "id bigint, name text, ratio double precision",
        "id int64, name string, ratio float",
        {"ratio": pa.array([0.5], pa.float32())},
    ),
}


@pytest.mark.parametrize("path", sorted(NUL_CASES))
def test_a_nul_character_in_text_is_refused_before_anything_is_sent(database, tmp_path, path):
    table_columns, schema, columns = NUL_CASES[path]
    table = database.name()
    database.execute(f"CREATE TABLE {table} ({table_columns})")
    config = properties(database, table, schema=schema, **{"staging.location": str(tmp_path)})

    def rows(name):
        return pa.RecordBatch.from_pydict(
            {"id": pa.array([1], pa.int64()), "name": [name], **columns}
        )

    async def scenario():
        sink, _ = await REGISTRY.open_sink("postgres", config)
        try:
            await sink.begin_epoch(0)
            with pytest.raises(SerdeError) as caught:
                await sink.write_batch(rows("before\x00after"))
            running = copies_into(database, table)
            await sink.rollback_epoch(0)
            # The instance goes on: the epoch written again commits (and its COPY's format
            # is the one this test is about).
            await sink.begin_epoch(0)
            await sink.write_batch(rows("clean"))
            format_used = copies_into(database, table)
            await sink.pre_commit(0)
            await sink.commit_epoch(0)
        finally:
            await sink.close()
        return str(caught.value), running, format_used

    message, running, format_used = asyncio.run(scenario())
    assert "NUL character (\\0)" in message
    assert "PostgreSQL text cannot store" in message
    assert running == [], "the COPY began before the batch was refused"
    assert format_used[0].endswith(f"(FORMAT {path})"), format_used
    assert database.execute(f"SELECT id, name FROM {table}") == [(1, "clean")]


# The keyset source: binary COPY through ADBC -------------------------------------------------


async def poll_all(config):
    source, _ = await REGISTRY.open_source("postgres", config)
    try:
        batches = []
        while (polled := await source.poll_batch(100)) is not None:
            batches.append(polled.records)
        return batches
    finally:
        await source.close()


async def read_ranges(config):
    source, _ = await REGISTRY.open_source("postgres", config)
    try:
        end = await source.plan_end(SourceCheckpoint(), None)
        return [
            batch
            for partition, offset in sorted(end.offsets.items())
            async for batch in source.read_range(PartitionRange(partition, None, offset))
        ]
    finally:
        await source.close()


READS = {"poll": poll_all, "range": read_ranges}


@pytest.mark.parametrize("read", sorted(READS))
@pytest.mark.parametrize(
    ("column_type", "value"),
    [
        ("date", "infinity"),
        ("date", "-infinity"),
        ("timestamp", "infinity"),
        ("timestamp", "-infinity"),
        ("timestamptz", "infinity"),
        ("timestamptz", "-infinity"),
    ],
)
def test_an_infinite_date_or_timestamp_fails_the_read_naming_the_column(
    database, read, column_type, value
):
    table = database.name()
    database.execute(f"CREATE TABLE {table} (id bigint, note text, valid_until {column_type})")
    database.execute(
        f"INSERT INTO {table} VALUES (1, 'a', '2024-01-01'), (2, 'b', %s), (3, 'c', NULL)",
        (value,),
    )
    config = properties(database, table, key="id")

    with pytest.raises(SerdeError) as caught:
        asyncio.run(READS[read](config))

    message = str(caught.value)
    assert "column 'valid_until'" in message, message
    assert "infinity" in message, message


@pytest.mark.parametrize("read", sorted(READS))
def test_the_extreme_dates_and_timestamps_postgresql_holds_read_exactly(database, read):
    # The infinity check must not refuse real values: the oldest PostgreSQL holds, and far
    # future ones, compared as numbers since 1970 (Python's dates stop at year 9999).
    table = database.name()
    database.execute(
        f"CREATE TABLE {table} (id bigint, day date, at timestamp, at_utc timestamptz)"
    )
    database.execute(
        f"INSERT INTO {table} VALUES "
        "(1, '4714-11-24 BC', '4714-11-24 00:00:00 BC', '4714-11-24 00:00:00+00 BC'), "
        "(2, '5874897-12-31', '294247-01-09 23:59:59.999999', '294247-01-09 23:59:59.999999+00'), "
        "(3, '1970-01-01', '1969-12-31 23:59:59.999999', '1970-01-01 00:00:00.000001+00')"
    )
    expected = database.execute(
        f"SELECT day - 'epoch'::date, "
        "(extract(epoch FROM at) * 1000000)::bigint, "
        f"(extract(epoch FROM at_utc) * 1000000)::bigint FROM {table} ORDER BY id"
    )

    batches = asyncio.run(READS[read](properties(database, table, key="id")))

    records = pa.Table.from_batches(batches)
    assert records.schema.field("day").type == pa.date32()
    assert records.schema.field("at_utc").type == pa.timestamp("us", "UTC")
    read_as_numbers = zip(
        records.column("day").cast(pa.int32()).to_pylist(),
        records.column("at").cast(pa.int64()).to_pylist(),
        records.column("at_utc").cast(pa.int64()).to_pylist(),
        strict=True,
    )
    assert list(read_as_numbers) == expected
    assert expected[0][0] == -2_440_588  # 4714-11-24 BC: the first day PostgreSQL holds
    assert expected[1][0] == 2_145_042_905  # 5874897-12-31: the last


@pytest.fixture
def key_table(database):
    table = database.name()
    database.execute(f"CREATE TABLE {table} (id bigint, v text)")
    database.execute(f"INSERT INTO {table} SELECT i, 'v' || i FROM generate_series(1, 10) AS i")
    return table


async def fail_reading(config, read, change, after=None):
    """Open the source, ``change`` the table, then read it; the error the read raised."""
    source, _ = await REGISTRY.open_source("postgres", config)
    try:
        if read == "poll":
            if after is not None:
                await source.restore(SourceCheckpoint({"p0": json.dumps([after])}))
            change()
            with pytest.raises(ReadError) as caught:
                await source.poll_batch(100)
        else:
            end = (await source.plan_end(SourceCheckpoint(), None)).offsets["p0"]
            change()
            start = None if after is None else json.dumps([after])
            with pytest.raises(ReadError) as caught:
                async for _ in source.read_range(PartitionRange("p0", start, end)):
                    pass
        return caught.value
    finally:
        await source.close()


REFUSALS = {  # what the server refuses: its SQLSTATE, and what the message says
    "table dropped": ("42P01", "does not exist"),
    "column dropped": ("42703", 'column "v" does not exist'),
    "key of another type, holding the password": ("22P02", 'type bigint: "***"'),
}


@pytest.mark.parametrize("read", sorted(READS))
@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_query_the_server_refuses_is_a_one_line_read_error_without_the_query_or_password(
    database, key_table, read, case
):
    state, named = REFUSALS[case]
    password = database.password
    assert password, "the test server has a password: the message must not show it"
    config = properties(database, key_table, key="id")
    after = None
    if case == "table dropped":
        statement = f"DROP TABLE {key_table}"
    elif case == "column dropped":
        statement = f"ALTER TABLE {key_table} DROP COLUMN v"
    else:
        # The checkpoint's key goes into the query as a literal: the server's message (and
        # the driver's, which repeats the query) holds it.
        statement, after = "SELECT 1", password

    error = asyncio.run(fail_reading(config, read, lambda: database.execute(statement), after))

    message = str(error)
    assert not isinstance(error, ConnectionFailed), message  # not retried forever
    assert "\n" not in message, message
    assert "Query was" not in message, message
    assert "SELECT" not in message, message  # nor the query itself, anywhere
    assert password not in message, message
    assert f"(SQLSTATE {state})" in message, message
    assert named in message, message
    assert message.startswith("postgres source: cannot read "), message
