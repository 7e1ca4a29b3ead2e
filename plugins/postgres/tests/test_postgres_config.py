"""Configuration of the PostgreSQL connectors: errors name the key, passwords are never shown."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from laminar_sdk import (
    ConfigurationError,
    ConnectionFailed,
    ConnectorConfig,
    ConnectorRole,
    load_connector_registry,
)
from laminar_sdk._cli.main import main

from laminar_plugin_postgres import PostgresSink

SECRET = "s3cr3t-Pa55word-never-shown"


@pytest.fixture(scope="module")
def registry():
    return load_connector_registry()


def test_the_plugin_registers_its_three_connectors(registry):
    assert registry.get("postgres", ConnectorRole.SINK).distribution == "laminar-plugin-postgres"
    assert registry.get("postgres", ConnectorRole.SOURCE).distribution == "laminar-plugin-postgres"
    assert (
        registry.get("postgres-cdc", ConnectorRole.SOURCE).distribution == "laminar-plugin-postgres"
    )
    sink = registry.get("postgres", ConnectorRole.SINK).capability_names()
    assert sink == ("exactly_once", "two_phase_commit")
    two_phase = registry.get("postgres-2pc", ConnectorRole.SINK).capability_names()
    assert two_phase == (
        "exactly_once",
        "two_phase_commit",
        "partitioned",
        "distributed_commit",
    )
    upsert = registry.get("postgres-upsert", ConnectorRole.SINK).capability_names()
    assert upsert == ("idempotent", "upsert")
    assert "range_readable" in registry.get("postgres", ConnectorRole.SOURCE).capability_names()


@pytest.mark.parametrize(
    ("connector", "role", "properties", "key"),
    [
        ("postgres", "sink", {"dsn": "host=x", "table": "t", "mode": "two-phase"}, "mode"),
        (
            "postgres-2pc",
            "sink",
            {"dsn": "host=x", "table": "t", "staging.location": "x"},
            "staging.location",
        ),
        ("postgres", "sink", {"dsn": "host=x", "table": "a.b.c"}, "table"),
        ("postgres-upsert", "sink", {"dsn": "host=x", "table": "t"}, "key"),
        ("postgres", "sink", {"dsn": "host=x", "table": "t", "table.create": "true"}, "schema"),
        (
            "postgres",
            "sink",
            {"dsn": "host=x", "table": "t", "schema": "id int64, id string"},
            "schema",
        ),
        (
            "postgres",
            "sink",
            {"dsn": "host=x", "table": "t", "sink.id": "a b", "staging.location": "/tmp"},
            "sink.id",
        ),
        ("postgres", "sink", {"dsn": "host=x", "table": "t"}, "staging.location"),
        ("postgres", "sink", {"dsn": "host=x", "table": "t", "tabel": "u"}, "tabel"),
        (
            "postgres-2pc",
            "sink",
            {"dsn": "host=x", "table": "t", "network.timeout.s": "0"},
            "network.timeout.s",
        ),
        (
            "postgres",
            "source",
            {
                "dsn": "host=x",
                "table": "t",
                "key": "id",
                "partition.bounds": "1,",
            },
            "partition.bounds",
        ),
        (
            "postgres",
            "source",
            {
                "dsn": "host=x",
                "table": "t",
                "key": "id",
                "partitions": "3",
                "partition.bounds": "5",
            },
            "partitions",
        ),
        (
            "postgres-cdc",
            "source",
            {
                "dsn": "host=x",
                "table": "t",
                "slot": "s",
                "publication": "p",
                "slot.advance": "never",
            },
            "slot.advance",
        ),
        (
            "postgres-cdc",
            "source",
            {"dsn": "host=x", "table": "t", "slot": "bad-name", "publication": "p"},
            "slot",
        ),
    ],
)
def test_a_bad_configuration_is_refused_naming_the_key(registry, connector, role, properties, key):
    spec = registry.get(connector, ConnectorRole(role))

    async def open_it() -> None:
        await spec.create().open(spec.configure(properties))

    with pytest.raises(ConfigurationError) as caught:
        asyncio.run(open_it())
    assert caught.value.key == key, caught.value


DSNS_WITH_A_PASSWORD = [
    f"host=db password={SECRET}",
    f"host=db dbname=app PASSWORD = '{SECRET}'",
    f"postgresql://user:{SECRET}@db/app",
    f"postgresql://user@db:5432/app?password={SECRET}",
    f"postgresql://user@db/app?sslmode=disable&Password={SECRET}",
]


@pytest.mark.parametrize("dsn", DSNS_WITH_A_PASSWORD)
def test_a_password_in_the_dsn_is_refused_before_anything_opens_and_not_shown(registry, dsn):
    connectors = [(ConnectorRole.SINK, "postgres"), (ConnectorRole.SINK, "postgres-2pc")]
    connectors += [(ConnectorRole.SOURCE, "postgres"), (ConnectorRole.SOURCE, "postgres-cdc")]
    for role, name in connectors:
        spec = registry.get(name, role)
        required = {key.name: "t" for key in spec.config_keys if key.required}
        with pytest.raises(ConfigurationError) as caught:
            spec.configure({**required, "dsn": dsn})
        assert caught.value.key == "dsn"
        assert "dsn: it holds a password" in str(caught.value)
        assert SECRET not in str(caught.value)


@pytest.mark.parametrize("dsn", DSNS_WITH_A_PASSWORD)
def test_run_check_refuses_a_pipeline_whose_dsn_holds_a_password_without_showing_it(
    tmp_path, capsys, dsn
):
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(
        f'[source]\nconnector = "generator"\nrows = 10\n\n'
        f'[sink]\nconnector = "postgres"\ndsn = {json.dumps(dsn)}\ntable = "t"\n\n'
        f'[pipeline]\ncheckpoint_location = "state"\n'
    )
    assert main(["run", "--check", str(pipeline)]) == 2
    output = capsys.readouterr()
    assert "sink.dsn: postgres: dsn: it holds a password" in output.err, output.err
    assert SECRET not in output.out + output.err


def test_a_wrong_password_fails_to_connect_without_showing_it(
    registry, database, tmp_path, monkeypatch, caplog
):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("PG_TEST_PASSWORD", SECRET)
    properties = {
        "dsn": database.service.dsn,
        "password.env": "PG_TEST_PASSWORD",
        "table": "t",
        "staging.location": str(tmp_path),
    }
    config = registry.get("postgres", ConnectorRole.SINK).configure(properties)
    with pytest.raises(ConnectionFailed) as caught:
        asyncio.run(PostgresSink().open(config))
    message = str(caught.value)
    assert "password authentication failed" in message
    assert "password.env" in message
    shown = [message, repr(config), str(config), repr(caught.value.__cause__), caplog.text]
    assert all(SECRET not in text for text in shown)
    assert config.redacted()["password.env"] == "***"


def test_the_password_comes_from_a_file_or_the_environment(registry, database, monkeypatch):
    table = database.name()
    database.execute(f"CREATE TABLE {table} (id bigint)")
    password = database.password
    assert password is not None
    monkeypatch.setenv("PG_TEST_PASSWORD", password)
    base = {"dsn": database.service.dsn, "table": table, "key": "id"}

    async def health(extra):
        source, _ = await registry.open_source("postgres", {**base, **extra})
        try:
            return await source.health_check(), repr(source)
        finally:
            await source.close()

    for extra in (
        {"password.env": "PG_TEST_PASSWORD"},
        {"password.file": str(database.service.password_file)},
    ):
        status, shown = asyncio.run(health(extra))
        assert status.is_healthy, status
        assert password not in shown
        assert password not in str(status)
    monkeypatch.delenv("PG_TEST_PASSWORD")
    with pytest.raises(ConfigurationError) as caught:
        asyncio.run(health({"password.env": "PG_TEST_PASSWORD"}))
    assert caught.value.key == "password.env"
    assert "not set" in str(caught.value)


def test_config_repr_never_shows_a_password_file_or_variable():
    config = ConnectorConfig("postgres", {"dsn": "host=x", "password.file": "/run/secret/pg"})
    assert "/run/secret/pg" not in repr(config)


def generator_into(database, tmp_path, sink: str, table: str):
    """A pipeline file: 10 generated rows into ``table`` of ``database`` through ``sink``."""
    pipeline = tmp_path / "pipeline.toml"
    settings = database.properties()
    connection = "".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items())
    pipeline.write_text(
        f'[source]\nconnector = "generator"\nrows = 10\n\n'
        f'[sink]\nconnector = "{sink}"\n{connection}table = "{table}"\n\n'
        f'[pipeline]\ncheckpoint_location = "state"\n'
    )
    return pipeline


def test_run_check_connect_opens_the_sink_on_the_server_and_names_a_missing_table(
    database, tmp_path, capsys
):
    # Without --connect the file is valid; connecting finds what the run would have failed on.
    pipeline = generator_into(database, tmp_path, "postgres-2pc", "missing_table")
    assert main(["run", "--check", str(pipeline)]) == 0
    capsys.readouterr()
    assert main(["run", "--check", "--connect", str(pipeline)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("laminar: error: "), err
    assert "missing_table" in err, err


def test_run_check_connect_names_the_table_a_stream_column_is_missing_from(
    database, tmp_path, capsys
):
    table = database.name()
    database.execute(f"CREATE TABLE {table} (id bigint, partition integer)")
    pipeline = generator_into(database, tmp_path, "postgres", table)

    assert main(["run", "--check", "--connect", str(pipeline)]) == 2

    err = capsys.readouterr().err
    assert f"sink 'postgres' (table public.{table}) cannot take the source's stream" in err, err
    assert "column(s) 'value' not in (id, partition)" in err, err
