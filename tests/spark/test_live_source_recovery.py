"""Polled sources on Spark, killed again and again: a re-run holds exactly its first run's records.

``spool`` (:mod:`spool_plugin`) is a multi-partition polling source written to today's contract
only, installed as a third-party plugin. A thread keeps appending records to every partition
(and, after a while, to a new one) while the pipeline (``spool`` -> memory sink, exactly-once)
runs in child processes that are SIGKILLed — at the crash points where a micro-batch is re-run
or re-planned, and at a random moment — and restarted from the same checkpoint location each
time, with data arriving meanwhile; the newest manifest is also damaged between restarts. In
the end every appended id is counted: none lost, none twice. ``ticket`` (:mod:`ticket_plugin`)
is not deterministic at all: the micro-batch Spark re-runs must hold its first run's records.
"""

from __future__ import annotations

import random
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from laminar_conformance.checkpointer import Corruption, damage_file
from laminar_conformance.spark import SparkPipeline, run_in_child
from live_sources import (
    PARTITIONS,
    Appender,
    assert_exactly_once,
    kill_at_random,
    spool_pipeline,
)
from ticket_plugin import journal

from laminar_sdk.reference import MemorySink

pytestmark = pytest.mark.spark

# Kills in this order, each run resuming the last one's checkpoint with data arriving meanwhile:
# `done` (Spark re-runs a committed micro-batch), `source-read` (the planning process dies after
# logging a micro-batch, before Spark's offset log names it), `write` (a planned, uncommitted
# micro-batch is re-run), `commit` (a decided one is finished, then re-run); then a kill at a
# random moment. Three kills are followed by damage to the newest manifest — truncated, a byte
# flipped, deleted — which Spark's commit log makes up for. A partition is added upstream after
# the second kill: the restarts find one partition more than Spark's offsets name.
CRASHES = (
    ("done:1", Corruption.TRUNCATE),
    ("source-read:1:1000", None),
    ("write:4", Corruption.FLIP_BYTE),
    ("commit:6", Corruption.DELETE),
)
PARTITION_ADDED_AFTER = 1
# Twice at the points where a re-run must hold its first run's records (a committed micro-batch,
# a planned one), each followed by damage, then at random; and every kill above.
TWO_CRASHES = (CRASHES[0], CRASHES[2])


def newest_manifest(work: Path) -> Path:
    manifests = (work / "checkpoint" / "laminar").glob("*/manifest.json")
    return max(manifests, key=lambda path: path.parent.name)


# Nightly (`tox -e full`): three to five Spark drivers, two to four of CI's twelve minutes.
@pytest.mark.full
@pytest.mark.parametrize(
    "crashes",
    [pytest.param(TWO_CRASHES, id="two-kills"), pytest.param(CRASHES, id="four-kills")],
)
def test_a_polled_source_appended_to_while_killed_delivers_exactly_once(
    tmp_path: Path, spool_site: str, appender: Appender, crashes: tuple
) -> None:
    pipeline = spool_pipeline(tmp_path)
    for number, (crash, damage) in enumerate(crashes):
        run = run_in_child(
            pipeline, tmp_path, f"run-{number}", crash=crash, python_path=(spool_site,)
        )
        assert run.crashed, f"run {number} was not killed at {crash}:\n{run.tail()}"
        if damage is not None:
            damage_file(newest_manifest(tmp_path), damage)
        if number == PARTITION_ADDED_AFTER:
            appender.add_partition()
    seed = random.randrange(2**32)
    kill_at_random(pipeline, tmp_path, "run-random", spool_site, seed)

    appended = appender.stop()
    final = run_in_child(pipeline, tmp_path, "run-last", python_path=(spool_site,))
    assert final.returncode == 0, final.tail()

    delivered = MemorySink.committed_ids(tmp_path / "sink")
    assert_exactly_once(appended, delivered, f"random kill seed {seed}")
    partitions = set(MemorySink.committed_table(tmp_path / "sink").column("partition").to_pylist())
    assert partitions == set(range(PARTITIONS + 1))
    runs = [f"run-{number}" for number in range(1, len(crashes))] + ["run-random"]
    after_damage = [runs[number] for number, (_, damage) in enumerate(crashes) if damage]
    for name in after_damage:
        log = (tmp_path / f"{name}.log").read_text(errors="replace")
        assert "are unreadable or missing" in log, f"{name} did not use Spark's proof"


