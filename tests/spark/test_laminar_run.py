"""`laminar run PIPELINE.toml` and `laminar demo`, as a user runs them: in a new process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from laminar_sdk.reference import MemorySink

PIPELINE = """
[source]
connector = "{source}"
rows = 60
partitions = 2

[transform]
sql = "SELECT * FROM source WHERE id % 2 = 0"

[sink]
connector = "memory"
path = "out"

[pipeline]
delivery = "exactly-once"
checkpoint_location = "state"
max_records_per_batch = 50
"""


def laminar(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "laminar_sdk", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.spark
def test_run_a_pipeline_file_with_a_transform_exactly_once(tmp_path: Path) -> None:
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(PIPELINE.format(source="generator"))
    first = laminar("run", str(pipeline))
    assert first.returncode == 0, first.stderr[-2000:]
    epochs = [line for line in first.stdout.splitlines() if line.strip().startswith("epoch ")]
    assert len(epochs) == 3, f"120 rows in epochs of 50 rows: {first.stdout}"
    assert "committed in" in epochs[0]
    assert sorted(MemorySink.committed_ids(tmp_path / "out")) == list(range(0, 120, 2))

    again = laminar("run", str(pipeline))
    assert again.returncode == 0, again.stderr[-2000:]
    assert sorted(MemorySink.committed_ids(tmp_path / "out")) == list(range(0, 120, 2))


@pytest.mark.spark
def test_run_with_an_unknown_connector_fails_before_data_moves(tmp_path: Path) -> None:
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(PIPELINE.format(source="genrator"))
    result = laminar("run", str(pipeline))
    assert result.returncode != 0
    assert "no source connector named 'genrator' is installed" in result.stderr
    assert not (tmp_path / "out").exists() or MemorySink.committed_ids(tmp_path / "out") == []


@pytest.mark.spark
@pytest.mark.slow
def test_the_quick_start_demo_survives_its_kill_exactly_once(tmp_path: Path) -> None:
    result = laminar("demo", "--workdir", str(tmp_path / "demo"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "laminar demo: killed (exit status" in result.stdout
    assert "exactly once: nothing lost, nothing doubled" in result.stdout
    table = result.stdout.split("expected rows")[1].splitlines()[1].split()
    assert table == ["100000", "100000", "100000", "0", "0"]
    assert "the conformance kit's quick profile on the 'files' sink" in result.stdout
    assert "every applicable check passed" in result.stdout
    assert not list((tmp_path / "demo").glob("spark-tmp-*")), "the killed run's files were left"
