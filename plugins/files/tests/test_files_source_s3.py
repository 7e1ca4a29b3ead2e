"""The files source on an object store: moto's S3 server on loopback, through pyarrow's S3 client.

The same source as on a local directory — listing, reading, positions, range reads — with the
objects of a bucket prefix for files; and the errors a user meets when the store is not there.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import re
import socket
import time
import uuid
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from files_testing import FORMATS, drain, ids_batch
from laminar_sdk import (
    ConfigurationError,
    ConnectionFailed,
    ConnectorConfig,
    PartitionRange,
    ReadError,
    SourceCheckpoint,
)

from laminar_plugin_files import FilesSink, FilesSource
from laminar_plugin_files.testing import FilesSourceContext

if importlib.util.find_spec("moto") is None:
    pytest.skip("needs moto: pip install 'laminar-conformance[s3]'", allow_module_level=True)

from laminar_conformance.services import S3Endpoint, moto_s3_server

SECRET = "s3cr3t-value-never-shown"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[S3Endpoint]:
    """moto's S3 server on loopback, with one bucket; stopped at the end, pass or fail."""
    with moto_s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def prefix(s3_endpoint: S3Endpoint) -> str:
    """A fresh prefix in the bucket, as ``bucket/prefix`` (no objects under it yet)."""
    return f"{s3_endpoint.bucket}/test-{uuid.uuid4().hex}"


def s3_options(endpoint: S3Endpoint, secret: str = SECRET) -> dict[str, str]:
    # moto accepts any credentials: the secret is a marker that must never be shown.
    return {
        "s3.endpoint": endpoint.url,
        "s3.region": endpoint.region,
        "s3.access_key": endpoint.access_key_id,
        "s3.secret_key": secret,
        "s3.allow_http": "true",
    }


def store(endpoint: S3Endpoint) -> pafs.S3FileSystem:
    return pafs.S3FileSystem(
        endpoint_override=endpoint.url,
        region=endpoint.region,
        access_key=endpoint.access_key_id,
        secret_key=endpoint.secret_access_key,
        scheme="http",
    )


def put_object(
    endpoint: S3Endpoint,
    key: str,
    ids: Sequence[int],
    file_format: str,
    *,
    row_group_size: int | None = None,
) -> None:
    """Upload ``ids`` as an ``ids``-schema object at ``key`` (``bucket/prefix/name``)."""
    table = pa.Table.from_batches([ids_batch(ids)])
    if file_format == "parquet":
        buffer = pa.BufferOutputStream()
        pq.write_table(table, buffer, row_group_size=row_group_size)
        body = buffer.getvalue().to_pybytes()
    elif file_format == "csv":
        text = io.BytesIO()
        pa_csv.write_csv(table, text)
        body = text.getvalue()
    else:
        body = "".join(json.dumps(row) + "\n" for row in table.to_pylist()).encode()
    with store(endpoint).open_output_stream(key) as stream:
        stream.write(body)


def open_s3_source(endpoint: S3Endpoint, prefix: str, **options: str) -> FilesSource:
    source = FilesSource()
    config = ConnectorConfig("files", {"path": f"s3://{prefix}", **s3_options(endpoint), **options})
    asyncio.run(source.open(config))
    return source


@pytest.mark.parametrize("file_format", FORMATS)
def test_objects_are_read_in_path_order_skipping_hidden_ones(s3_endpoint, prefix, file_format):
    ext = file_format
    put_object(s3_endpoint, f"{prefix}/b/2.{ext}", [4, 5], file_format)
    put_object(s3_endpoint, f"{prefix}/a.{ext}", [1, 2, 3], file_format)
    put_object(s3_endpoint, f"{prefix}/c.{ext}", [6], file_format)
    put_object(s3_endpoint, f"{prefix}/_staging/0.{ext}", [100], file_format)
    put_object(s3_endpoint, f"{prefix}/.c.{ext}.tmp", [101], file_format)
    put_object(s3_endpoint, f"{prefix}/b/.hidden.{ext}", [102], file_format)
    put_object(s3_endpoint, f"{prefix}/notes.txt", [103], file_format)
    put_object(s3_endpoint, f"{prefix}-sibling/z.{ext}", [104], file_format)
    source = open_s3_source(s3_endpoint, prefix, format=file_format, batch_size="2")
    ids, checkpoints = drain(source)
    assert ids == [1, 2, 3, 4, 5, 6]
    # Positions are keys relative to the prefix, in the local form.
    assert checkpoints[-1].get_offset("files") == f"end:c.{ext}"
    assert checkpoints[0].get_offset("files") == f"2:a.{ext}"
    asyncio.run(source.close())


def test_objects_appearing_between_polls_are_picked_up(s3_endpoint, prefix):
    source = open_s3_source(s3_endpoint, prefix)  # the prefix holds no object yet
    assert asyncio.run(source.poll_batch(100)) is None
    put_object(s3_endpoint, f"{prefix}/0001.parquet", [1, 2], "parquet")
    assert drain(source)[0] == [1, 2]
    put_object(s3_endpoint, f"{prefix}/0002.parquet", [3], "parquet")
    put_object(s3_endpoint, f"{prefix}/sub/0003.parquet", [4], "parquet")
    assert drain(source)[0] == [3, 4]
    assert asyncio.run(source.poll_batch(100)) is None
    asyncio.run(source.close())


