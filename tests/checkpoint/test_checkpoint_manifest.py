"""Checkpoint ids and the manifest: values, builders, JSON."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_sdk import (
    MANIFEST_VERSION,
    CheckpointCorrupted,
    CheckpointError,
    CheckpointId,
    CheckpointManifest,
    PartitionSnapshotEntry,
    SinkEpochStatus,
    SourceCheckpoint,
    UnsupportedManifestVersion,
)
from laminar_sdk._checkpointing.ids import artifact_path, parse_artifact_path
from laminar_sdk._checkpointing.manifest import sha256_hex

SHA = sha256_hex(b"")


def entry(
    checkpoint_id: CheckpointId, operator: str, partition: int, size: int = 1
) -> PartitionSnapshotEntry:
    path = artifact_path(checkpoint_id, operator, partition, delta=False)
    return PartitionSnapshotEntry(partition, False, path, size, SHA)


def test_ids_are_uuid7_and_strictly_increasing() -> None:
    ids = [CheckpointId.new() for _ in range(5000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert [str(i) for i in ids] == sorted(str(i) for i in ids)
    assert all(i.value.version == 7 for i in ids)
    assert abs(ids[-1].timestamp_ms - time.time() * 1000) < 60_000


def test_id_text_round_trip() -> None:
    checkpoint_id = CheckpointId.new()
    assert CheckpointId.parse(str(checkpoint_id)) == checkpoint_id
    assert repr(checkpoint_id) == f"CheckpointId('{checkpoint_id}')"


UUID4 = "9f2b0c8e-1d3a-4c5e-8f7a-0b1c2d3e4f50"
"""A valid UUID of another version (a literal: test ids must be the same in every process)."""


@pytest.mark.parametrize(
    "text",
    ["", "..", "../../etc/passwd", "/", UUID4, "0" * 36, "not-an-id", "x\0y"],
)
def test_other_text_is_not_an_id(text: str) -> None:
    with pytest.raises(CheckpointError, match="is not a checkpoint id"):
        CheckpointId.parse(text)


def test_upper_case_is_not_canonical() -> None:
    with pytest.raises(CheckpointError):
        CheckpointId.parse(str(CheckpointId.new()).upper())


def test_artifact_paths_round_trip() -> None:
    checkpoint_id = CheckpointId.new()
    path = artifact_path(checkpoint_id, "join.left-1", 4294967295, delta=True)
    assert path == f"{checkpoint_id}/operators/join.left-1/partition-4294967295.delta"
    assert parse_artifact_path(path) == (checkpoint_id, "join.left-1", 4294967295, True)
    with pytest.raises(CheckpointError):
        parse_artifact_path(f"{checkpoint_id}/operators/op/partition-01.snap")


def _manifest(
    epoch: int,
    *,
    watermark: int | None = None,
    parent: bool = False,
    partitions: dict[str, list[int]],
    offsets: dict[str, dict[str, str]],
    sinks: dict[str, SinkEpochStatus],
    descriptors: list[list[str]] | None = None,
    query_id: str | None = None,
) -> CheckpointManifest:
    checkpoint_id = CheckpointId.new()
    # The first sinks get commit descriptors, as distributed-commit sinks do.
    by_sink = dict(zip(sorted(sinks), descriptors or [], strict=False))
    return CheckpointManifest(
        checkpoint_id,
        epoch,
        checkpoint_id.timestamp_ms,
        operators={
            op: tuple(entry(checkpoint_id, op, p, p % 100) for p in ps)
            for op, ps in partitions.items()
        },
        source_offsets={name: SourceCheckpoint(o, epoch) for name, o in offsets.items()},
        sink_statuses=sinks,
        parent_id=CheckpointId.new() if parent else None,
        watermark=watermark,
        sink_commit_descriptors=by_sink,
        query_id=query_id,
    )


manifests = st.builds(
    _manifest,
    epoch=st.integers(0, 2**63 - 1),
    watermark=st.none() | st.integers(-(2**63), 2**63 - 1),
    parent=st.booleans(),
    partitions=st.dictionaries(
        st.from_regex(r"[a-z_][a-z0-9_.\-]{0,20}", fullmatch=True),
        st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=4, unique=True),
        max_size=4,
    ),
    offsets=st.dictionaries(
        st.text(min_size=1, max_size=10),
        st.dictionaries(st.text(max_size=5), st.text(max_size=10), max_size=3),
        max_size=3,
    ),
    sinks=st.dictionaries(
        st.text(min_size=1, max_size=10), st.sampled_from(SinkEpochStatus), max_size=3
    ),
    descriptors=st.none() | st.lists(st.lists(st.text(max_size=30), max_size=3), max_size=3),
    query_id=st.none() | st.text(min_size=1, max_size=36),
)


@settings(max_examples=200)
@given(manifests)
def test_json_round_trip(manifest: CheckpointManifest) -> None:
    text = manifest.to_json()
    assert CheckpointManifest.from_json(text) == manifest
    assert CheckpointManifest.from_json(text).to_json() == text
    document = json.loads(text)
    assert document["version"] == MANIFEST_VERSION
    assert document["total_size_bytes"] == manifest.total_size_bytes


def test_json_holds_the_v2_fields() -> None:
    manifest = _manifest(
        7,
        watermark=5000,
        parent=True,
        partitions={"agg": [0, 1]},
        offsets={"kafka": {"0": "42"}},
        sinks={"out": SinkEpochStatus.PENDING},
    )
    document = json.loads(manifest.to_json())
    assert set(document) == {
        "version",
        "checkpoint_id",
        "epoch",
        "timestamp_ms",
        "operators",
        "source_offsets",
        "sink_statuses",
        "parent_id",
        "watermark",
        "total_size_bytes",
        "manifest_sha256",
    }
    assert document["operators"]["agg"]["partitions"][1] == {
        "partition_id": 1,
        "is_delta": False,
        "size_bytes": 1,
        "sha256": SHA,
        "path": f"{manifest.checkpoint_id}/operators/agg/partition-1.snap",
    }
    assert document["operators"]["agg"]["total_bytes"] == 1
    assert document["source_offsets"]["kafka"] == {
        "offsets": {"0": "42"},
        "epoch": 7,
        "metadata": {},
    }
    assert document["sink_statuses"] == {"out": "pending"}


def test_unknown_version_is_named() -> None:
    document = json.loads(CheckpointManifest.new(1).to_json())
    document["version"] = 99
    with pytest.raises(UnsupportedManifestVersion, match="format version 99") as failure:
        CheckpointManifest.from_json(json.dumps(document), path="x/manifest.json")
    assert failure.value.version == 99
    assert failure.value.path == "x/manifest.json"
    assert isinstance(failure.value, CheckpointCorrupted)


@pytest.mark.parametrize(
    "text",
    [b"", b"{", b"[]", b"null", b'{"version": 1}', b"\xff\xfe", b'{"version": true}'],
)
def test_malformed_text_is_corrupted(text: bytes) -> None:
    with pytest.raises(CheckpointCorrupted, match="manifest m.json"):
        CheckpointManifest.from_json(text, path="m.json")


def test_checksum_catches_edits_that_keep_the_json_valid() -> None:
    manifest = _manifest(
        3, partitions={"agg": [0]}, offsets={}, sinks={"out": SinkEpochStatus.PENDING}
    )
    edited = manifest.to_json().replace(b'"pending"', b'"committed"')
    with pytest.raises(CheckpointCorrupted, match="manifest_sha256"):
        CheckpointManifest.from_json(edited)


def test_manifest_is_immutable() -> None:
    manifest = _manifest(
        1, partitions={"agg": [0]}, offsets={}, sinks={"out": SinkEpochStatus.PENDING}
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        manifest.epoch = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        manifest.sink_statuses["out"] = SinkEpochStatus.COMMITTED  # type: ignore[index]
    assert hash(manifest) == hash(CheckpointManifest.from_json(manifest.to_json()))


def test_sinks_move_forward_only() -> None:
    pending = CheckpointManifest.new(1).with_sink_status("a", SinkEpochStatus.PENDING)
    committed = pending.with_sink_status("a", SinkEpochStatus.COMMITTED)
    assert pending.sink_statuses == {"a": SinkEpochStatus.PENDING}
    assert committed.sink_statuses == {"a": SinkEpochStatus.COMMITTED}
    assert committed.is_update_of(pending)
    assert pending.with_sink_status("a", SinkEpochStatus.FAILED).is_update_of(pending)
    assert not pending.is_update_of(committed)
    with pytest.raises(CheckpointError, match="cannot become pending"):
        committed.with_sink_status("a", SinkEpochStatus.PENDING)
    with pytest.raises(CheckpointError, match="cannot become committed"):
        pending.with_sink_status("a", SinkEpochStatus.FAILED).with_sink_status(
            "a", SinkEpochStatus.COMMITTED
        )


def test_an_update_changes_nothing_but_sinks() -> None:
    pending = CheckpointManifest.new(1).with_sink_status("a", SinkEpochStatus.PENDING)
    committed = pending.with_sink_status("a", SinkEpochStatus.COMMITTED)
    assert not dataclasses.replace(committed, epoch=2).is_update_of(pending)
    assert not committed.with_sink_status("b", SinkEpochStatus.PENDING).is_update_of(pending)
    assert not committed.with_source_offset("s", SourceCheckpoint()).is_update_of(pending)


def test_entries_are_checked() -> None:
    checkpoint_id = CheckpointId.new()
    path = artifact_path(checkpoint_id, "op", 1, delta=False)
    with pytest.raises(CheckpointError, match="not the snapshot of partition 2"):
        PartitionSnapshotEntry(2, False, path, 1, SHA)
    with pytest.raises(CheckpointError, match="not the delta of partition 1"):
        PartitionSnapshotEntry(1, True, path, 1, SHA)
    with pytest.raises(CheckpointError, match="64 lower-case hex"):
        PartitionSnapshotEntry(1, False, path, 1, SHA.upper())
    with pytest.raises(CheckpointError, match="not a checkpoint artifact path"):
        PartitionSnapshotEntry(1, False, "../../etc/partition-1.snap", 1, SHA)
    manifest = CheckpointManifest.new(1)
    with pytest.raises(CheckpointError, match="artifact of another operator"):
        manifest.with_partition("other", PartitionSnapshotEntry(1, False, path, 1, SHA))


def test_with_partition_replaces_the_same_partition() -> None:
    manifest = CheckpointManifest.new(1)
    first = entry(manifest.checkpoint_id, "op", 0, 5)
    second = entry(manifest.checkpoint_id, "op", 0, 7)
    updated = manifest.with_partition("op", first).with_partition("op", second)
    assert updated.operators == {"op": (second,)}
    assert updated.total_size_bytes == 7


def test_commit_descriptors_and_the_query_id_are_stored_only_when_set() -> None:
    plain = CheckpointManifest.new(4).with_sink_status("out", SinkEpochStatus.PENDING)
    # Without them, the text is what an SDK before them wrote (and reads back).
    assert "sink_commit_descriptors" not in json.loads(plain.to_json())
    assert "query_id" not in json.loads(plain.to_json())

    staged = CheckpointManifest.new(4, query_id="8d1c-q").with_sink_status(
        "out", SinkEpochStatus.PENDING
    )
    staged = staged.with_sink_commit_descriptors("out", ['{"task": "0-0-a1"}', "b"])
    document = json.loads(staged.to_json())
    assert document["sink_commit_descriptors"] == {"out": ['{"task": "0-0-a1"}', "b"]}
    assert document["query_id"] == "8d1c-q"
    loaded = CheckpointManifest.from_json(staged.to_json())
    assert loaded.sink_commit_descriptors == {"out": ('{"task": "0-0-a1"}', "b")}
    assert loaded.query_id == "8d1c-q"


def _signed(document: dict[str, object]) -> str:
    """``document`` with a valid manifest_sha256, as a store would hold it."""
    unsigned = {key: value for key, value in document.items() if key != "manifest_sha256"}
    canonical = json.dumps(unsigned, sort_keys=True, separators=(",", ":")).encode()
    return json.dumps({**unsigned, "manifest_sha256": sha256_hex(canonical)})


def test_commit_descriptors_belong_to_a_sink_of_the_checkpoint() -> None:
    with pytest.raises(CheckpointError, match="'out' has commit descriptors but no status"):
        CheckpointManifest.new(1).with_sink_commit_descriptors("out", ["a"])
    document = json.loads(
        CheckpointManifest.new(1).with_sink_status("out", SinkEpochStatus.PENDING).to_json()
    )
    for descriptors in ("not a list", [1, 2]):
        document["sink_commit_descriptors"] = {"out": descriptors}
        with pytest.raises(CheckpointCorrupted, match="must be a list of strings"):
            CheckpointManifest.from_json(_signed(document))
    document["sink_commit_descriptors"] = {"out": ["a"]}
    assert CheckpointManifest.from_json(_signed(document)).sink_commit_descriptors == {
        "out": ("a",)
    }


def test_a_committed_update_keeps_the_commit_descriptors() -> None:
    pending = (
        CheckpointManifest.new(1)
        .with_sink_status("out", SinkEpochStatus.PENDING)
        .with_sink_commit_descriptors("out", ["a", "b"])
    )
    committed = pending.with_sink_status("out", SinkEpochStatus.COMMITTED)
    assert committed.sink_commit_descriptors == {"out": ("a", "b")}
    assert committed.is_update_of(pending)
    assert not committed.with_sink_commit_descriptors("out", ["a"]).is_update_of(pending)
    assert not dataclasses.replace(committed, query_id="other").is_update_of(pending)
