"""The polled-source crash scenario where a multi-machine deployment runs it.

Whatever must survive a crash lives in the laminar checkpoint location, never on the driver's
local disk or in a process: the same scenario as :mod:`test_live_source_recovery` — ``spool``
appended to while the pipeline is killed and restarted — runs on a local standalone cluster
(executors in processes of their own, started by a worker), and with the laminar checkpoint
location (read log, manifests, connectors' state) on an S3-compatible server.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from laminar_conformance.services import S3Endpoint
from laminar_conformance.spark import run_in_child
from live_sources import Appender, assert_exactly_once, kill_at_random, spool_pipeline
from test_standalone_cluster import standalone_cluster

from laminar_sdk import open_checkpointer
from laminar_sdk.reference import MemorySink

# Each repeats a scenario CI runs in local mode, on infrastructure that takes minutes to start:
# `tox -e full` runs them.
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.full]

# On a cluster the crash hook must fire in the driver (it kills the JVM above the Python
# worker that reaches the point): the commit steps run there, the write tasks on executors.
CLUSTER_CRASHES = ("done:1", "commit:3")


def test_a_polled_source_on_a_standalone_cluster_survives_kills_exactly_once(
    tmp_path: Path, spool_site: str, appender: Appender
) -> None:
    groups: list[int] = []
    with standalone_cluster(tmp_path, groups) as master:
        pipeline = spool_pipeline(tmp_path, master=master)
        for number, crash in enumerate(CLUSTER_CRASHES):
            run = run_in_child(
                pipeline, tmp_path, f"run-{number}", crash=crash, python_path=(spool_site,)
            )
            assert run.crashed, f"run {number} was not killed at {crash}:\n{run.tail()}"
        seed = random.randrange(2**32)
        kill_at_random(pipeline, tmp_path, "run-random", spool_site, seed)
        appended = appender.stop()
        final = run_in_child(pipeline, tmp_path, "run-last", python_path=(spool_site,))
        assert final.returncode == 0, final.tail()
        executors = list((tmp_path / "work").glob("app-*/*/stderr"))
        assert executors, "the micro-batches did not run on the cluster's executors"

    delivered = MemorySink.committed_ids(tmp_path / "sink")
    assert_exactly_once(appended, delivered, f"random kill seed {seed}")


def test_a_polled_source_with_its_checkpoint_location_on_an_object_store(
    tmp_path: Path, spool_site: str, appender: Appender, s3_endpoint: S3Endpoint
) -> None:
    location = s3_endpoint.location(f"live-{tmp_path.name}")
    options = s3_endpoint.checkpointer_options()
    laminar = {"laminar.checkpoint.location": location} | {
        f"laminar.checkpoint.option.{key}": value for key, value in options.items()
    }
    pipeline = spool_pipeline(tmp_path, laminar=laminar)
    for number, crash in enumerate(("done:1", "source-read:1:1000", "write:4")):
        run = run_in_child(
            pipeline, tmp_path, f"run-{number}", crash=crash, python_path=(spool_site,)
        )
        assert run.crashed, f"run {number} was not killed at {crash}:\n{run.tail()}"
    appended = appender.stop()
    final = run_in_child(pipeline, tmp_path, "run-last", python_path=(spool_site,))
    assert final.returncode == 0, final.tail()

    assert_exactly_once(appended, MemorySink.committed_ids(tmp_path / "sink"), "on S3")
    assert not (tmp_path / "checkpoint" / "laminar").exists(), "nothing laminar kept locally"
    store = open_checkpointer(location, options=options)
    assert asyncio.run(store.list_checkpoints()), "the manifests are on the object store"
    read_log = open_checkpointer(f"{location}/read-log", options=options)
    assert asyncio.run(read_log.list_artifacts()), "and so is the read log"
