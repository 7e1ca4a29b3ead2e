"""The driver's hand-off directory: which tasks may use it, and what a commit leaves there."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from laminar_sdk._spark.handoff import HandoffDirectory, default_root


def test_the_driver_makes_its_token_once_and_a_task_that_reads_it_may_hand_off(
    tmp_path: Path,
) -> None:
    driver = HandoffDirectory.of_driver(tmp_path / "handoff")

    assert driver is not None
    assert HandoffDirectory.of_driver(tmp_path / "handoff") == driver, "one token, kept"
    assert driver.reachable()
    assert [p.name for p in (tmp_path / "handoff").iterdir()] == ["driver-token"]


def test_a_task_that_reads_another_token_or_none_sends_messages(tmp_path: Path) -> None:
    driver = HandoffDirectory.of_driver(tmp_path / "handoff")
    assert driver is not None
    elsewhere = HandoffDirectory(str(tmp_path / "not-the-drivers"), driver.token)

    (tmp_path / "handoff" / "driver-token").write_text("another driver's")

    assert not driver.reachable()
    assert not elsewhere.reachable()


def test_a_driver_that_cannot_make_the_directory_hands_off_nothing_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "a-file").write_text("")

    assert HandoffDirectory.of_driver(tmp_path / "a-file" / "handoff") is None
    (warning,) = caplog.records
    assert warning.levelname == "WARNING"
    assert str(tmp_path / "a-file" / "handoff") in warning.getMessage()
    assert "Not a directory" in warning.getMessage()
    assert "point TMPDIR" in warning.getMessage()


def test_the_directory_is_the_users_alone_and_one_others_may_read_is_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert HandoffDirectory.of_driver(tmp_path / "handoff") is not None
    assert stat.S_IMODE((tmp_path / "handoff").stat().st_mode) == 0o700
    (tmp_path / "shared").mkdir(mode=0o755)
    (tmp_path / "shared").chmod(0o755)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)

    assert HandoffDirectory.of_driver(tmp_path / "shared") is None
    assert HandoffDirectory.of_driver(tmp_path / "link") is None, "a link may lead anywhere"
    assert list((tmp_path / "shared").iterdir()) == [], "no token written there"
    refusals = [record.getMessage() for record in caplog.records]
    assert len(refusals) == 2
    assert str(tmp_path / "shared") in refusals[0]
    assert "others may read it" in refusals[0]


def test_each_user_has_a_directory_of_their_own() -> None:
    assert default_root().name == f"laminar-spark-{os.getuid()}"


def test_a_commit_discards_its_micro_batch_and_older_ones_left_behind(tmp_path: Path) -> None:
    driver = HandoffDirectory.of_driver(tmp_path)
    assert driver is not None
    for batch_id, task in [(3, "0-0-a"), (3, "0-1-b"), (5, "1-0-c"), (6, "0-0-d")]:
        driver.task_file("q-1", batch_id, task).write_bytes(b"batches")
    driver.task_file("q-2", 1, "0-0-e").write_bytes(b"another query's")

    driver.discard("q-1", 5)

    assert [p.name for p in (tmp_path / "query-q-1").iterdir()] == ["batch-6"]
    assert (tmp_path / "query-q-2" / "batch-1" / "0-0-e.arrow").exists()
    driver.discard("q-1", 6)
    assert not (tmp_path / "query-q-1").exists(), "the query's directory goes when empty"


def test_a_query_id_cannot_name_a_path_outside_the_directory(tmp_path: Path) -> None:
    driver = HandoffDirectory.of_driver(tmp_path / "handoff")
    assert driver is not None

    path = driver.task_file("../../escape", 0, "0-0-a")

    assert path.resolve().is_relative_to((tmp_path / "handoff").resolve())
