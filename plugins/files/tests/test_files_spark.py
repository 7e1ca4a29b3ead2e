"""The files source and sink in a real Spark pipeline (``laminar run``, ``local[2]``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from files_testing import visible_ids, write_source_file

PIPELINE = """
[source]
connector = "files"
path = "in"
batch_size = 7

[sink]
connector = "files"
path = "out"
rows_per_file = 10

[pipeline]
delivery = "exactly-once"
checkpoint_location = "state"
max_records_per_batch = 25
"""

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(
        importlib.util.find_spec("pyspark") is None, reason="needs laminar-sdk[spark]"
    ),
]


def laminar_run(pipeline: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "laminar_sdk", "run", str(pipeline)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.full  # nightly: CI runs the files sink on Spark in the quick-start demo's test
def test_files_flow_from_a_directory_to_published_epochs_exactly_once(tmp_path: Path) -> None:
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(PIPELINE)
    for number in range(4):
        write_source_file(
            tmp_path / "in" / f"{number:04d}.parquet",
            range(number * 15, number * 15 + 15),
            "parquet",
        )
    first = laminar_run(pipeline)
    assert first.returncode == 0, first.stderr[-3000:]
    assert visible_ids(tmp_path / "out") == list(range(60))
    epochs = sorted(path.name for path in (tmp_path / "out").glob("epoch=*"))
    assert len(epochs) >= 3, f"60 rows in micro-batches of at most 25: {epochs}"
    written = [path.name for path in (tmp_path / "out").glob("epoch=*/*.parquet")]
    assert written, "no data file published"
    assert all(name.startswith("task-") for name in written), (
        f"Spark's write tasks stage the files themselves (distributed commit): {written}"
    )

    write_source_file(tmp_path / "in" / "0004.parquet", range(60, 70), "parquet")
    again = laminar_run(pipeline)
    assert again.returncode == 0, again.stderr[-3000:]
    assert visible_ids(tmp_path / "out") == list(range(70)), "resumed after the last file read"
