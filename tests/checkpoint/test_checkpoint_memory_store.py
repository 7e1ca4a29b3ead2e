"""The ``memory`` store adopts the checkpointer conformance suite."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from blob_access import BlobRawAccess
from laminar_conformance.checkpointer import CheckpointerContext, CheckpointerSuite, run

from laminar_sdk import CheckpointError, CheckpointId, MemoryCheckpointer


class MemoryContext(BlobRawAccess, CheckpointerContext):
    def __init__(self) -> None:
        self.location = f"memory://test-{uuid.uuid4().hex}"
        # Raw access goes through a private instance's primitives: nothing else reaches the
        # process-global space.
        self._raw = MemoryCheckpointer(self.location)

    def open(self) -> MemoryCheckpointer:
        return MemoryCheckpointer(self.location)


class TestMemoryCheckpointer(CheckpointerSuite):
    @pytest.fixture
    def checkpointer_context(self) -> Iterator[MemoryContext]:
        context = MemoryContext()
        yield context
        context.open().discard()


def test_locations_are_separate_and_discard_forgets_them() -> None:
    first, second = MemoryContext(), MemoryContext()

    async def scenario() -> None:
        await first.open().save_snapshot(CheckpointId.new(), "op", 0, b"x")
        assert len(await first.open().list_artifacts()) == 1
        assert await second.open().list_artifacts() == []
        first.open().discard()
        assert await first.open().list_artifacts() == []

    run(scenario())


@pytest.mark.parametrize("location", ["memory:/x", "/tmp/x", "s3://b/x"])
def test_only_memory_locations(location: str) -> None:
    with pytest.raises(CheckpointError, match="memory://NAME"):
        MemoryCheckpointer(location)


def test_no_options() -> None:
    with pytest.raises(CheckpointError, match="takes no options"):
        MemoryCheckpointer("memory://x", {"a": "b"})
