"""An executor's Python worker killed mid-write: Spark retries the task, the epoch commits once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from spark_pipelines import expected_ids

from laminar_sdk.faults import KILL_WRITER_VARIABLE
from laminar_sdk.reference import MemorySink

ROWS = 60


@pytest.mark.spark
@pytest.mark.full  # nightly: a Spark retry of a killed task (CI kills whole pipelines)
def test_a_write_worker_killed_mid_write_is_retried_and_commits_once(tmp_path: Path) -> None:
    marker = tmp_path / "writer-killed"
    result = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("worker_kill_child.py")),
            str(tmp_path),
            str(ROWS),
        ],
        env={**os.environ, KILL_WRITER_VARIABLE: str(marker)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert marker.exists(), "no write task was killed: the test proves nothing"
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Python worker exited unexpectedly" in result.stderr or "crashed" in result.stderr
    assert sorted(MemorySink.committed_ids(tmp_path / "sink")) == expected_ids(ROWS)
