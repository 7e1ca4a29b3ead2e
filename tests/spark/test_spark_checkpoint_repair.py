"""A damaged laminar checkpoint location that nothing makes up for: the error, then the repair.

Generator -> memory, exactly-once. The pipeline is killed after it committed micro-batch 0 and
before Spark's commit log recorded it, then the manifest of epoch 0 is damaged: Spark re-runs
micro-batch 0, whose commit log proves nothing yet, so the restart stops with an error naming
the damaged file and the exact ``laminar checkpoints`` command to run. Running that command
from the message, then restarting, delivers every id exactly once.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from laminar_conformance.checkpointer import Corruption, damage_file
from laminar_conformance.spark import run_in_child
from spark_pipelines import exactly_once_pipeline, expected_ids

from laminar_sdk.reference import MemorySink

# The repair command itself is tested without Spark (tests/checkpoint/test_checkpoint_cli.py).
pytestmark = [pytest.mark.spark, pytest.mark.full]

ROWS = 30
COMMAND = re.compile(r"`(laminar checkpoints quarantine /[^`]+)`")  # not the generic advice


def test_an_unprovable_damaged_manifest_stops_and_its_command_repairs_it(tmp_path: Path) -> None:
    pipeline = exactly_once_pipeline(tmp_path, ROWS)
    killed = run_in_child(pipeline, tmp_path, "killed", crash="done:0")
    assert killed.crashed, killed.tail()
    (manifest,) = (tmp_path / "checkpoint" / "laminar").glob("*/manifest.json")
    damage_file(manifest, Corruption.FLIP_BYTE)

    refused = run_in_child(pipeline, tmp_path, "refused")

    assert refused.returncode != 0
    log = refused.log.read_text(errors="replace")
    assert "proves nothing yet" in log, refused.tail()
    assert f"{manifest.parent.name}/manifest.json" in log
    commands = set(COMMAND.findall(log))
    assert len(commands) == 1, commands
    (command,) = commands
    assert len(MemorySink.committed_ids(tmp_path / "sink")) == 25, "nothing written meanwhile"

    repair = subprocess.run(
        [sys.executable, "-m", "laminar_sdk", *shlex.split(command)[1:]],
        capture_output=True,
        text=True,
        check=False,
    )
    assert repair.returncode == 0, repair.stdout + repair.stderr
    assert f"set checkpoint {manifest.parent.name} aside" in repair.stdout

    resumed = run_in_child(pipeline, tmp_path, "resumed")
    assert resumed.returncode == 0, resumed.tail()
    assert sorted(MemorySink.committed_ids(tmp_path / "sink")) == expected_ids(ROWS)