def epoch_ids(sink: Path, epoch: int) -> list[int]:
    """The ids the memory sink at ``sink`` committed in ``epoch``."""
    return [
        i
        for part in sorted((sink / "committed" / f"epoch-{epoch}").rglob("*.arrow"))
        for batch in pa.ipc.open_file(pa.memory_map(str(part))).read_all().to_batches()
        for i in batch.column("id").to_pylist()
    ]


TICKETS = 200
RE_RUN = 3


@pytest.mark.full  # nightly: CI re-runs polled micro-batches in the test above
def test_a_re_run_holds_its_first_runs_records_even_from_a_source_that_is_not_deterministic(
    tmp_path: Path, ticket_site: str
) -> None:
    # `ticket` hands out new random ids each time it is polled from a position: a re-run that
    # polled again would hold other records than the first run planned.
    (tmp_path / "tickets").mkdir()
    pipeline = SparkPipeline(
        source="ticket",
        source_options={"path": str(tmp_path / "tickets"), "limit": str(TICKETS)},
        sink="memory",
        sink_options={"path": str(tmp_path / "sink")},
        checkpoint_location=str(tmp_path / "checkpoint"),
        delivery="exactly-once",
        max_records_per_batch=25,
        timeout_s=120,
    )
    crashed = run_in_child(
        pipeline, tmp_path, "crashed", crash=f"write:{RE_RUN}", python_path=(ticket_site,)
    )
    assert crashed.crashed, crashed.tail()
    crash_ended = time.time()

    final = run_in_child(pipeline, tmp_path, "resumed", python_path=(ticket_site,))
    assert final.returncode == 0, final.tail()

    issued = journal(tmp_path / "tickets")
    delivered = MemorySink.committed_ids(tmp_path / "sink")
    assert len(delivered) == TICKETS, "every position once"
    assert len(set(delivered)) == TICKETS, "no record twice"
    assert set(delivered) <= set(issued)
    re_run = epoch_ids(tmp_path / "sink", RE_RUN)
    assert len(re_run) == 25
    assert all(issued[i] < crash_ended for i in re_run), "the first run's records, not new ones"


# Nightly (`tox -e full`): three Spark drivers.
@pytest.mark.full
def test_a_damaged_read_log_entry_set_aside_is_read_again_from_the_source(
    tmp_path: Path, spool_site: str
) -> None:
    # One partition: polled again from the micro-batch's start offset, the source returns the
    # same records first, whatever arrived since.
    spool = tmp_path / "spool"
    spool.mkdir()
    appender = Appender(spool, partitions=1)
    appender.add(50)
    pipeline = spool_pipeline(tmp_path)
    killed = run_in_child(pipeline, tmp_path, "killed", crash="write:0", python_path=(spool_site,))
    assert killed.crashed, killed.tail()
    appender.add(20)
    (logged,) = (tmp_path / "checkpoint" / "laminar" / "read-log").rglob("*.snap")
    damage_file(logged, Corruption.FLIP_BYTE)

    refused = run_in_child(pipeline, tmp_path, "refused", python_path=(spool_site,))

    assert refused.returncode != 0
    log = refused.log.read_text(errors="replace")
    assert "fails its SHA-256 check" in log, refused.tail()
    commands = set(re.findall(r"`(laminar checkpoints quarantine /[^`]+)`", log))
    assert len(commands) == 1, commands
    repair = subprocess.run(
        [sys.executable, "-m", "laminar_sdk", *shlex.split(commands.pop())[1:]],
        capture_output=True,
        text=True,
        check=False,
    )
    assert repair.returncode == 0, repair.stdout + repair.stderr
    assert "set read-log entry" in repair.stdout

    resumed = run_in_child(pipeline, tmp_path, "resumed", python_path=(spool_site,))

    assert resumed.returncode == 0, resumed.tail()
    assert "reading its 50 record(s) again from the source" in resumed.log.read_text()
    delivered = MemorySink.committed_ids(tmp_path / "sink")
    assert_exactly_once(appender.appended, delivered, "after the read-log entry was set aside")
