"""Exactly-once across real crashes: SIGKILL at every protocol step, and a broker restart."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from kafka_crash_child import IDS_PER_EPOCH, batches
from kafka_testing import CLIENT_LOGGER, Kafka
from laminar_conformance.services import LocalKafka
from laminar_sdk import (
    EpochCoordinator,
    FileCheckpointer,
    LaminarError,
    ProtocolStep,
    RetryPolicy,
    load_connector_registry,
)

CHILD = Path(__file__).with_name("kafka_crash_child.py")
EPOCHS = 3
KILLED_EPOCH = 1
POINTS = [{"step": step.value} for step in ProtocolStep] + [
    {"call": call, "when": when}
    for call in ("begin_epoch", "write_batch", "pre_commit", "commit_epoch")
    for when in ("before", "after")
]


# In CI: a crash before the commit decision (the epoch is rolled back and replayed) and one
# after it (a new instance commits the staged copy). Every other point: `tox -e full`.
IN_CI = ("pre-commit", "manifest")


def point_id(point: dict[str, str]) -> str:
    return point.get("step") or f"{point['when']}-{point['call']}"


def parameters(points: list[dict[str, str]]) -> list:
    return [
        pytest.param(
            point, id=point_id(point), marks=() if point_id(point) in IN_CI else pytest.mark.full
        )
        for point in points
    ]


def run_child(arguments: dict) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHILD), json.dumps(arguments)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.parametrize("point", parameters(POINTS))
def test_every_id_is_committed_once_after_a_sigkill_at_each_step(kafka, tmp_path, point):
    topic = kafka.topic(2)
    arguments = {
        "properties": {
            "bootstrap.servers": kafka.bootstrap,
            "topic": topic,
            "staging.dir": str(tmp_path / "staging"),
            "kafka.linger.ms": "1",
        },
        "checkpoints": str(tmp_path / "checkpoints"),
        "epochs": EPOCHS,
    }
    killed = run_child({**arguments, "kill": {**point, "epoch": KILLED_EPOCH}})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "done" not in killed.stdout
    restarted = run_child(arguments)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert kafka.committed_ids(topic, 2) == list(range(EPOCHS * IDS_PER_EPOCH))
    assert not list((tmp_path / "staging").rglob("*.arrow")), "staged copies left behind"


@pytest.mark.slow
@pytest.mark.full  # nightly: CI kills the pipeline before and after the commit decision (above)
def test_a_broker_restart_in_the_middle_of_an_epoch_keeps_every_id_once(tmp_path):
    # A broker of its own: restarting the session's broker would disturb the other tests.
    with LocalKafka(workdir=tmp_path / "broker") as broker:
        admin = AdminClient(
            {"bootstrap.servers": broker.bootstrap_servers, "logger": CLIENT_LOGGER}
        )
        kafka = Kafka(broker.bootstrap_servers, admin)
        topic = kafka.topic(2)
        properties = {
            "bootstrap.servers": broker.bootstrap_servers,
            "topic": topic,
            "staging.dir": str(tmp_path / "staging"),
            "timeout.ms": "60000",
            "flush.timeout.ms": "60000",
        }
        attempts = asyncio.run(write_through_a_restart(broker, properties, tmp_path))
        assert kafka.committed_ids(topic, 2) == list(range(EPOCHS * IDS_PER_EPOCH))
        assert 1 <= attempts <= 3


async def write_through_a_restart(broker: LocalKafka, properties: dict, tmp_path: Path) -> int:
    """Write the epochs, restarting the broker (SIGKILL) between two batches of epoch 1.

    An epoch that fails is rolled back by the coordinator and replayed, as a pipeline would.
    Returns how many attempts epoch 1 took.
    """
    sink, _ = await load_connector_registry().open_sink("kafka", properties)
    coordinator = EpochCoordinator(
        FileCheckpointer(str(tmp_path / "checkpoints")),
        {"kafka": sink},
        policy=RetryPolicy(call_timeout_s=120),
    )
    await coordinator.recover()
    await coordinator.run_epoch(0, batches(0), {})

    async def restarting_midway():
        first, second = batches(KILLED_EPOCH)
        yield first
        broker.restart(graceful=False)
        yield second

    attempts = 1
    try:
        await coordinator.run_epoch(KILLED_EPOCH, restarting_midway(), {})
    except LaminarError:
        while True:  # rolled back: replay the epoch, the broker back up
            attempts += 1
            try:
                await coordinator.run_epoch(KILLED_EPOCH, batches(KILLED_EPOCH), {})
                break
            except LaminarError:
                if attempts == 3:
                    raise
    for epoch in range(KILLED_EPOCH + 1, EPOCHS):
        await coordinator.run_epoch(epoch, batches(epoch), {})
    await sink.close()
    return attempts
