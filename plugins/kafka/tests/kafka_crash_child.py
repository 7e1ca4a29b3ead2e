"""A pipeline's sink side in a child process, killed with SIGKILL at a chosen point.

Run as ``python kafka_crash_child.py JSON``: writes epochs ``0 .. epochs-1`` (epoch ``e`` holds
ids ``e * 10 .. e * 10 + 9``, the same every time it is replayed) to the ``kafka`` sink
through the SDK's epoch coordinator, with a file checkpoint store, after recovering from
whatever an earlier run left. With ``kill`` set, the process kills itself at that point of
that epoch: a protocol step (``{"step": "manifest"}``) or a sink call
(``{"call": "pre_commit", "when": "after"}``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pyarrow as pa
from laminar_sdk import (
    EpochCoordinator,
    FileCheckpointer,
    ForwardingSink,
    ProtocolStep,
    SinkConnector,
    WriteResult,
    load_connector_registry,
)

SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary())])
IDS_PER_EPOCH = 10


def epoch_ids(epoch: int) -> list[int]:
    return list(range(epoch * IDS_PER_EPOCH, (epoch + 1) * IDS_PER_EPOCH))


def batches(epoch: int) -> list[pa.RecordBatch]:
    ids = epoch_ids(epoch)
    halves = (ids[: len(ids) // 2], ids[len(ids) // 2 :])
    result = []
    for half in halves:
        text = pa.array([str(i).encode() for i in half], pa.binary())
        result.append(pa.RecordBatch.from_arrays([text, text], schema=SCHEMA))
    return result


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class KillingSink(ForwardingSink):
    """The real sink, with the process killed before or after one call of one epoch."""

    def __init__(self, sink: SinkConnector, kill: dict[str, Any] | None) -> None:
        super().__init__(sink)
        self._kill = kill or {}
        self._epoch = -1

    async def _call(self, name: str, epoch: int, call: Callable[[], Awaitable[Any]]) -> Any:
        target = self._kill.get("call") == name and self._kill.get("epoch") == epoch
        if target and self._kill["when"] == "before":
            die()
        result = await call()
        if target and self._kill["when"] == "after":
            die()
        return result

    async def begin_epoch(self, epoch: int) -> None:
        self._epoch = epoch
        await self._call("begin_epoch", epoch, lambda: self.wrapped.begin_epoch(epoch))

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        result: WriteResult = await self._call(
            "write_batch", self._epoch, lambda: self.wrapped.write_batch(batch)
        )
        return result

    async def pre_commit(self, epoch: int) -> None:
        await self._call("pre_commit", epoch, lambda: self.wrapped.pre_commit(epoch))

    async def commit_epoch(self, epoch: int) -> None:
        await self._call("commit_epoch", epoch, lambda: self.wrapped.commit_epoch(epoch))

    async def rollback_epoch(self, epoch: int) -> None:
        await self._call("rollback_epoch", epoch, lambda: self.wrapped.rollback_epoch(epoch))


async def main(arguments: dict[str, Any]) -> None:
    kill = arguments.get("kill")
    sink, _ = await load_connector_registry().open_sink("kafka", arguments["properties"])

    def observer(step: ProtocolStep, epoch: int) -> None:
        if kill and kill.get("step") == step.value and kill.get("epoch") == epoch:
            die()

    coordinator = EpochCoordinator(
        FileCheckpointer(arguments["checkpoints"]),
        {"kafka": KillingSink(sink, kill)},
        observer=observer,
    )
    await coordinator.recover()
    for epoch in range(coordinator.next_epoch, arguments["epochs"]):
        await coordinator.run_epoch(epoch, batches(epoch), {})
    await sink.close()
    print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
