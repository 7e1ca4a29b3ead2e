"""The ``file`` store: the conformance suite, plus what only a local directory can show."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from laminar_conformance.checkpointer import (
    CheckpointerContext,
    CheckpointerSuite,
    run,
    write_checkpoint,
)

from laminar_sdk import (
    CheckpointError,
    CheckpointId,
    FileCheckpointer,
    load_latest_valid,
    open_checkpointer,
    prune_checkpoints,
    verify_checkpoint,
)


class FileContext(CheckpointerContext):
    def __init__(self, root: Path) -> None:
        self.root = root

    def open(self) -> FileCheckpointer:
        return FileCheckpointer(str(self.root))

    async def read_raw(self, path: str) -> bytes:
        return (self.root / path).read_bytes()

    async def write_raw(self, path: str, data: bytes) -> None:
        (self.root / path).parent.mkdir(parents=True, exist_ok=True)
        (self.root / path).write_bytes(data)

    async def delete_raw(self, path: str) -> None:
        (self.root / path).unlink()


class TestFileCheckpointer(CheckpointerSuite):
    @pytest.fixture
    def checkpointer_context(self, tmp_path: Path) -> FileContext:
        return FileContext(tmp_path / "checkpoints")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "checkpoints"


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux /proc to name fds")
def test_every_file_is_fsynced_before_its_rename_and_its_directory_after(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", _fd_path(fd)))
        real_fsync(fd)

    def replace(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        events.append(("rename", f"{source} -> {target}"))
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    store = FileCheckpointer(str(root))
    manifest = run(write_checkpoint(store, 1))
    renames = [i for i, (kind, _) in enumerate(events) if kind == "rename"]
    # artifact, manifest (pending), pointer, manifest (committed)
    assert len(renames) == 4
    for index in renames:
        source, target = events[index][1].split(" -> ")
        assert events[index - 1] == ("fsync", source), "file content not durable before rename"
        assert events[index + 1] == ("fsync", str(Path(target).parent)), "rename not durable"
    targets = [Path(events[i][1].split(" -> ")[1]) for i in renames]
    manifest_file = root / str(manifest.checkpoint_id) / "manifest.json"
    assert targets[1] == manifest_file
    assert targets[2] == root / "_latest", "the pointer moved before the manifest was durable"
    # New directories are made durable in their parents before anything is written in them.
    checkpoint_dir = root / str(manifest.checkpoint_id)
    first_rename = renames[0]
    fsynced_before = [path for kind, path in events[:first_rename] if kind == "fsync"]
    for directory in (root.parent, root, checkpoint_dir, checkpoint_dir / "operators"):
        assert str(directory) in fsynced_before


def test_failed_rename_leaves_no_manifest_and_no_temporary_file(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileCheckpointer(str(root))
    previous = run(write_checkpoint(store, 1))
    real_replace = os.replace

    def failing_replace(source: str, target: str) -> None:
        if str(target).endswith("manifest.json"):
            raise OSError(28, "No space left on device")
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(CheckpointError, match="No space left on device"):
        run(write_checkpoint(store, 2))
    monkeypatch.undo()
    assert run(store.list_checkpoints()) == [previous.checkpoint_id]
    assert run(store.read_latest()) == previous.checkpoint_id
    assert not list(root.rglob("*.tmp"))


def test_leftover_temporary_files_are_ignored_and_pruned(root: Path) -> None:
    store = FileCheckpointer(str(root))
    first = run(write_checkpoint(store, 1))
    # What a crash between write and rename leaves: a hidden temporary file.
    leftover = root / str(first.checkpoint_id) / ".manifest.json.0123abcd.tmp"
    leftover.write_bytes(b'{"version": 1, "trunc')
    second = run(write_checkpoint(store, 2))
    assert run(store.list_checkpoints()) == [first.checkpoint_id, second.checkpoint_id]
    assert not run(verify_checkpoint(store, first.checkpoint_id))
    result = run(prune_checkpoints(store, keep=5, orphan_grace_s=0))
    assert result.deleted_artifacts == (f"{first.checkpoint_id}/.manifest.json.0123abcd.tmp",)
    assert not leftover.exists()


def test_deleting_a_checkpoint_removes_its_directories(root: Path) -> None:
    store = FileCheckpointer(str(root))
    first, second = (run(write_checkpoint(store, epoch)) for epoch in (1, 2))
    run(store.delete_checkpoint(first.checkpoint_id))
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [".lock", "_latest", str(second.checkpoint_id)]
    )


def test_torn_manifest_on_disk_is_reported_by_path(root: Path) -> None:
    store = FileCheckpointer(str(root))
    previous = run(write_checkpoint(store, 1))
    torn = run(write_checkpoint(store, 2))
    manifest_file = root / str(torn.checkpoint_id) / "manifest.json"
    manifest_file.write_bytes(manifest_file.read_bytes()[:100])
    problems = run(verify_checkpoint(store, torn.checkpoint_id))
    assert len(problems) == 1
    assert "not valid JSON" in str(problems[0])
    assert f"{torn.checkpoint_id}/manifest.json" in str(problems[0])
    recovered = run(load_latest_valid(store, on_skip=lambda _: None))
    assert recovered is not None
    assert recovered.manifest == previous


def test_recovering_from_a_whole_latest_checkpoint_does_not_list_the_store(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Spark bridge recovers once per micro-batch and nothing prunes the manifests: a
    # listing would grow with every micro-batch a query ever ran.
    store = FileCheckpointer(str(root))
    for epoch in range(3):
        latest = run(write_checkpoint(store, epoch))
    listed = []
    real_list = store.list_checkpoints

    async def listing() -> list[CheckpointId]:
        listed.append(True)
        return await real_list()

    monkeypatch.setattr(store, "list_checkpoints", listing)
    recovered = run(load_latest_valid(store))
    assert recovered is not None
    assert recovered.manifest == latest
    assert not listed

    manifest_file = root / str(latest.checkpoint_id) / "manifest.json"
    manifest_file.write_bytes(manifest_file.read_bytes()[:100])
    recovered = run(load_latest_valid(store, on_skip=lambda _: None))
    assert recovered is not None
    assert recovered.manifest.epoch == 1, "a torn latest one is walked back from, listing"
    assert listed


@pytest.mark.parametrize("operator", ["..", "../../outside", "/tmp/abs", "a/../../b", "x\0y"])
def test_nothing_is_written_outside_the_root(tmp_path: Path, operator: str) -> None:
    root = tmp_path / "inside" / "checkpoints"
    store = FileCheckpointer(str(root))
    with pytest.raises(CheckpointError):
        run(store.save_snapshot(CheckpointId.new(), operator, 0, b"escape"))
    assert sorted(p.name for p in tmp_path.rglob("*")) == []


def test_locations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert FileCheckpointer("relative").root == tmp_path / "relative"
    assert FileCheckpointer(f"file://{tmp_path}/x").root == tmp_path / "x"
    opened = open_checkpointer(f"file://{tmp_path}/x")
    assert isinstance(opened, FileCheckpointer)
    assert opened.root == tmp_path / "x"
    assert isinstance(open_checkpointer(str(tmp_path / "y")), FileCheckpointer)
    with pytest.raises(CheckpointError, match="not a directory path"):
        FileCheckpointer("file://")
    with pytest.raises(CheckpointError, match="takes no options"):
        FileCheckpointer(str(tmp_path), {"fsync": "false"})


def test_reading_does_not_create_the_directory(root: Path) -> None:
    store = FileCheckpointer(str(root))
    assert run(store.list_checkpoints()) == []
    assert run(store.read_latest()) is None
    assert not root.exists()


_WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from laminar_conformance.checkpointer import write_checkpoint
    from laminar_sdk import FileCheckpointer

    async def main():
        store = FileCheckpointer(sys.argv[1])
        for epoch in range(1, 100_000):
            await write_checkpoint(store, epoch, states={("agg", 0): bytes([epoch % 251]) * 65536})
            print(epoch, flush=True)

    asyncio.run(main())
    """
)


@pytest.mark.slow
def test_killed_writer_leaves_a_recoverable_store(root: Path) -> None:
    """SIGKILL a writer mid-stream: every stored manifest is whole, recovery gets the latest."""
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(root)], stdout=subprocess.PIPE, text=True
    )
    assert writer.stdout is not None
    try:
        for _ in range(20):  # let it complete some checkpoints first
            assert writer.stdout.readline()
        time.sleep(0.05)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        writer.stdout.close()
    store = FileCheckpointer(str(root))
    checkpoints = run(store.list_checkpoints())
    assert len(checkpoints) >= 20
    for checkpoint_id in checkpoints:
        assert run(verify_checkpoint(store, checkpoint_id)) == []
    recovered = run(load_latest_valid(store))
    assert recovered is not None
    assert recovered.manifest.checkpoint_id == run(store.read_latest())
    epoch = recovered.manifest.epoch
    assert recovered.artifact("agg", 0) == bytes([epoch % 251]) * 65536
