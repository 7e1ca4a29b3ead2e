"""The checkpoint-store conformance suite: what every ``Checkpointer`` backend must do.

The suites are classes without the ``Test`` prefix (fsspec's pattern). A backend adopts them
in its own tests with one class and one fixture that yields a :class:`CheckpointerContext`::

    import pytest
    from laminar_conformance.checkpointer import CheckpointerContext, CheckpointerSuite

    class MyContext(CheckpointerContext):
        ...  # open(), read_raw(), write_raw(), delete_raw()

    class TestMyStore(CheckpointerSuite):
        @pytest.fixture
        def checkpointer_context(self, tmp_path):
            yield MyContext(tmp_path)

Every test gets a fresh, empty location. ``CheckpointerSuite`` is all the suites; adopt
single ones (``CheckpointerRoundTripSuite``, ...) to run part of it, and override one test by
defining a method of the same name (mark it ``pytest.mark.skip(reason=...)`` to leave it out,
with the reason).

What is checked: round trips of manifests and artifacts; ordering of listings; a latest pointer
that never moves backwards; simulated crashes between the artifact, manifest and pointer
writes (the writer's instance is dropped, a new one opened on the same location); corruption
(truncation, a flipped byte, a deleted file) of manifests, snapshots, deltas and the pointer,
always reported with the path and never loaded; two writers racing on one location, in one
event loop and in two threads; names that would escape the store; and retention.
"""

from __future__ import annotations

import asyncio
import enum
import random
import threading
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from laminar_conformance._skips import skip

# These names are exported by laminar_sdk once the checkpoint stores are published there.
from laminar_sdk import (
    CheckpointConflict,
    CheckpointCorrupted,
    Checkpointer,
    CheckpointError,
    CheckpointId,
    CheckpointManifest,
    CheckpointNotFound,
    CheckpointStoreError,
    SinkEpochStatus,
    SourceCheckpoint,
    load_checkpoint,
    load_latest_valid,
    prune_checkpoints,
)

T = TypeVar("T")

SINK = "sink"
"""The sink every checkpoint the suite writes carries."""

UNSAFE_NAMES = ("", ".", "..", "../x", "a/b", "/abs", "a\\b", "a\0b", "-dash", ".hidden", "é")
"""Operator names a store must refuse (they would escape, or are not portable path parts)."""

UNSAFE_PATHS = (
    "",
    "..",
    "../x",
    "/etc/passwd",
    "_latest",
    "x/../../y",
    "{id}/../../escape",
    "{id}/operators/../../../x/partition-0.snap",
    "{id}/operators/op/partition-0.snap\0",
    "{id}/manifest.json",
)
"""Artifact paths a store must refuse to load (``{id}`` is replaced by a real id)."""


class Corruption(enum.Enum):
    """How :meth:`CheckpointerContext.corrupt` damages a stored file."""

    TRUNCATE = "truncate"
    """Keep the first half (a torn write)."""
    FLIP_BYTE = "flip-byte"
    """Invert the top bit of the byte in the middle (bit rot)."""
    DELETE = "delete"
    """Remove the file."""


class CheckpointerContext(ABC):
    """What a backend's tests give the suite: its store, and raw access to what it stored.

    One context is one fresh, empty location. Paths are relative to it, as the store's
    ``manifest_path`` / ``latest_path`` / artifact paths are.
    """

    #: Whether two threads, each with its own event loop and instance, may use the location.
    supports_threads: bool = True

    @abstractmethod
    def open(self) -> Checkpointer:
        """A new instance on this context's location.

        It sees everything stored before, as a restarted process would.
        """

    @abstractmethod
    async def read_raw(self, path: str) -> bytes:
        """The stored bytes at ``path``, bypassing the store."""

    @abstractmethod
    async def write_raw(self, path: str, data: bytes) -> None:
        """Replace the bytes at ``path`` (creating it), bypassing the store."""

    @abstractmethod
    async def delete_raw(self, path: str) -> None:
        """Remove ``path``, bypassing the store."""

    async def corrupt(self, path: str, how: Corruption) -> None:
        """Damage the file at ``path``. Override when a store needs another way."""
        if how is Corruption.DELETE:
            await self.delete_raw(path)
            return
        await self.write_raw(path, corrupted(await self.read_raw(path), how))


