"""The epoch writer — the process that lives across commits — killed mid-epoch, on Spark.

A one-instance sink is written by the epoch writer while the write tasks run; the commit
finishes the epoch there. The writer is SIGKILLed at steps of four micro-batches: while the
tasks stream one to it; while the commit waits, before anything is decided; after one's commit
was decided (manifest durable, sink not yet committed); after one was committed, before it
could answer. Each time the commit finishes the micro-batch without it, and the query goes
on: every id exactly once.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from laminar_conformance.spark import start_child
from spark_pipelines import exactly_once_pipeline, expected_ids

from laminar_sdk.reference import MemorySink

ROWS = 60  # per partition: 120 ids in micro-batches of at most 25 rows, epochs 0 to 4

ONE_INSTANCE_PLUGIN = """
from laminar_sdk import hookimpl
from laminar_sdk.reference import MemorySink


class OneInstanceMemorySink(MemorySink):
    # Written by one instance (the epoch writer, or the commit), not by the tasks.
    def as_distributed_commit(self):
        return None


@hookimpl
def laminar_register_connectors(registry):
    registry.add_sink(
        "one-instance-memory", OneInstanceMemorySink, config_keys=MemorySink.CONFIG_KEYS
    )
"""


@pytest.fixture
def short_directory() -> Iterator[Path]:
    """A directory with a short path: the child's temporary files, and the writer's socket."""
    directory = Path(tempfile.mkdtemp(prefix="ew-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.spark
@pytest.mark.slow
def test_killing_the_epoch_writer_mid_epoch_loses_and_doubles_nothing(
    short_directory: Path, install_distribution
) -> None:
    site = install_distribution(
        "laminar-plugin-one-instance",
        modules={"one_instance_plugin": ONE_INSTANCE_PLUGIN},
        plugins={"one-instance": "one_instance_plugin"},
    )
    kills = ["write:1", "pre-commit:2", "commit:3", "done:4"]
    pipeline = dataclasses.replace(
        exactly_once_pipeline(short_directory, ROWS),
        sink="one-instance-memory",
        epoch_writer_kills=",".join(kills),  # LAMINAR_SPARK_KILL_EPOCH_WRITER, through a file
    )

    run = start_child(pipeline, short_directory, "run", python_path=(str(site),)).wait()

    assert run.returncode == 0, run.tail()
    assert not run.crashed, "the driver was killed, not the writer alone"
    assert sorted(kill["crash"] for kill in run.writer_kills) == sorted(kills), "a kill missed"
    assert len({kill["pid"] for kill in run.writer_kills}) == len(kills), "writers restarted"
    assert sorted(MemorySink.committed_ids(short_directory / "sink")) == expected_ids(ROWS)
