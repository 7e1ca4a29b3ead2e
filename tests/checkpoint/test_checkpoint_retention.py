"""Retention beyond the conformance suite: unreadable manifests and pointers."""

from __future__ import annotations

from pathlib import Path

import pytest
from laminar_conformance.checkpointer import run, write_checkpoint, write_checkpoints

from laminar_sdk import CheckpointCorrupted, FileCheckpointer, prune_checkpoints


@pytest.fixture
def store(tmp_path: Path) -> FileCheckpointer:
    return FileCheckpointer(str(tmp_path / "checkpoints"))


def _tear(store: FileCheckpointer, path: str) -> None:
    file = store.root / path
    file.write_bytes(file.read_bytes()[:10])


def test_unreadable_manifests_do_not_count_and_old_ones_go(store: FileCheckpointer) -> None:
    written = run(write_checkpoints(store, 5))
    ids = [m.checkpoint_id for m in written]
    _tear(store, store.manifest_path(ids[0]))  # old and unreadable: deleted
    _tear(store, store.manifest_path(ids[3]))  # recent and unreadable: kept for inspection
    result = run(prune_checkpoints(store, keep=2, orphan_grace_s=0))
    # ids[3] does not count towards keep=2, so ids[2] and ids[4] are the two kept.
    assert result.kept == (ids[2], ids[3], ids[4])
    assert result.deleted_checkpoints == (ids[0], ids[1])
    # the unreadable checkpoint's artifacts are not treated as orphans
    assert result.deleted_artifacts == ()
    assert written[3].artifact_paths() <= set(run(store.list_artifacts()))


def test_an_unreadable_pointer_stops_retention(store: FileCheckpointer) -> None:
    run(write_checkpoints(store, 3))
    _tear(store, store.latest_path())
    with pytest.raises(CheckpointCorrupted, match="latest pointer"):
        run(prune_checkpoints(store, keep=1))
    assert len(run(store.list_checkpoints())) == 3
    # the next checkpoint rewrites the pointer, and retention works again
    newest = run(write_checkpoint(store, 4))
    assert run(prune_checkpoints(store, keep=1)).kept == (newest.checkpoint_id,)


def test_nothing_completed_means_no_orphans_are_pruned(store: FileCheckpointer) -> None:
    crashed = run(write_checkpoint(store, 1, stop_after="artifacts"))
    result = run(prune_checkpoints(store, keep=1, orphan_grace_s=0))
    assert result.deleted_artifacts == ()
    assert sorted(crashed.artifact_paths()) == run(store.list_artifacts())