def corrupted(data: bytes, how: Corruption) -> bytes:
    """``data`` truncated to half, or with the top bit of its middle byte inverted.

    :raises ValueError: for :attr:`Corruption.DELETE`, which leaves no bytes to damage.
    """
    if how is Corruption.TRUNCATE:
        return data[: len(data) // 2]
    if how is Corruption.FLIP_BYTE:
        middle = len(data) // 2
        return data[:middle] + bytes([data[middle] ^ 0x80]) + data[middle + 1 :]
    raise ValueError(f"{how} leaves no bytes to damage")


def damage_file(path: Path, how: Corruption) -> None:
    """Damage a stored file in place (a local store's, or Spark's): truncate, flip or delete."""
    if how is Corruption.DELETE:
        path.unlink()
    else:
        path.write_bytes(corrupted(path.read_bytes(), how))


def run(scenario: Awaitable[T]) -> T:
    """Run one async scenario to completion (the suite needs no async pytest plugin)."""

    async def main() -> T:
        return await scenario

    return asyncio.run(main())


async def write_checkpoint(
    checkpointer: Checkpointer,
    epoch: int,
    *,
    states: dict[tuple[str, int], bytes] | None = None,
    delta: dict[tuple[str, int], bytes] | None = None,
    stop_after: str | None = None,
    parent: CheckpointManifest | None = None,
) -> CheckpointManifest:
    """Take one checkpoint the way the runtime does, optionally "crashing" part-way.

    Artifacts, then the manifest with the sink pending, then the pointer, then the manifest
    with the sink committed. ``stop_after`` is ``"artifacts"``, ``"manifest"`` or
    ``"pointer"``: the steps after it are not done (what a crash there leaves).

    :param states: ``(operator, partition)`` to snapshot bytes (default: one partition).
    :param delta: ``(operator, partition)`` to delta bytes.
    :param parent: a checkpoint whose artifacts this one lists too (an incremental chain).
    :returns: the manifest as last saved (or as it would have been).
    """
    manifest = CheckpointManifest.new(
        epoch,
        parent_id=None if parent is None else parent.checkpoint_id,
        watermark=epoch * 1000,
    )
    if parent is not None:
        for operator, entry in parent.partitions():
            manifest = manifest.with_partition(operator, entry)
    snapshots = {("agg", 0): f"state of epoch {epoch}".encode()} if states is None else states
    for is_delta, artifacts in ((False, snapshots), (True, delta or {})):
        for (operator, partition), data in artifacts.items():
            entry = await checkpointer.save_partition(
                manifest.checkpoint_id, operator, partition, data, delta=is_delta
            )
            manifest = manifest.with_partition(operator, entry)
    manifest = manifest.with_source_offset(
        "source", SourceCheckpoint({"0": str(epoch * 10)}, epoch)
    ).with_sink_status(SINK, SinkEpochStatus.PENDING)
    if stop_after == "artifacts":
        return manifest
    await checkpointer.save_manifest(manifest)
    if stop_after == "manifest":
        return manifest
    await checkpointer.update_latest(manifest.checkpoint_id)
    if stop_after == "pointer":
        return manifest
    committed = manifest.with_sink_status(SINK, SinkEpochStatus.COMMITTED)
    await checkpointer.save_manifest(committed)
    return committed


async def write_checkpoints(checkpointer: Checkpointer, count: int) -> list[CheckpointManifest]:
    """``count`` complete checkpoints, epochs 1 to ``count``."""
    return [await write_checkpoint(checkpointer, epoch) for epoch in range(1, count + 1)]


class CheckpointerRoundTripSuite:
    """What is saved loads back unchanged; what is missing or unsafe is refused."""

    def test_empty_location(self, checkpointer_context: CheckpointerContext) -> None:
        """A fresh location has no checkpoints, no pointer, nothing to recover."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            assert await store.read_latest() is None
            assert await store.list_checkpoints() == []
            assert await store.list_artifacts() == []
            assert await load_latest_valid(store) is None

        run(scenario())

    def test_manifest_round_trip(self, checkpointer_context: CheckpointerContext) -> None:
        """Every manifest field survives a save and a load by another instance."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            parent = await write_checkpoint(store, 1)
            manifest = await write_checkpoint(
                store,
                2,
                states={("agg", 7): b"bb", ("join.left", 1): b""},
                delta={("agg", 3): b"delta"},
                parent=parent,
            )
            loaded = await checkpointer_context.open().load_manifest(manifest.checkpoint_id)
            assert loaded == manifest
            assert loaded.parent_id == parent.checkpoint_id
            assert loaded.artifact_paths() >= parent.artifact_paths()
            assert [p.partition_id for p in loaded.operators["agg"]] == [0, 3, 7]
            assert loaded.source_offsets["source"] == SourceCheckpoint({"0": "20"}, 2)
            assert loaded.sink_statuses == {SINK: SinkEpochStatus.COMMITTED}
            assert loaded.watermark == 2000
            assert loaded.total_size_bytes == len(b"state of epoch 1") + 2 + 0 + 5

        run(scenario())

    @settings(
        max_examples=25,
        deadline=None,
        # Each adopting class runs this inherited method (one executor per backend), and the
        # fixture is per test, not per example: every example uses a fresh checkpoint id.
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.differing_executors,
        ],
    )
    @given(data=st.binary(max_size=4096), partition=st.integers(0, 2**32 - 1), delta=st.booleans())
    def test_artifact_round_trip(
        self,
        checkpointer_context: CheckpointerContext,
        data: bytes,
        partition: int,
        delta: bool,
    ) -> None:
        """Any bytes saved as a snapshot or delta load back equal, sha256 checked."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            checkpoint_id = CheckpointId.new()
            entry = await store.save_partition(checkpoint_id, "op", partition, data, delta=delta)
            assert entry.size_bytes == len(data)
            assert entry.is_delta is delta
            loaded = await checkpointer_context.open().load_artifact(
                entry.path, sha256=entry.sha256
            )
            assert loaded == data

        run(scenario())

    def test_large_artifact_round_trip(self, checkpointer_context: CheckpointerContext) -> None:
        """A 7 MiB artifact (above multipart thresholds) round-trips."""
        data = bytes(range(256)) * 4096 * 7  # 7 MiB: above multipart thresholds
        checkpoint_id = CheckpointId.new()

        async def scenario() -> None:
            store = checkpointer_context.open()
            digest = await store.save_snapshot(checkpoint_id, "big", 0, data)
            path = store.artifact_path(checkpoint_id, "big", 0)
            assert await store.load_artifact(path, sha256=digest) == data

        run(scenario())

    def test_snapshot_and_delta_are_separate(
        self, checkpointer_context: CheckpointerContext
    ) -> None:
        """A partition's snapshot and delta are stored apart."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            checkpoint_id = CheckpointId.new()
            snap = await store.save_partition(checkpoint_id, "op", 0, b"snapshot")
            delta = await store.save_partition(checkpoint_id, "op", 0, b"delta", delta=True)
            assert snap.path != delta.path
            assert await store.load_artifact(snap.path) == b"snapshot"
            assert await store.load_artifact(delta.path) == b"delta"

        run(scenario())

    def test_missing_files_are_not_found(self, checkpointer_context: CheckpointerContext) -> None:
        """Missing manifests and artifacts raise CheckpointNotFound with the path."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            checkpoint_id = CheckpointId.new()
            with pytest.raises(CheckpointNotFound) as missing_manifest:
                await store.load_manifest(checkpoint_id)
            assert missing_manifest.value.path == store.manifest_path(checkpoint_id)
            path = store.artifact_path(checkpoint_id, "op", 0)
            with pytest.raises(CheckpointNotFound) as missing_artifact:
                await store.load_artifact(path)
            assert missing_artifact.value.path == path
            with pytest.raises(CheckpointNotFound):
                await store.update_latest(checkpoint_id)
            assert await store.read_latest() is None

        run(scenario())

    def test_saving_the_same_manifest_again_is_harmless(
        self, checkpointer_context: CheckpointerContext
    ) -> None:
        """Re-saving identical content (a retry) is a no-op."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            manifest = await write_checkpoint(store, 1)
            await store.save_manifest(manifest)
            await checkpointer_context.open().save_manifest(manifest)
            assert await store.load_manifest(manifest.checkpoint_id) == manifest

        run(scenario())

    def test_sinks_move_forward_only(self, checkpointer_context: CheckpointerContext) -> None:
        """A manifest may be re-saved only to move sinks forward, never back."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            pending = await write_checkpoint(store, 1, stop_after="manifest")
            committed = pending.with_sink_status(SINK, SinkEpochStatus.COMMITTED)
            await store.save_manifest(committed)
            assert await store.load_manifest(pending.checkpoint_id) == committed
            with pytest.raises(CheckpointConflict) as stale:
                await checkpointer_context.open().save_manifest(pending)
            assert stale.value.path == store.manifest_path(pending.checkpoint_id)
            failed = pending.with_sink_status(SINK, SinkEpochStatus.FAILED)
            with pytest.raises(CheckpointConflict):
                await store.save_manifest(failed)
            assert await store.load_manifest(pending.checkpoint_id) == committed

        run(scenario())

    def test_different_manifest_under_the_same_id_is_refused(
        self, checkpointer_context: CheckpointerContext
    ) -> None:
        """Other content under a stored id is a conflict; the stored one stays."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            manifest = await write_checkpoint(store, 1)
            impostor = CheckpointManifest(manifest.checkpoint_id, 99, manifest.timestamp_ms)
            with pytest.raises(CheckpointConflict):
                await checkpointer_context.open().save_manifest(impostor)
            assert await store.load_manifest(manifest.checkpoint_id) == manifest

        run(scenario())

    @pytest.mark.parametrize("operator", UNSAFE_NAMES)
    def test_unsafe_operator_names_are_refused(
        self, checkpointer_context: CheckpointerContext, operator: str
    ) -> None:
        """Operator names that could escape the store are refused; nothing is written."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            checkpoint_id = CheckpointId.new()
            with pytest.raises(CheckpointError, match="operator name"):
                await store.save_snapshot(checkpoint_id, operator, 0, b"x")
            with pytest.raises(CheckpointError, match="operator name"):
                await store.save_delta(checkpoint_id, operator, 0, b"x")
            assert await store.list_artifacts() == []

        run(scenario())

    @pytest.mark.parametrize("template", UNSAFE_PATHS)
    def test_unsafe_paths_are_refused(
        self, checkpointer_context: CheckpointerContext, template: str
    ) -> None:
        """Artifact paths outside the layout are refused for loading and deleting."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            manifest = await write_checkpoint(store, 1)
            path = template.replace("{id}", str(manifest.checkpoint_id))
            with pytest.raises(CheckpointError):
                await store.load_artifact(path)
            with pytest.raises(CheckpointError):
                await store.delete_artifact(path)
            assert await load_checkpoint(store, manifest.checkpoint_id)

        run(scenario())

    def test_bad_partitions_are_refused(self, checkpointer_context: CheckpointerContext) -> None:
        """Partitions outside 0..2**32-1 are refused."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            for partition in (-1, 2**32, True, 1.5):
                with pytest.raises(CheckpointError, match="partition"):
                    await store.save_snapshot(CheckpointId.new(), "op", partition, b"x")  # type: ignore[arg-type]

        run(scenario())


class CheckpointerOrderingSuite:
    """Listings are oldest first; the latest pointer never moves backwards."""

    def test_list_is_oldest_first(self, checkpointer_context: CheckpointerContext) -> None:
        """list_checkpoints is ordered by id (creation time), not by save order."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            ids = [CheckpointId.new() for _ in range(5)]
            for checkpoint_id in (ids[3], ids[0], ids[4], ids[2], ids[1]):
                await store.save_manifest(CheckpointManifest(checkpoint_id, 1, 0))
            assert await checkpointer_context.open().list_checkpoints() == ids

        run(scenario())

    def test_latest_moves_forward_only(self, checkpointer_context: CheckpointerContext) -> None:
        """update_latest to an older or equal id is a no-op returning False."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            first, second = await write_checkpoints(store, 2)
            assert await store.read_latest() == second.checkpoint_id
            assert await store.update_latest(first.checkpoint_id) is False
            assert await store.update_latest(second.checkpoint_id) is False
            assert await checkpointer_context.open().read_latest() == second.checkpoint_id
            third = await write_checkpoint(store, 3, stop_after="manifest")
            assert await store.update_latest(third.checkpoint_id) is True
            assert await store.read_latest() == third.checkpoint_id

        run(scenario())

    def test_delete_checkpoint(self, checkpointer_context: CheckpointerContext) -> None:
        """Deleting removes the manifest and artifacts; again is a no-op."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            first, second = await write_checkpoints(store, 2)
            await store.delete_checkpoint(first.checkpoint_id)
            await store.delete_checkpoint(first.checkpoint_id)  # again: a no-op
            reopened = checkpointer_context.open()
            assert await reopened.list_checkpoints() == [second.checkpoint_id]
            assert await reopened.list_artifacts() == sorted(second.artifact_paths())
            with pytest.raises(CheckpointNotFound):
                await reopened.load_manifest(first.checkpoint_id)
            recovered = await load_latest_valid(reopened)
            assert recovered is not None
            assert recovered.manifest == second

        run(scenario())


