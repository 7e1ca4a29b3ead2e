"""The server crashes (``pg_ctl stop -m immediate``) at each step of the epoch protocol.

A pipeline — the SDK's epoch coordinator, the ``postgres`` sink, the embedded ``file``
checkpoint store — writes three epochs to a server the test started itself, which it stops
with ``pg_ctl stop -m immediate`` (no checkpoint: crash recovery at the next start) and starts
again at one protocol step of epoch 1: between two calls (the steps of
:class:`laminar_sdk.ProtocolStep`), or inside one (at a crash point the sink marks). Whatever
fails then fails the run, as it would a real pipeline; the pipeline is started again from its
checkpoints, with a new sink instance, until every epoch is committed. A reader then sees
every id exactly once.

The default suite crashes the server at three steps; ``full`` runs every step of both
exactly-once modes.
"""

from __future__ import annotations

import asyncio
import gc
import uuid

import pyarrow as pa
import pytest
from laminar_conformance.services import LocalPostgres
from laminar_sdk import (
    EpochCoordinator,
    FileCheckpointer,
    LaminarError,
    ProtocolStep,
    RetryPolicy,
    load_connector_registry,
)
from laminar_sdk.faults import injecting_crash_points
from postgres_testing import Database

pytestmark = pytest.mark.slow

REGISTRY = load_connector_registry()
EPOCHS = [list(range(e * 10, e * 10 + 10)) for e in range(3)]
CRASHED_EPOCH = 1
POLICY = RetryPolicy(call_timeout_s=60.0, attempts=3, backoff_s=0.05)

BETWEEN = [step.value for step in ProtocolStep]
INSIDE = {
    "append": ["epoch-staged", "marker-upserted", "epoch-committed"],
    "two-phase": ["transaction-prepared", "transaction-committed"],
}
CONNECTORS = {"append": "postgres", "two-phase": "postgres-2pc"}
QUICK = {("append", "commit"), ("append", "write"), ("two-phase", "commit")}


def cases():
    for mode in ("append", "two-phase"):
        for point in BETWEEN + INSIDE[mode]:
            marks = [] if (mode, point) in QUICK else [pytest.mark.full]
            yield pytest.param(mode, point, marks=marks, id=f"{mode}-{point}")


@pytest.fixture(scope="module")
def cluster():
    """A server of this module's own: only a server the launcher started can be crashed."""
    with LocalPostgres() as started:
        yield started


class ServerCrash:
    """Crashes the server once, at ``point`` of epoch 1, and starts it again."""

    def __init__(self, cluster: LocalPostgres, point: str) -> None:
        self.cluster = cluster
        self.point = point
        self.epoch: int | None = None
        self.fired = False

    def crash(self) -> None:
        self.fired = True
        self.cluster.stop(immediate=True)
        self.cluster.start()

    def observe(self, step: ProtocolStep, epoch: int) -> None:
        self.epoch = epoch
        if not self.fired and step.value == self.point and epoch == CRASHED_EPOCH:
            self.crash()

    def reached(self, name: str) -> None:
        if not self.fired and name == self.point and self.epoch == CRASHED_EPOCH:
            self.crash()


async def run_until_done(connector, properties, store, crash: ServerCrash) -> int:
    """Run every epoch, starting the pipeline again after each failure; the restarts."""
    restarts = 0
    while True:
        sink, _ = await REGISTRY.open_sink(connector, properties)
        coordinator = EpochCoordinator(store, {"sink": sink}, policy=POLICY, observer=crash.observe)
        try:
            await coordinator.recover()
            for epoch in range(coordinator.next_epoch, len(EPOCHS)):
                batch = pa.RecordBatch.from_pydict({"id": pa.array(EPOCHS[epoch], pa.int64())})
                await coordinator.run_epoch(epoch, [batch], {})
        except LaminarError:
            restarts += 1
            assert restarts < 5, "the pipeline does not get past the server crash"
            del sink, coordinator  # the failed process is gone, its connections too
            gc.collect()
            continue
        await sink.close()
        return restarts


@pytest.mark.parametrize(("mode", "point"), list(cases()))
def test_a_server_crash_at_each_step_loses_and_duplicates_nothing(cluster, tmp_path, mode, point):
    service = type("Service", (), {"dsn": cluster.dsn, "password_file": cluster.password_file})
    database = Database(service)
    table = database.name("crash")
    database.execute(f"CREATE TABLE {table} (id bigint)")
    database.connection.close()
    properties = {
        **database.properties(),
        "table": table,
        "sink.id": f"crash-{uuid.uuid4().hex[:8]}",
        **({"staging.location": str(tmp_path / "staging")} if mode == "append" else {}),
    }
    crash = ServerCrash(cluster, point)
    store = FileCheckpointer(str(tmp_path / "checkpoints"))
    with injecting_crash_points(crash.reached):
        restarts = asyncio.run(run_until_done(CONNECTORS[mode], properties, store, crash))
    assert crash.fired, f"the run never reached {point} of epoch {CRASHED_EPOCH}"
    database = Database(service)
    database.tables.append(table)
    try:
        ids = database.ids(table)
        prepared = database.execute("SELECT gid FROM pg_prepared_xacts")
    finally:
        database.close()
    expected = sorted(i for epoch in EPOCHS for i in epoch)
    assert ids == expected, f"after a server crash at {point} ({restarts} restarts)"
    assert not prepared, "prepared transactions left behind"
