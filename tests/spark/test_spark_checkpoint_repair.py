"""A damaged laminar checkpoint location that nothing makes up for: the error, then the repair.

Generator -> memory, exactly-once. The pipeline is killed after it committed micro-batch 0 and
before Spark's commit log recorded it, then the manifest of epoch 0 is damaged: Spark re-runs
micro-batch 0, whose commit log proves nothing yet, so the restart stops with an error naming
the damaged file and the exact ``laminar checkpoints quarantine`` command to run. With the
manifest set aside the location holds no checkpoint while the sink records epoch 0 as
committed, so the next restart stops too, naming the ``laminar checkpoints mark-committed``
command that records it. Running each command from its message, then restarting, delivers
every id exactly once.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
from laminar_conformance.checkpointer import Corruption, damage_file
from laminar_conformance.spark import run_in_child
from spark_pipelines import exactly_once_pipeline, expected_ids, laminar

from laminar_sdk.reference import MemorySink

# The repair command itself is tested without Spark (tests/checkpoint/test_checkpoint_cli.py).
pytestmark = [pytest.mark.spark, pytest.mark.full]

ROWS = 30
QUARANTINE = re.compile(r"`(laminar checkpoints quarantine /[^`]+)`")  # not the generic advice
MARK_COMMITTED = re.compile(r"`(laminar checkpoints mark-committed /[^`]+)`")


def command_in(log: str, pattern: re.Pattern[str]) -> str:
    """The one command of ``pattern`` that ``log`` names."""
    commands = set(pattern.findall(log))
    assert len(commands) == 1, log[-3000:]
    (command,) = commands
    return command


def run_command(command: str) -> subprocess.CompletedProcess[str]:
    """Run ``command`` (``laminar ...``, from an error message); it must succeed."""
    done = laminar(*shlex.split(command)[1:])
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_an_unprovable_damaged_manifest_stops_and_the_commands_named_repair_it(
    tmp_path: Path,
) -> None:
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
    quarantine = command_in(log, QUARANTINE)
    assert len(MemorySink.committed_ids(tmp_path / "sink")) == 25, "nothing written meanwhile"

    repaired = run_command(quarantine)
    assert f"set checkpoint {manifest.parent.name} aside" in repaired.stdout

    ahead = run_in_child(pipeline, tmp_path, "ahead")
    assert ahead.returncode != 0
    log = ahead.log.read_text(errors="replace")
    assert "sink 'memory' records epochs up to 0 as committed" in log, ahead.tail()
    run_command(command_in(log, MARK_COMMITTED))

    resumed = run_in_child(pipeline, tmp_path, "resumed")
    assert resumed.returncode == 0, resumed.tail()
    assert sorted(MemorySink.committed_ids(tmp_path / "sink")) == expected_ids(ROWS)
