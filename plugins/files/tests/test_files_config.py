"""Configuration of the files source and sink: the schema, the format, the path."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pyarrow as pa
import pytest
from files_testing import open_sink, open_source
from laminar_sdk import ConfigurationError, ConnectorConfig, ConnectorRole, load_connector_registry
from laminar_sdk._cli.main import main
from laminar_sdk.reference import IDS_SCHEMA, WIDE_SCHEMA
from laminar_sdk.spark import parse_options

from laminar_plugin_files import FilesSink, FilesSource


def schema_of(tmp_path: Path, schema: str) -> pa.Schema:
    return open_sink(tmp_path / "sink", schema=schema).schema()


def refused(connector: FilesSource | FilesSink, options: dict[str, str]) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as caught:
        asyncio.run(connector.open(ConnectorConfig("files", options)))
    return caught.value


@pytest.mark.parametrize(("name", "expected"), [("ids", IDS_SCHEMA), ("wide", WIDE_SCHEMA)])
def test_a_reference_schema_is_chosen_by_name(tmp_path, name, expected):
    assert schema_of(tmp_path, name).equals(expected)
    (tmp_path / "source").mkdir()
    assert open_source(tmp_path / "source", schema=name).schema().equals(expected)


def test_a_schema_is_declared_as_a_json_list_of_fields(tmp_path):
    fields = [
        {"name": "id", "type": "int64", "nullable": False},
        {"name": "note", "type": "string"},
        {"name": "at", "type": "timestamp[us, tz=UTC]"},
        {"name": "price", "type": "decimal128(10, 2)"},
        {"name": "day", "type": "date32"},
        {"name": "ratio", "type": "float"},
    ]
    expected = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("note", pa.string()),
            pa.field("at", pa.timestamp("us", tz="UTC")),
            pa.field("price", pa.decimal128(10, 2)),
            pa.field("day", pa.date32()),
            pa.field("ratio", pa.float32()),
        ]
    )
    assert schema_of(tmp_path, json.dumps(fields)).equals(expected)


@pytest.mark.parametrize(
    "arrow_type",
    [
        pa.int8(),
        pa.uint64(),
        pa.float64(),
        pa.bool_(),
        pa.string(),
        pa.large_string(),
        pa.binary(),
        pa.date32(),
        pa.timestamp("ns"),
        pa.timestamp("ms", tz="Europe/Paris"),
        pa.decimal128(38, 9),
        pa.decimal256(50, 3),
        pa.time64("us"),
        pa.duration("s"),
    ],
    ids=str,
)
def test_a_type_is_written_as_arrow_prints_it(tmp_path, arrow_type):
    declared = json.dumps([{"name": "c", "type": str(arrow_type)}])
    assert schema_of(tmp_path, declared).field("c").type.equals(arrow_type)


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ("narrow", "must be one of ids, wide"),
        ("[not json", "is not valid JSON"),
        ("[]", "non-empty JSON list"),
        ('["id"]', "field 0 must be an object"),
        ('[{"name": "id"}]', "needs a string 'type'"),
        ('[{"type": "int64"}]', "needs a non-empty string 'name'"),
        ('[{"name": "id", "type": "integer"}]', "'integer', which is not an Arrow type"),
        ('[{"name": "id", "type": "int64", "null": true}]', "unknown key(s) null"),
        ('[{"name": "id", "type": "int64", "nullable": "no"}]', "'nullable' must be true"),
        ('[{"name": "a", "type": "int64"}, {"name": "a", "type": "string"}]', "a more than once"),
    ],
)
def test_a_bad_schema_is_a_configuration_error_naming_the_key(tmp_path, schema, problem):
    error = refused(FilesSink(), {"path": str(tmp_path), "schema": schema})
    assert error.key == "schema"
    assert problem in str(error)


def test_an_unknown_format_is_refused_listing_the_accepted_ones(tmp_path):
    source_error = refused(FilesSource(), {"path": str(tmp_path), "format": "orc"})
    assert source_error.key == "format"
    assert "parquet, csv, jsonl" in str(source_error)
    sink_error = refused(FilesSink(), {"path": str(tmp_path), "format": "csv"})
    assert sink_error.key == "format"
    assert "parquet, jsonl" in str(sink_error)


def test_an_object_store_uri_is_refused_saying_why_without_showing_credentials(tmp_path):
    uri = "s3://AKIAEXAMPLE:very-secret@bucket/out"
    sink_error = refused(FilesSink(), {"path": uri})
    assert sink_error.key == "path"
    assert "atomic directory rename" in str(sink_error)
    assert "exactly-once" in str(sink_error)
    source_error = refused(FilesSource(), {"path": uri})
    assert source_error.key == "path"
    for error in (sink_error, source_error):
        assert "very-secret" not in str(error)
        assert "AKIAEXAMPLE" not in str(error)


def test_a_file_uri_is_a_local_path(tmp_path):
    sink = open_sink(Path(), path=f"file://{tmp_path / 'out'}")
    assert (tmp_path / "out" / "_staging").is_dir()
    asyncio.run(sink.close())


def test_the_source_directory_must_exist_and_be_a_directory(tmp_path):
    missing = refused(FilesSource(), {"path": str(tmp_path / "nowhere")})
    assert missing.key == "path"
    assert "does not exist" in str(missing)
    assert str(tmp_path / "nowhere") in str(missing)
    (tmp_path / "file").write_text("x")
    not_a_directory = refused(FilesSource(), {"path": str(tmp_path / "file")})
    assert not_a_directory.key == "path"
    assert "is not a directory" in str(not_a_directory)


def test_the_sink_refuses_a_path_it_cannot_make_a_directory(tmp_path):
    (tmp_path / "file").write_text("x")
    error = refused(FilesSink(), {"path": str(tmp_path / "file")})
    assert error.key == "path"
    assert str(tmp_path / "file") in str(error)


@pytest.mark.parametrize(
    ("connector", "key"), [(FilesSource, "batch_size"), (FilesSink, "rows_per_file")]
)
def test_counts_below_one_are_refused(tmp_path, connector, key):
    error = refused(connector(), {"path": str(tmp_path), key: "0"})
    assert error.key == key
    assert ">= 1" in str(error)


S3_SECRETS = {
    "s3.access_key": "AKIA-SECRET-ID",
    "s3.secret_key": "s3-Secret/Key+1",
    "s3.session_token": "tok-SECRET",
}


def test_s3_credentials_never_show_on_any_output_path(tmp_path, capsys, caplog):
    # --check's table, a configuration error, the options Spark echoes back to the bridge,
    # and the log: the S3 keys are secrets whatever path they take.
    caplog.set_level(logging.DEBUG)
    credentials = "".join(f"{key} = {json.dumps(value)}\n" for key, value in S3_SECRETS.items())
    source = (
        '[source]\nconnector = "files"\npath = "s3://bucket/in"\n'
        f's3.endpoint = "http://127.0.0.1:9"\ns3.allow_http = true\n{credentials}'
    )
    rest = '\n[sink]\nconnector = "memory"\npath = "out"\n\n[pipeline]\ncheckpoint_location = "s"\n'
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(source + rest)
    assert main(["run", "--check", str(pipeline)]) == 0
    pipeline.write_text(source + 's3.timeout_s = "soon"\n' + rest)
    assert main(["run", "--check", str(pipeline)]) == 2
    shown = capsys.readouterr()
    assert "s3.secret_key=***" in shown.out
    assert "source.s3.timeout_s" in shown.err
    options = {"connector": "files", "path": "s3://bucket/in", **S3_SECRETS}
    echoed = parse_options(options, ConnectorRole.SOURCE, load_connector_registry())
    with pytest.raises(ConfigurationError) as refused_option:
        parse_options({**options, "laminar.delivery": "twice"}, ConnectorRole.SOURCE)
    configured = echoed.spec().configure(echoed.properties)
    outputs = [shown.out, shown.err, repr(echoed), str(echoed), str(refused_option.value)]
    outputs += [caplog.text, repr(configured), str(configured), str(configured.redacted())]
    for secret in S3_SECRETS.values():
        assert not [text for text in outputs if secret in text], secret