def poll_all(source: FilesSource, max_records: int) -> list[tuple[int, SourceCheckpoint]]:
    """Poll until nothing comes: after each batch, the rows returned so far and the checkpoint."""
    points: list[tuple[int, SourceCheckpoint]] = []
    returned = 0
    while (batch := asyncio.run(source.poll_batch(max_records))) is not None:
        returned += batch.records.num_rows
        points.append((returned, source.checkpoint()))
    return points


def put_files(endpoint: S3Endpoint, prefix: str, file_format: str) -> list[int]:
    """Objects of 7, 0, 5 and 9 rows (Parquet row groups of 3); the ids in reading order."""
    expected: list[int] = []
    for number, count in enumerate([7, 0, 5, 9]):
        ids = list(range(len(expected), len(expected) + count))
        key = f"{prefix}/{number:03d}.{file_format}"
        put_object(endpoint, key, ids, file_format, row_group_size=3)
        expected += ids
    return expected


@pytest.mark.parametrize("file_format", FORMATS)
def test_restoring_a_checkpoint_on_a_new_instance_returns_exactly_the_rows_after_it(
    s3_endpoint, prefix, file_format
):
    expected = put_files(s3_endpoint, prefix, file_format)
    options = {"format": file_format, "batch_size": "4"}
    first = open_s3_source(s3_endpoint, prefix, **options)
    points = poll_all(first, max_records=4)
    asyncio.run(first.close())
    assert points[-1][0] == len(expected)
    # Sampled positions: inside, between and after row groups and objects, and the start.
    samples = [(0, SourceCheckpoint()), *points[::2], points[-1]]
    for returned, checkpoint in samples:
        restored = open_s3_source(s3_endpoint, prefix, **options)
        asyncio.run(restored.restore(checkpoint))
        assert drain(restored, max_records=3)[0] == expected[returned:], checkpoint
        asyncio.run(restored.close())


def read_range(source: FilesSource, start: SourceCheckpoint, end: SourceCheckpoint) -> list[int]:
    async def collect() -> list[int]:
        partition_range = PartitionRange("files", start.get_offset("files"), end.offsets["files"])
        ids: list[int] = []
        async for batch in source.read_range(partition_range):
            ids += batch.column("id").to_pylist()
        return ids

    return asyncio.run(collect())


@pytest.mark.parametrize("file_format", ["parquet", "csv"])
def test_range_reads_return_what_polling_returns(s3_endpoint, prefix, file_format):
    expected = put_files(s3_endpoint, prefix, file_format)
    options = {"format": file_format, "batch_size": "4"}
    planner = open_s3_source(s3_endpoint, prefix, **options)
    reader = open_s3_source(s3_endpoint, prefix, **options)  # as in another process
    start, ids = SourceCheckpoint(), []
    while (end := asyncio.run(planner.plan_end(start, 5))) != start:
        ids += read_range(reader, start, end)
        start = end
    assert ids == expected
    whole = asyncio.run(planner.plan_end(SourceCheckpoint(), None))
    assert whole.get_offset("files") == f"end:003.{file_format}"
    assert read_range(reader, SourceCheckpoint(), whole) == expected
    for source in (planner, reader):
        asyncio.run(source.close())


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_a_dead_endpoint_fails_open_quickly_naming_path_without_the_secret(s3_endpoint):
    options = s3_options(s3_endpoint) | {"s3.endpoint": f"http://127.0.0.1:{closed_port()}"}
    config = ConnectorConfig("files", {"path": "s3://some-bucket/in", **options})
    started = time.monotonic()
    with pytest.raises(ConnectionFailed) as caught:
        asyncio.run(FilesSource().open(config))
    assert time.monotonic() - started < 30
    message = str(caught.value)
    assert "s3://some-bucket/in" in message
    assert "s3.endpoint" in message  # what to check
    assert SECRET not in message
    assert caught.value.is_transient


def test_wrong_credentials_fail_open_naming_path_without_the_secret(monkeypatch):
    # moto checks credentials after this many unauthenticated requests (the bucket's creation).
    monkeypatch.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "1")
    with moto_s3_server() as endpoint:
        monkeypatch.delenv("INITIAL_NO_AUTH_ACTION_COUNT")
        config = ConnectorConfig(
            "files",
            {
                "path": f"s3://{endpoint.bucket}/in",
                **s3_options(endpoint),
                "s3.access_key": "AKIANOTAKEYATALL",
            },
        )
        with pytest.raises(ConnectionFailed) as caught:
            asyncio.run(FilesSource().open(config))
    message = str(caught.value)
    assert f"s3://{endpoint.bucket}/in" in message
    assert "ACCESS_DENIED" in message
    assert "credentials" in message  # what to check
    assert SECRET not in message
    assert "AKIANOTAKEYATALL" not in message
    assert not caught.value.is_transient, "refused credentials stay refused when retried"


