"""The ``object`` store against moto's S3 server on loopback: the suite, and S3 specifics."""

from __future__ import annotations

import uuid

import obstore
import pytest
from blob_access import BlobRawAccess
from laminar_conformance.checkpointer import (
    CheckpointerContext,
    CheckpointerSuite,
    run,
    write_checkpoint,
)
from laminar_conformance.services import S3Endpoint
from obstore.exceptions import AlreadyExistsError, PreconditionError
from obstore.store import S3Store

from laminar_sdk import CheckpointError, open_checkpointer
from laminar_sdk._checkpointing.object_store import ObjectStoreCheckpointer

SECRET = "s3cr3t-value-never-shown"


class ObjectContext(BlobRawAccess, CheckpointerContext):
    def __init__(self, endpoint: S3Endpoint) -> None:
        self.location = endpoint.location(f"test-{uuid.uuid4().hex}")
        self.options = endpoint.checkpointer_options()
        self._raw = self.open()

    def open(self) -> ObjectStoreCheckpointer:
        store = open_checkpointer(self.location, options=self.options)
        assert isinstance(store, ObjectStoreCheckpointer)
        return store


class TestObjectStoreCheckpointer(CheckpointerSuite):
    @pytest.fixture
    def checkpointer_context(self, s3_endpoint: S3Endpoint) -> ObjectContext:
        return ObjectContext(s3_endpoint)


def _raw_store(endpoint: S3Endpoint, prefix: str) -> S3Store:
    return S3Store(
        endpoint.bucket,
        prefix=prefix,
        endpoint=endpoint.url,
        region=endpoint.region,
        access_key_id=endpoint.access_key_id,
        secret_access_key=endpoint.secret_access_key,
        client_options={"allow_http": True},
    )


def test_the_server_does_conditional_puts(s3_endpoint: S3Endpoint) -> None:
    """What the store relies on, checked on the server itself: If-None-Match and If-Match."""
    store = _raw_store(s3_endpoint, f"probe-{uuid.uuid4().hex}")
    first = obstore.put(store, "key", b"one", mode="create")
    with pytest.raises(AlreadyExistsError):
        obstore.put(store, "key", b"two", mode="create")
    obstore.put(store, "key", b"three", mode={"e_tag": first["e_tag"] or ""})
    with pytest.raises(PreconditionError):
        obstore.put(store, "key", b"four", mode={"e_tag": first["e_tag"] or ""})
    assert bytes(obstore.get(store, "key").bytes()) == b"three"


def test_checkpoints_are_laid_out_under_the_prefix(s3_endpoint: S3Endpoint) -> None:
    prefix = f"layout-{uuid.uuid4().hex}"
    store = open_checkpointer(
        s3_endpoint.location(prefix), options=s3_endpoint.checkpointer_options()
    )
    manifest = run(write_checkpoint(store, 1))
    listed = sorted(
        meta["path"] for chunk in obstore.list(_raw_store(s3_endpoint, prefix)) for meta in chunk
    )
    assert listed == sorted(
        ["_latest", f"{manifest.checkpoint_id}/manifest.json", *manifest.artifact_paths()]
    )


def test_credentials_never_show(s3_endpoint: S3Endpoint) -> None:
    options = {**s3_endpoint.checkpointer_options(), "secret_access_key": SECRET}
    store = open_checkpointer(s3_endpoint.location("secret"), options=options)
    assert SECRET not in repr(store)
    assert "***" in repr(store)
    dead = {**options, "endpoint": "http://127.0.0.1:9", "timeout": "1s", "connect_timeout": "1s"}
    unreachable = ObjectStoreCheckpointer(s3_endpoint.location("secret"), dead)
    with pytest.raises(CheckpointError) as failure:
        run(unreachable._read("_latest"))
    assert SECRET not in str(failure.value)
    assert "127.0.0.1:9" in str(failure.value)


def test_bad_option_is_named_without_its_value(s3_endpoint: S3Endpoint) -> None:
    options = {**s3_endpoint.checkpointer_options(), "no_such_secret_key": SECRET}
    with pytest.raises(CheckpointError, match="no_such_secret_key") as failure:
        ObjectStoreCheckpointer(s3_endpoint.location("x"), options)
    assert SECRET not in str(failure.value)


@pytest.mark.parametrize("location", ["file:///tmp/x", "memory://x", "/tmp/x", "http://host/x"])
def test_other_locations_are_refused(location: str) -> None:
    with pytest.raises(CheckpointError, match="object checkpoint store opens"):
        ObjectStoreCheckpointer(location)


def test_local_directories_are_pointed_to_the_file_store() -> None:
    with pytest.raises(CheckpointError, match="use the `file` store"):
        open_checkpointer("file:///tmp/x", store="object")


def test_location_is_shown_without_userinfo_or_query() -> None:
    store = ObjectStoreCheckpointer("s3://bucket/prefix?sig=SECRET", {"region": "us-east-1"})
    assert store.location == "s3://bucket/prefix"
