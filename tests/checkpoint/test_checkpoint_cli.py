"""``laminar checkpoints list|show|verify|quarantine|mark-committed``."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pyarrow as pa
import pytest
from laminar_conformance.checkpointer import run, write_checkpoint
from laminar_conformance.services import S3Endpoint

from laminar_sdk import CheckpointManifest, FileCheckpointer, open_checkpointer
from laminar_sdk._cli.main import main
from laminar_sdk._spark.read_log import ReadLog


@pytest.fixture
def store(tmp_path: Path) -> FileCheckpointer:
    return FileCheckpointer(str(tmp_path / "checkpoints"))


@pytest.fixture
def written(store: FileCheckpointer) -> list[CheckpointManifest]:
    return [
        run(write_checkpoint(store, 1)),
        run(write_checkpoint(store, 2, delta={("agg", 1): b"delta"})),
        run(write_checkpoint(store, 3, stop_after="manifest")),
    ]


def test_list(
    store: FileCheckpointer, written: list[CheckpointManifest], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["checkpoints", "list", store.location]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"3 checkpoint(s) at {store.location}, newest first:"
    ids = [str(m.checkpoint_id) for m in written]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert [line.split()[0] for line in lines[2:]] == ids[::-1]
    assert rows[ids[1]][-1] == "latest"
    assert rows[ids[1]][1] == "2"
    assert "sink=committed" in rows[ids[1]]
    assert "sink=pending" in rows[ids[2]]
    assert rows[ids[2]][-1] != "latest"


def test_list_empty_location(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoints", "list", str(tmp_path / "nothing")]) == 0
    assert capsys.readouterr().out == f"no checkpoints at {tmp_path / 'nothing'}\n"
    assert not (tmp_path / "nothing").exists()


def test_show_defaults_to_the_latest(
    store: FileCheckpointer, written: list[CheckpointManifest], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["checkpoints", "show", f"file://{store.location}"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"checkpoint {written[1].checkpoint_id} at {store.location}\n")
    assert "  epoch: 2\n" in out
    assert "  sinks: sink=committed\n" in out
    assert 'source: {"epoch":2,"metadata":{},"offsets":{"0":"20"}}' in out
    assert f"{written[1].checkpoint_id}/operators/agg/partition-1.delta" in out


def test_show_one_as_json(
    store: FileCheckpointer, written: list[CheckpointManifest], capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint_id = str(written[0].checkpoint_id)
    assert main(["checkpoints", "show", store.location, checkpoint_id, "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["checkpoint_id"] == checkpoint_id
    assert CheckpointManifest.from_json(out) == written[0]


def test_show_errors(
    store: FileCheckpointer, written: list[CheckpointManifest], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["checkpoints", "show", store.location, "../etc"]) == 2
    assert "is not a checkpoint id" in capsys.readouterr().err
    assert main(["checkpoints", "show", str(Path(store.location).parent / "empty")]) == 2
    assert "no latest checkpoint" in capsys.readouterr().err


def test_verify_passes_a_good_store(
    store: FileCheckpointer, written: list[CheckpointManifest], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["checkpoints", "verify", store.location]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"verifying 3 checkpoint(s) at {store.location}"
    assert out[1:4] == [
        f"[1/3] {written[0].checkpoint_id} ok",
        f"[2/3] {written[1].checkpoint_id} ok",
        f"[3/3] {written[2].checkpoint_id} ok (not completed: newer than the latest pointer)",
    ]
    assert out[-2] == f"latest pointer: {written[1].checkpoint_id}"
    assert out[-1] == "all 3 checkpoint(s) valid"


@pytest.mark.parametrize("target", ["manifest", "artifact", "latest"])
def test_verify_names_the_bad_file(
    store: FileCheckpointer,
    written: list[CheckpointManifest],
    capsys: pytest.CaptureFixture[str],
    target: str,
) -> None:
    bad = written[1]
    path = {
        "manifest": store.manifest_path(bad.checkpoint_id),
        "artifact": sorted(bad.artifact_paths())[0],
        "latest": store.latest_path(),
    }[target]
    file = store.root / path
    file.write_bytes(file.read_bytes()[:-3])
    assert main(["checkpoints", "verify", store.location]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[-3:-1] == [f"FAILED: 1 bad file(s) at {store.location}:", f"  {path}"]
    if target != "latest":
        assert f"[2/3] {bad.checkpoint_id} BAD (1 bad file(s))" in out


def test_verify_reports_a_pointer_to_nowhere(
    store: FileCheckpointer, written: list[CheckpointManifest], capsys: pytest.CaptureFixture[str]
) -> None:
    run(store.delete_checkpoint(written[1].checkpoint_id))
    assert main(["checkpoints", "verify", store.location]) == 1
    assert f"names {written[1].checkpoint_id}, which has no manifest" in capsys.readouterr().out


def test_a_deleted_manifest_between_two_is_reported_by_list_and_verify(
    store: FileCheckpointer, capsys: pytest.CaptureFixture[str]
) -> None:
    written = [run(write_checkpoint(store, epoch)) for epoch in range(1, 6)]
    (store.root / store.manifest_path(written[2].checkpoint_id)).unlink()  # its directory stays
    gap = (
        f"no checkpoint of epoch 3, between {written[1].checkpoint_id} (epoch 2) and "
        f"{written[3].checkpoint_id} (epoch 4): deleted or lost"
    )
    assert main(["checkpoints", "list", store.location]) == 0
    assert f"warning: {gap}" in capsys.readouterr().out
    assert main(["checkpoints", "verify", store.location]) == 1
    out = capsys.readouterr().out
    assert f"missing: {gap}" in out
    assert out.splitlines()[-1] == f"FAILED: 1 gap(s) in the checkpoints at {store.location}"


def test_a_marked_epoch_jumps_without_a_gap(
    store: FileCheckpointer, capsys: pytest.CaptureFixture[str]
) -> None:
    run(write_checkpoint(store, 1))
    assert main(["checkpoints", "mark-committed", store.location, "--epoch", "7"]) == 0
    assert main(["checkpoints", "verify", store.location]) == 0
    assert "missing" not in capsys.readouterr().out


def test_unknown_store_lists_the_installed_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["checkpoints", "list", str(tmp_path), "--store", "nope"]) == 2
    assert "installed: file, memory, object" in capsys.readouterr().err


def test_option_syntax(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["checkpoints", "list", str(tmp_path), "-o", "hunter2"])
    err = capsys.readouterr().err
    assert "expected KEY=VALUE" in err
    assert "hunter2" not in err


def test_object_store_with_options(
    s3_endpoint: S3Endpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    location = s3_endpoint.location("cli")
    options = s3_endpoint.checkpointer_options()
    manifest = run(write_checkpoint(open_checkpointer(location, options=options), 1))
    flags = [arg for key, value in options.items() for arg in ("-o", f"{key}={value}")]
    assert main(["checkpoints", "verify", location, *flags]) == 0
    out = capsys.readouterr().out
    assert f"[1/1] {manifest.checkpoint_id} ok" in out
    assert s3_endpoint.secret_access_key not in out


def test_quarantine_sets_a_bad_checkpoint_aside_and_moves_the_pointer_back(
    store: FileCheckpointer, written: list[CheckpointManifest], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = written[1]
    manifest = store.root / store.manifest_path(bad.checkpoint_id)
    manifest.write_bytes(manifest.read_bytes()[:-3])
    stored = sorted(
        path.relative_to(store.root).as_posix()
        for path in (store.root / str(bad.checkpoint_id)).rglob("*")
        if path.is_file()
    )

    assert main(["checkpoints", "quarantine", store.location, str(bad.checkpoint_id)]) == 0

    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"set checkpoint {bad.checkpoint_id} aside: {len(stored)} file(s) moved to"
    assert out[1:-1] == [f"  quarantine/{path}" for path in stored]
    assert out[-1] == f"latest checkpoint at {store.location}: {written[0].checkpoint_id}"
    assert not (store.root / str(bad.checkpoint_id)).exists()
    assert (store.root / "quarantine" / store.manifest_path(bad.checkpoint_id)).exists()
    assert main(["checkpoints", "verify", store.location]) == 0, "nothing bad is left"
    assert run(store.read_latest()) == written[0].checkpoint_id


def test_quarantine_of_an_unknown_checkpoint_is_an_error(
    store: FileCheckpointer, written: list[CheckpointManifest], capsys: pytest.CaptureFixture[str]
) -> None:
    unknown = "01a21313-90ed-7000-bd0a-8d77107dfe3b"
    assert main(["checkpoints", "quarantine", store.location, unknown]) == 2
    assert f"nothing is stored for checkpoint {unknown}" in capsys.readouterr().err


def test_quarantine_on_an_object_store(s3_endpoint: S3Endpoint) -> None:
    location = s3_endpoint.location("quarantine")
    options = s3_endpoint.checkpointer_options()
    object_store = open_checkpointer(location, options=options)
    first = run(write_checkpoint(object_store, 1))
    second = run(write_checkpoint(object_store, 2))
    flags = [arg for key, value in options.items() for arg in ("-o", f"{key}={value}")]

    assert main(["checkpoints", "quarantine", location, str(second.checkpoint_id), *flags]) == 0

    assert run(object_store.list_checkpoints()) == [first.checkpoint_id]
    assert run(object_store.read_latest()) == first.checkpoint_id


def test_mark_committed_records_the_epoch_for_the_next_run(
    store: FileCheckpointer, written: list[CheckpointManifest], capsys: pytest.CaptureFixture[str]
) -> None:
    arguments = ["checkpoints", "mark-committed", store.location, "--epoch", "7"]
    assert main([*arguments, "--query-id", "q-9"]) == 0

    latest = run(store.read_latest())
    assert capsys.readouterr().out == (
        f"checkpoint {latest} at {store.location} records epochs up to 7 as committed; "
        "the next run resumes with epoch 8\n"
    )
    marked = run(store.load_manifest(latest))
    assert (marked.epoch, marked.query_id, dict(marked.sink_statuses)) == (7, "q-9", {})
    assert main([*arguments]) == 2
    assert "already records epoch 7" in capsys.readouterr().err


def _logged_micro_batches(spark: Path, committed: int) -> list[str]:
    """A polled source's read log under ``spark/laminar``, two micro-batches, as Spark leaves it.

    Spark's offset log names each micro-batch's entry (``offsets/<N>``: a version line, a
    metadata line, the source's end offset); ``commits/<N>`` marks micro-batch ``committed``.
    Returns the path of each micro-batch's slice, relative to the read log.
    """
    log = ReadLog(open_checkpointer(str(spark / "laminar" / "read-log")), "queue")
    paths = []
    for number, first in enumerate((0, 10)):
        ids = pa.array(range(first, first + 10), pa.int64())
        batch = pa.record_batch([ids], names=["id"])
        entry = run(log.append([batch], batch.schema))
        offset = {"offsets": {"p0": str(first + 10)}, "read_log": entry.to_dict()}
        (spark / "offsets").mkdir(parents=True, exist_ok=True)
        (spark / "offsets" / str(number)).write_text(
            f'v1\n{{"batchWatermarkMs":0}}\n{json.dumps(offset)}\n'
        )
        paths.append(entry.slices[0].path)
    (spark / "commits").mkdir()
    (spark / "commits" / str(committed)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    return paths


@pytest.mark.parametrize("damaged", [0, 1], ids=["committed", "still-needed"])
def test_verify_checks_the_read_log_against_spark_s_offset_log(tmp_path, capsys, damaged):
    spark = tmp_path / "checkpoint"
    slices = _logged_micro_batches(spark, committed=0)
    stored = spark / "laminar" / "read-log" / slices[damaged]
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit: only the SHA-256 tells
    stored.write_bytes(bytes(data))
    laminar = str(spark / "laminar")

    status = main(["checkpoints", "verify", laminar])

    out = capsys.readouterr().out
    assert "2 slice(s) checked against the SHA-256s in Spark's offset log" in out, out
    if damaged == 0:
        assert status == 0, out
        assert f"{slices[0]} (micro-batch 0) fails" in out
        assert "no longer needed, Spark committed it" in out
    else:
        assert status == 1, out
        assert f"BAD {slices[1]} (micro-batch 1) fails the SHA-256 check" in out
        assert "FAILED: 1 read-log entry with damaged slices" in out
        # The way back it gives: the entry set aside (the next run reads it from the source).
        (command,) = re.findall(r"`laminar (checkpoints quarantine [^`]+)`", out)
        assert main(shlex.split(command)) == 0
        assert "set read-log entry" in capsys.readouterr().out
        assert main(["checkpoints", "verify", laminar]) == 0


@pytest.mark.parametrize(
    "command", [["verify"], ["quarantine", "01890a5d-ac96-774b-bcce-b302099a8057"]]
)
def test_a_read_log_is_not_taken_for_checkpoints(tmp_path, capsys, command):
    spark = tmp_path / "checkpoint"
    _logged_micro_batches(spark, committed=0)
    read_log = str(spark / "laminar" / "read-log")
    assert main(["checkpoints", command[0], read_log, *command[1:]]) == 2
    err = capsys.readouterr().err
    assert "is a polled source's read log, whose entries are not checkpoints" in err
    assert f"`laminar checkpoints verify {spark / 'laminar'}`" in err