def test_a_store_that_goes_away_fails_polls_naming_the_object_without_the_secret():
    with moto_s3_server() as endpoint:
        prefix = f"{endpoint.bucket}/in"
        put_object(endpoint, f"{prefix}/a.parquet", [1], "parquet")
        source = open_s3_source(endpoint, prefix, **{"s3.max_attempts": "1"})
    with pytest.raises(ReadError) as caught:
        asyncio.run(source.poll_batch(10))
    message = str(caught.value)
    assert f"s3://{prefix}" in message
    assert SECRET not in message
    assert caught.value.is_transient


def test_a_missing_bucket_is_refused_naming_path(s3_endpoint):
    config = ConnectorConfig(
        "files", {"path": "s3://no-such-bucket-here/in", **s3_options(s3_endpoint)}
    )
    with pytest.raises(ConfigurationError) as caught:
        asyncio.run(FilesSource().open(config))
    assert caught.value.key == "path"
    assert "'no-such-bucket-here' does not exist" in str(caught.value)
    assert SECRET not in str(caught.value)


def test_secrets_are_redacted_in_the_config_display(s3_endpoint):
    options = s3_options(s3_endpoint) | {"s3.session_token": "token-" + SECRET}
    config = ConnectorConfig("files", {"path": "s3://b/in", **options})
    validated = config.validate(FilesSource.CONFIG_KEYS)
    for shown in (repr(validated), str(validated), repr(config), str(validated.redacted())):
        assert SECRET not in shown
        assert s3_endpoint.access_key_id not in shown
        assert "s3://b/in" in shown


@pytest.mark.parametrize(
    ("options", "key", "problem"),
    [
        ({"s3.access_key": "AKIA"}, "s3.secret_key", "go together"),
        ({"s3.endpoint": "http://127.0.0.1:1"}, "s3.endpoint", "s3.allow_http=true"),
        ({"s3.endpoint": "ftp://host"}, "s3.endpoint", "http(s) URL"),
        ({"s3.timeout_s": "0"}, "s3.timeout_s", "> 0"),
        ({"s3.max_attempts": "0"}, "s3.max_attempts", ">= 1"),
    ],
)
def test_bad_s3_keys_are_refused_naming_the_key(options, key, problem):
    config = ConnectorConfig("files", {"path": "s3://b/in", **options})
    with pytest.raises(ConfigurationError, match=re.escape(problem)) as caught:
        asyncio.run(FilesSource().open(config))
    assert caught.value.key == key


def test_s3_keys_with_a_local_path_are_refused(tmp_path):
    config = ConnectorConfig("files", {"path": str(tmp_path), "s3.region": "eu-west-1"})
    with pytest.raises(ConfigurationError, match="apply to s3:// paths only") as caught:
        asyncio.run(FilesSource().open(config))
    assert caught.value.key == "s3.region"


def test_credentials_in_the_uri_are_refused_without_showing_them():
    config = ConnectorConfig("files", {"path": f"s3://AKIAEXAMPLE:{SECRET}@bucket/in"})
    with pytest.raises(ConfigurationError, match="s3.access_key") as caught:
        asyncio.run(FilesSource().open(config))
    assert caught.value.key == "path"
    assert SECRET not in str(caught.value)
    assert "AKIAEXAMPLE" not in str(caught.value)


def test_the_sink_still_refuses_an_s3_uri_saying_why(s3_endpoint):
    config = ConnectorConfig("files", {"path": f"s3://{s3_endpoint.bucket}/out"})
    with pytest.raises(ConfigurationError) as caught:
        asyncio.run(FilesSink().open(config))
    assert caught.value.key == "path"
    assert "atomic directory rename" in str(caught.value)
    assert "exactly-once" in str(caught.value)


def test_the_conformance_source_context_runs_on_a_bucket_when_told(
    s3_endpoint, tmp_path, monkeypatch
):
    monkeypatch.setenv("LAMINAR_FILES_SOURCE_URI", f"s3://{s3_endpoint.bucket}/conformance")
    monkeypatch.setenv("LAMINAR_FILES_SOURCE_S3_ENDPOINT", s3_endpoint.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_endpoint.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_endpoint.secret_access_key)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    context = FilesSourceContext(tmp_path)
    assert context.path.startswith(f"s3://{s3_endpoint.bucket}/conformance/")
    context.append([1, 2, 3])
    context.append([4])
    source = FilesSource()
    asyncio.run(source.open(context.config()))
    assert drain(source)[0] == [1, 2, 3, 4]
    asyncio.run(source.close())
    root = context.path.removeprefix("s3://")
    listed = store(s3_endpoint).get_file_info(pafs.FileSelector(root))
    assert sorted(info.base_name for info in listed) == [
        "part-000000.parquet",
        "part-000001.parquet",
    ]