class CheckpointerCrashSuite:
    """A writer that dies between the artifact, manifest and pointer writes loses nothing."""

    @pytest.mark.parametrize("crash_after", ["artifacts", "manifest"])
    def test_crash_before_the_pointer_keeps_the_previous_checkpoint(
        self, checkpointer_context: CheckpointerContext, crash_after: str
    ) -> None:
        """A crash after the artifacts or the manifest leaves the previous checkpoint latest."""

        async def scenario() -> None:
            writer = checkpointer_context.open()
            previous = await write_checkpoint(writer, 1)
            await write_checkpoint(writer, 2, stop_after=crash_after)
            del writer  # the crash: nothing of the writer survives but what it stored
            restarted = checkpointer_context.open()
            assert await restarted.read_latest() == previous.checkpoint_id
            recovered = await load_latest_valid(restarted)
            assert recovered is not None
            assert recovered.manifest == previous
            assert recovered.artifact("agg", 0) == b"state of epoch 1"
            # and the restarted pipeline checkpoints on from there
            following = await write_checkpoint(restarted, 2)
            assert await restarted.read_latest() == following.checkpoint_id

        run(scenario())

    def test_crash_before_the_first_pointer_recovers_nothing(
        self, checkpointer_context: CheckpointerContext
    ) -> None:
        """A crash in the very first checkpoint recovers to nothing, not to it."""

        async def scenario() -> None:
            await write_checkpoint(checkpointer_context.open(), 1, stop_after="manifest")
            restarted = checkpointer_context.open()
            assert await restarted.read_latest() is None
            assert await load_latest_valid(restarted) is None

        run(scenario())

    def test_crash_before_sinks_commit_recovers_them_pending(
        self, checkpointer_context: CheckpointerContext
    ) -> None:
        """A crash before the commit leaves the recovered sinks pending (to roll back)."""

        async def scenario() -> None:
            pending = await write_checkpoint(checkpointer_context.open(), 1, stop_after="pointer")
            recovered = await load_latest_valid(checkpointer_context.open())
            assert recovered is not None
            assert recovered.manifest == pending
            assert recovered.manifest.sink_statuses[SINK] is SinkEpochStatus.PENDING

        run(scenario())

    def test_torn_manifest_falls_back(self, checkpointer_context: CheckpointerContext) -> None:
        """A torn manifest is reported with its path; recovery uses the one before."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            previous = await write_checkpoint(store, 1)
            torn = await write_checkpoint(store, 2, stop_after="artifacts")
            path = store.manifest_path(torn.checkpoint_id)
            text = torn.to_json()
            # What a store without atomic writes leaves: half a manifest, and a pointer to it.
            await checkpointer_context.write_raw(path, text[: len(text) // 2])
            await checkpointer_context.write_raw(
                store.latest_path(), str(torn.checkpoint_id).encode()
            )
            restarted = checkpointer_context.open()
            with pytest.raises(CheckpointCorrupted) as corrupted:
                await restarted.load_manifest(torn.checkpoint_id)
            assert corrupted.value.path == path
            skipped: list[CheckpointError] = []
            recovered = await load_latest_valid(restarted, on_skip=skipped.append)
            assert recovered is not None
            assert recovered.manifest == previous
            assert [
                error.path for error in recovered.skipped if isinstance(error, CheckpointStoreError)
            ] == [path]
            assert list(recovered.skipped) == skipped

        run(scenario())


class CheckpointerCorruptionSuite:
    """Damaged files are reported with their path and never loaded; recovery falls back."""

    async def _two_checkpoints(
        self, store: Checkpointer
    ) -> tuple[CheckpointManifest, CheckpointManifest, dict[str, str]]:
        first = await write_checkpoint(store, 1)
        second = await write_checkpoint(
            store, 2, states={("agg", 0): b"snapshot " * 100}, delta={("agg", 1): b"delta " * 100}
        )
        entries = {("delta" if e.is_delta else "snapshot"): e.path for _, e in second.partitions()}
        targets = {
            "manifest": store.manifest_path(second.checkpoint_id),
            "latest": store.latest_path(),
            **entries,
        }
        return first, second, targets

    @pytest.mark.parametrize("how", list(Corruption), ids=lambda c: c.value)
    @pytest.mark.parametrize("target", ["manifest", "snapshot", "delta"])
    def test_damaged_checkpoint_is_reported_and_skipped(
        self, checkpointer_context: CheckpointerContext, target: str, how: Corruption
    ) -> None:
        """A damaged manifest, snapshot or delta is reported by path and skipped."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            first, second, targets = await self._two_checkpoints(store)
            path = targets[target]
            await checkpointer_context.corrupt(path, how)
            restarted = checkpointer_context.open()
            expected = CheckpointNotFound if how is Corruption.DELETE else CheckpointCorrupted
            with pytest.raises(expected) as damaged:
                await load_checkpoint(restarted, second.checkpoint_id)
            assert damaged.value.path == path
            assert path in str(damaged.value)
            recovered = await load_latest_valid(restarted, on_skip=lambda _: None)
            assert recovered is not None
            assert recovered.manifest == first
            assert [e.path for e in recovered.skipped if isinstance(e, CheckpointStoreError)] == [
                path
            ]

        run(scenario())

    @pytest.mark.parametrize(
        "how", [Corruption.TRUNCATE, Corruption.FLIP_BYTE], ids=lambda c: c.value
    )
    def test_damaged_pointer_is_reported_and_recovery_uses_the_newest_valid(
        self, checkpointer_context: CheckpointerContext, how: Corruption
    ) -> None:
        """A damaged pointer is reported; recovery takes the newest valid checkpoint."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            _, second, targets = await self._two_checkpoints(store)
            await checkpointer_context.corrupt(targets["latest"], how)
            restarted = checkpointer_context.open()
            with pytest.raises(CheckpointCorrupted) as damaged:
                await restarted.read_latest()
            assert damaged.value.path == restarted.latest_path()
            recovered = await load_latest_valid(restarted, on_skip=lambda _: None)
            assert recovered is not None
            assert recovered.manifest == second
            # the next checkpoint repairs the pointer
            third = await write_checkpoint(restarted, 3)
            assert await restarted.read_latest() == third.checkpoint_id

        run(scenario())

    def test_edited_manifest_fails_its_checksum(
        self, checkpointer_context: CheckpointerContext
    ) -> None:
        """An edit that keeps the JSON valid is still caught by manifest_sha256."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            _, second, targets = await self._two_checkpoints(store)
            text = await checkpointer_context.read_raw(targets["manifest"])
            edited = text.replace(b'"epoch": 2', b'"epoch": 3')
            assert edited != text
            await checkpointer_context.write_raw(targets["manifest"], edited)
            with pytest.raises(CheckpointCorrupted, match="manifest_sha256"):
                await checkpointer_context.open().load_manifest(second.checkpoint_id)

        run(scenario())

    def test_every_checkpoint_damaged_is_an_error_not_a_fresh_start(
        self, checkpointer_context: CheckpointerContext
    ) -> None:
        """With every checkpoint damaged, recovery raises naming them all."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            first, second, targets = await self._two_checkpoints(store)
            await checkpointer_context.corrupt(targets["manifest"], Corruption.FLIP_BYTE)
            await checkpointer_context.corrupt(
                store.manifest_path(first.checkpoint_id), Corruption.TRUNCATE
            )
            with pytest.raises(CheckpointError, match="no valid checkpoint") as failure:
                await load_latest_valid(checkpointer_context.open(), on_skip=lambda _: None)
            assert str(second.checkpoint_id) in str(failure.value)
            assert str(first.checkpoint_id) in str(failure.value)

        run(scenario())


_WRITES_PER_WRITER = 8


async def _racing_writer(
    store: Checkpointer, name: str, saved: list[CheckpointManifest], latest_seen: list[CheckpointId]
) -> None:
    for epoch in range(1, _WRITES_PER_WRITER + 1):
        manifest = await write_checkpoint(
            store, epoch, states={("agg", 0): f"{name}-{epoch}".encode()}
        )
        saved.append(manifest)
        latest = await store.read_latest()
        assert latest is not None
        latest_seen.append(latest)


class CheckpointerConcurrencySuite:
    """Two writers on one location: no manifest overwritten, the pointer never backwards."""

    async def _check(self, store: Checkpointer, saved: Sequence[CheckpointManifest]) -> None:
        assert len({m.checkpoint_id for m in saved}) == len(saved)
        assert await store.list_checkpoints() == sorted(m.checkpoint_id for m in saved)
        for manifest in saved:
            recovered = await load_checkpoint(store, manifest.checkpoint_id)
            assert recovered.manifest == manifest
        assert await store.read_latest() == max(m.checkpoint_id for m in saved)

    def test_two_writers_in_one_event_loop(self, checkpointer_context: CheckpointerContext) -> None:
        """Two instances interleaved in one event loop lose nothing."""

        async def scenario() -> None:
            saved: list[CheckpointManifest] = []
            seen_a: list[CheckpointId] = []
            seen_b: list[CheckpointId] = []
            await asyncio.gather(
                _racing_writer(checkpointer_context.open(), "a", saved, seen_a),
                _racing_writer(checkpointer_context.open(), "b", saved, seen_b),
            )
            for seen in (seen_a, seen_b):
                assert seen == sorted(seen), "a writer saw the latest pointer move backwards"
            await self._check(checkpointer_context.open(), saved)

        run(scenario())

    def test_two_writers_in_two_threads(self, checkpointer_context: CheckpointerContext) -> None:
        """Two instances in two threads, each with its own loop, lose nothing."""
        if not checkpointer_context.supports_threads:
            skip("capability", "the context declares supports_threads = False")
        saved: list[CheckpointManifest] = []
        seen: dict[str, list[CheckpointId]] = {"a": [], "b": []}
        failures: list[BaseException] = []

        def writer(name: str) -> None:
            try:
                run(_racing_writer(checkpointer_context.open(), name, saved, seen[name]))
            except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
                failures.append(error)

        threads = [threading.Thread(target=writer, args=(name,)) for name in seen]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]
        for name, ids in seen.items():
            assert ids == sorted(ids), f"writer {name} saw the latest pointer move backwards"
        run(self._check(checkpointer_context.open(), saved))

    def test_racing_pointer_updates_end_at_the_newest(
        self, checkpointer_context: CheckpointerContext
    ) -> None:
        """Racing update_latest calls, in shuffled order, leave the newest id."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            instances = [checkpointer_context.open() for _ in range(4)]
            shuffle = random.Random(20260101).shuffle  # noqa: S311 - a fixed-seed shuffle
            first = CheckpointManifest.new(0)
            await store.save_manifest(first)
            await store.update_latest(first.checkpoint_id)  # so every racer updates, none creates
            for round_ in range(1, 6):
                manifests = [CheckpointManifest.new(round_) for _ in range(10)]
                for manifest in manifests:
                    await store.save_manifest(manifest)
                order = list(manifests)
                shuffle(order)
                moved = await asyncio.gather(
                    *(instances[i % 4].update_latest(m.checkpoint_id) for i, m in enumerate(order))
                )
                assert any(moved)
                assert await store.read_latest() == manifests[-1].checkpoint_id, (
                    f"round {round_}: the pointer is not at the newest checkpoint"
                )

        run(scenario())

    def test_racing_saves_of_one_id_keep_exactly_one(
        self, checkpointer_context: CheckpointerContext
    ) -> None:
        """Racing saves of different manifests under one id: one wins, others conflict."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            for _ in range(5):
                checkpoint_id = CheckpointId.new()
                rivals = [CheckpointManifest(checkpoint_id, epoch, 0) for epoch in (1, 2, 3)]
                results = await asyncio.gather(
                    *(checkpointer_context.open().save_manifest(m) for m in rivals),
                    return_exceptions=True,
                )
                winners = [m for m, r in zip(rivals, results, strict=True) if r is None]
                losers = [r for r in results if r is not None]
                assert len(winners) == 1, results
                assert all(isinstance(r, CheckpointConflict) for r in losers), losers
                assert await store.load_manifest(checkpoint_id) == winners[0]

        run(scenario())


class CheckpointerRetentionSuite:
    """Retention keeps the newest checkpoints, their dependencies and the latest one."""

    def test_keeps_the_newest(self, checkpointer_context: CheckpointerContext) -> None:
        """prune_checkpoints keeps the newest N with their artifacts, deletes the rest."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            written = await write_checkpoints(store, 5)
            ids = [m.checkpoint_id for m in written]
            result = await prune_checkpoints(store, keep=2)
            assert result.deleted_checkpoints == tuple(ids[:3])
            assert result.kept == tuple(ids[3:])
            assert await store.list_checkpoints() == ids[3:]
            assert await store.list_artifacts() == sorted(
                path for m in written[3:] for path in m.artifact_paths()
            )
            recovered = await load_latest_valid(store)
            assert recovered is not None
            assert recovered.manifest == written[-1]

        run(scenario())

    def test_never_deletes_the_latest(self, checkpointer_context: CheckpointerContext) -> None:
        """The checkpoint the pointer names survives retention even when older."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            latest = await write_checkpoint(store, 1)
            newer = [await write_checkpoint(store, e, stop_after="manifest") for e in (2, 3)]
            result = await prune_checkpoints(store, keep=1)
            assert result.deleted_checkpoints == (newer[0].checkpoint_id,)
            assert await store.list_checkpoints() == [latest.checkpoint_id, newer[1].checkpoint_id]
            recovered = await load_latest_valid(store)
            assert recovered is not None
            assert recovered.manifest == latest

        run(scenario())

    def test_keeps_what_a_kept_checkpoint_depends_on(
        self, checkpointer_context: CheckpointerContext
    ) -> None:
        """A parent whose artifacts a kept checkpoint lists is kept too."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            base = await write_checkpoint(store, 1)
            await write_checkpoint(store, 2)
            child = await write_checkpoint(
                store, 3, states={}, delta={("agg", 1): b"d"}, parent=base
            )
            result = await prune_checkpoints(store, keep=1)
            assert set(result.kept) == {base.checkpoint_id, child.checkpoint_id}
            recovered = await load_latest_valid(store)
            assert recovered is not None
            assert recovered.artifact("agg", 0) == b"state of epoch 1"

        run(scenario())

    def test_removes_orphaned_artifacts(self, checkpointer_context: CheckpointerContext) -> None:
        """Unreferenced artifacts go once old enough and not newer than latest."""

        async def scenario() -> None:
            store = checkpointer_context.open()
            await write_checkpoint(store, 1)
            crashed = await write_checkpoint(store, 2, stop_after="artifacts")
            orphans = sorted(crashed.artifact_paths())
            # Newer than the latest checkpoint: possibly still being written, so kept.
            kept_for_now = await prune_checkpoints(store, keep=5, orphan_grace_s=0)
            assert kept_for_now.deleted_artifacts == ()
            latest = await write_checkpoint(store, 2)
            # Young orphans are kept for the grace period.
            assert (await prune_checkpoints(store, keep=5)).deleted_artifacts == ()
            result = await prune_checkpoints(store, keep=5, orphan_grace_s=0)
            assert sorted(result.deleted_artifacts) == orphans
            assert result.deleted_checkpoints == ()
            assert not set(orphans) & set(await store.list_artifacts())
            assert latest.artifact_paths() <= set(await store.list_artifacts())

        run(scenario())

    @pytest.mark.parametrize("keep", [0, -1])
    def test_keep_must_be_positive(
        self, checkpointer_context: CheckpointerContext, keep: int
    ) -> None:
        """A ``keep`` below 1 is refused."""
        with pytest.raises(CheckpointError, match="at least 1"):
            run(prune_checkpoints(checkpointer_context.open(), keep=keep))


class CheckpointerSuite(
    CheckpointerRoundTripSuite,
    CheckpointerOrderingSuite,
    CheckpointerCrashSuite,
    CheckpointerCorruptionSuite,
    CheckpointerConcurrencySuite,
    CheckpointerRetentionSuite,
):
    """Every checkpoint-store suite: adopt this one unless a backend needs to leave a part out."""


__all__ = [
    "SINK",
    "UNSAFE_NAMES",
    "UNSAFE_PATHS",
    "CheckpointerConcurrencySuite",
    "CheckpointerContext",
    "CheckpointerCorruptionSuite",
    "CheckpointerCrashSuite",
    "CheckpointerOrderingSuite",
    "CheckpointerRetentionSuite",
    "CheckpointerRoundTripSuite",
    "CheckpointerSuite",
    "Corruption",
    "run",
    "write_checkpoint",
    "write_checkpoints",
]
