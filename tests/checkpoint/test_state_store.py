"""A connector's own state store, kept by the built-in checkpoint stores in their location."""

from __future__ import annotations

import asyncio
import io
import os
import pickle
from pathlib import Path

import pytest
from laminar_conformance.services import S3Endpoint

from laminar_sdk import (
    Checkpointer,
    CheckpointError,
    ConfigKeySpec,
    ConnectorConfig,
    FileCheckpointer,
    StateStore,
    open_checkpointer,
)
from laminar_sdk._checkpointing.memory_store import MemoryCheckpointer

LARGE = os.urandom(12 * 1024 * 1024 + 17)
"""Larger than a file store's copy chunk and an object store's upload part (5 MiB)."""


async def exercise(store: StateStore) -> dict[str, object]:
    await store.put("t1/epoch-1.arrow", b"one")
    await store.put("t1/epoch-2.arrow", b"two")
    await store.put("t2/epoch-1.arrow", b"other")
    await store.put("t1/epoch-1.arrow", b"one again")
    found = {
        "all": await store.names(),
        "t1": await store.names("t1/"),
        "get": await store.get("t1/epoch-1.arrow"),
        "missing": await store.get("t1/epoch-9.arrow"),
    }
    await store.delete("t1/epoch-2.arrow")
    await store.delete("t1/epoch-2.arrow")  # missing: not an error
    found["after delete"] = await store.names("t1/")
    spool = io.BytesIO(b"header" + LARGE)
    spool.seek(len(b"header"))  # what is stored starts at the file's position
    await store.put_file("t3/epoch-1.arrow", spool)
    found["from a file"] = await store.get("t3/epoch-1.arrow") == LARGE
    stored = await store.get_file("t3/epoch-1.arrow")
    assert stored is not None
    with stored:
        found["as a file"] = stored.read() == LARGE
    found["missing as a file"] = await store.get_file("t3/epoch-9.arrow")
    return found


EXPECTED = {
    "all": ["t1/epoch-1.arrow", "t1/epoch-2.arrow", "t2/epoch-1.arrow"],
    "t1": ["t1/epoch-1.arrow", "t1/epoch-2.arrow"],
    "get": b"one again",
    "missing": None,
    "after delete": ["t1/epoch-1.arrow"],
    "from a file": True,
    "as a file": True,
    "missing as a file": None,
}


class ReadSizes(io.BytesIO):
    """A file that remembers how much each ``read`` asked for (``-1``: everything)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.asked: list[int] = []

    def read(self, size: int | None = -1, /) -> bytes:
        self.asked.append(-1 if size is None else size)
        return super().read(size)


def test_a_file_store_keeps_each_connectors_state_apart_from_its_checkpoints(
    tmp_path: Path,
) -> None:
    checkpoints = FileCheckpointer(str(tmp_path))
    store = checkpoints.state_store("sink.kafka")
    other = checkpoints.state_store("sink.other")

    assert asyncio.run(exercise(store)) == EXPECTED
    assert asyncio.run(other.names()) == []
    assert (tmp_path / "state" / "sink.kafka" / "t1" / "epoch-1.arrow").read_bytes() == b"one again"
    assert store.location == f"{tmp_path}/state/sink.kafka"
    assert asyncio.run(checkpoints.list_checkpoints()) == []
    assert asyncio.run(checkpoints.list_artifacts()) == [], "state is no checkpoint's artifact"
    (tmp_path / "state" / "sink.kafka" / "t1" / ".tmp-leftover").write_bytes(b"x")
    assert asyncio.run(store.names("t1/")) == ["t1/epoch-1.arrow"], "no write's leftovers"


def test_a_file_store_streams_a_file_into_its_state_and_opens_it_to_read(tmp_path: Path) -> None:
    store = FileCheckpointer(str(tmp_path)).state_store("sink.kafka")
    spool = ReadSizes(LARGE)

    asyncio.run(store.put_file("t1/epoch-1.arrow", spool))

    stored = tmp_path / "state" / "sink.kafka" / "t1" / "epoch-1.arrow"
    assert stored.read_bytes() == LARGE
    assert -1 not in spool.asked, "the whole file was read into memory"
    assert max(spool.asked) < len(LARGE)
    opened = asyncio.run(store.get_file("t1/epoch-1.arrow"))
    assert opened is not None
    with opened:
        assert os.fstat(opened.fileno()).st_ino == stored.stat().st_ino, "not the stored file"


def test_a_memory_store_and_a_third_party_state_store_take_a_file_whole() -> None:
    class Dictionary(StateStore):
        def __init__(self) -> None:
            self.blobs: dict[str, bytes] = {}

        location = "a dictionary"

        async def put(self, name: str, data: bytes) -> None:
            self.blobs[name] = data

        async def get(self, name: str) -> bytes | None:
            return self.blobs.get(name)

        async def delete(self, name: str) -> None:
            self.blobs.pop(name, None)

        async def names(self, prefix: str = "") -> list[str]:
            return sorted(name for name in self.blobs if name.startswith(prefix))

    checkpoints = MemoryCheckpointer("memory://put-file")
    memory = checkpoints.state_store("sink.kafka")
    assert memory is not None
    try:
        assert asyncio.run(exercise(memory)) == EXPECTED
    finally:
        checkpoints.discard()
    assert asyncio.run(exercise(Dictionary())) == EXPECTED


def test_an_object_store_keeps_state_too(s3_endpoint: S3Endpoint) -> None:
    checkpoints = open_checkpointer(
        s3_endpoint.location("state"), options=s3_endpoint.checkpointer_options()
    )
    store = checkpoints.state_store("sink.kafka")
    assert store is not None

    assert asyncio.run(exercise(store)) == EXPECTED


@pytest.mark.parametrize("name", ["", "../x", "a//b", "/abs", ".hidden", "a b", "x/../../y"])
def test_a_name_that_could_leave_the_store_is_refused(tmp_path: Path, name: str) -> None:
    store = FileCheckpointer(str(tmp_path)).state_store("sink.kafka")

    with pytest.raises(CheckpointError, match="is not allowed"):
        asyncio.run(store.put(name, b"x"))


def test_a_store_that_cannot_keep_state_offers_none() -> None:
    # A third-party store implementing only the abstract methods (none of which is called).
    methods = {name: lambda *args: None for name in Checkpointer.__abstractmethods__}
    minimal = type("Minimal", (Checkpointer,), {**methods, "location": "nowhere"})

    assert minimal().state_store("sink.x") is None


def test_a_configuration_carries_its_state_store_but_not_into_a_pickle(tmp_path: Path) -> None:
    store = FileCheckpointer(str(tmp_path)).state_store("sink.kafka")
    config = ConnectorConfig("kafka", {"topic": "t", "password": "p"}).with_state_store(store)

    validated = config.validate([ConfigKeySpec("topic"), ConfigKeySpec("password")])
    shipped = pickle.loads(pickle.dumps(validated))

    assert validated.state_store is store
    assert shipped.state_store is None
    assert shipped == validated
    assert shipped.is_secret("password")
