"""Processes SIGKILLed while writing or committing through the files sink recover exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from files_testing import visible_ids

CHILD = Path(__file__).with_name("files_crash_child.py")
EPOCHS = 4
IDS_PER_EPOCH = 3


def child(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHILD), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=CHILD.parent,
    )


def killed(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == -signal.SIGKILL, (
        f"the child was meant to die at its kill point; it exited {result.returncode}: "
        f"{result.stderr[-2000:]}"
    )


def succeeded(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


@pytest.mark.slow
@pytest.mark.parametrize(
    "kill",
    [
        "step:write:1",
        "step:manifest:1",
        "step:commit:1",
        "move:1",
        "rename-before:1",
        "rename-after:1",
        "step:committed-manifest:1",
        "step:done:1",
    ],
)
def test_a_pipeline_killed_at_any_point_of_an_epoch_resumes_exactly_once(tmp_path, kill):
    killed(child("pipeline", str(tmp_path), str(EPOCHS), kill))
    before = Counter(visible_ids(tmp_path / "out"))
    assert all(count == 1 for count in before.values()), f"duplicates after the kill: {before}"
    assert set(before) <= set(range(2 * IDS_PER_EPOCH)), "an epoch after 1 was published"
    succeeded(child("pipeline", str(tmp_path), str(EPOCHS)))
    assert visible_ids(tmp_path / "out") == list(range(EPOCHS * IDS_PER_EPOCH))
    assert os.listdir(tmp_path / "out" / "_staging") == [], "every epoch was published"


@pytest.mark.slow
@pytest.mark.parametrize("kill", ["move:4", "rename-before:4", "rename-after:4"])
def test_a_distributed_commit_killed_midway_is_finished_exactly_once(tmp_path, kill):
    # Each write task stages in a process of its own; one dies while writing.
    killed(child("stage", str(tmp_path), "4", "0-attempt-0", "1,2,3", "2"))
    descriptors = [
        succeeded(child("stage", str(tmp_path), "4", "0-attempt-1", "1,2,3")),
        succeeded(child("stage", str(tmp_path), "4", "1-attempt-0", "4,5")),
    ]
    staging = tmp_path / "out" / "_staging" / "epoch-4"
    assert any(name.startswith("task-0-attempt-0-") for name in os.listdir(staging))
    recorded = tmp_path / "descriptors.json"  # what the runtime keeps in the epoch's manifest
    recorded.write_text(json.dumps(descriptors))

    killed(child("commit", str(tmp_path), "4", str(recorded), kill))
    assert visible_ids(tmp_path / "out") in ([], [1, 2, 3, 4, 5]), "never part of the epoch"
    succeeded(child("commit", str(tmp_path), "4", str(recorded)))
    assert visible_ids(tmp_path / "out") == [1, 2, 3, 4, 5]
    published = tmp_path / "out" / "epoch=00000000000000000004"
    named = sorted(name for descriptor in descriptors for name in json.loads(descriptor)["files"])
    assert sorted(name for name in os.listdir(published) if not name.startswith("_")) == named
    assert os.listdir(tmp_path / "out" / "_staging") == [], "the failed attempt's file is deleted"
