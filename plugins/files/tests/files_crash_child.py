"""A process that writes through the ``files`` sink and SIGKILLs itself at a chosen point.

``python files_crash_child.py pipeline WORK EPOCHS [KILL]`` — epochs 0 .. EPOCHS - 1, three ids
each (``3e``, ``3e + 1``, ``3e + 2``), through the SDK's epoch coordinator with the file
checkpoint store in ``WORK/checkpoints``, into the sink at ``WORK/out``; a run resumes where
the last one stopped.

``python files_crash_child.py stage WORK EPOCH TASK IDS [KILL_AFTER]`` — stage the
comma-separated ``IDS`` (one batch each) as task ``TASK``; print the descriptor. With
``KILL_AFTER``, the process dies after writing that many batches.

``python files_crash_child.py commit WORK EPOCH DESCRIPTORS [KILL]`` — ``commit_aggregated``
the descriptors in the JSON file ``DESCRIPTORS`` (as recovery finds them in the manifest).

``KILL`` is ``step:<protocol step>:<epoch>`` (the coordinator's steps), ``rename-before:<e>``
or ``rename-after:<e>`` (around the rename that publishes epoch ``e``), or ``move:<e>`` (after
the first file of ``e`` is moved to where it is gathered for publishing).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from files_testing import ids_batch
from laminar_sdk import (
    EpochCoordinator,
    FileCheckpointer,
    ProtocolStep,
    SinkConnector,
    load_connector_registry,
)

IDS_PER_EPOCH = 3


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def kill_at_rename(wanted: Callable[[Path], bool], before: bool) -> None:
    """Die just before (or after) the first ``os.rename`` whose destination is ``wanted``."""
    real = os.rename

    def rename(source: Any, destination: Any, *args: Any, **kwargs: Any) -> None:
        chosen = wanted(Path(destination))
        if chosen and before:
            die()
        real(source, destination, *args, **kwargs)
        if chosen:
            die()

    os.rename = rename


def arm(kill: str | None) -> Callable[[ProtocolStep, int], None]:
    """Set up ``kill``; return the coordinator observer that dies at a protocol step."""
    target: tuple[str, int] | None = None
    if kill is not None:
        where, epoch = kill.rsplit(":", 1)
        published = f"epoch={int(epoch):020d}"
        if where.startswith("step:"):
            target = (where.removeprefix("step:"), int(epoch))
        elif where in ("rename-before", "rename-after"):
            kill_at_rename(lambda path: path.name == published, before=where == "rename-before")
        elif where == "move":
            gathering = f"publishing-{epoch}"
            kill_at_rename(lambda path: path.parent.name == gathering, before=False)
        else:
            raise SystemExit(f"unknown kill point {kill!r}")

    def observe(step: ProtocolStep, epoch: int) -> None:
        if (step.value, epoch) == target:
            die()

    return observe


async def open_sink(work: Path) -> SinkConnector:
    sink, _ = await load_connector_registry().open_sink(
        "files", {"path": str(work / "out"), "rows_per_file": "2"}
    )
    return sink


async def pipeline(work: Path, epochs: int, kill: str | None) -> None:
    observer = arm(kill)
    sink = await open_sink(work)
    store = FileCheckpointer(str(work / "checkpoints"))
    coordinator = EpochCoordinator(store, {"files": sink}, observer=observer)
    await coordinator.recover()
    for epoch in range(coordinator.next_epoch, epochs):
        first = epoch * IDS_PER_EPOCH
        batches = [ids_batch([first]), ids_batch(range(first + 1, first + IDS_PER_EPOCH))]
        await coordinator.run_epoch(epoch, batches, {})
    await sink.close()


async def stage(work: Path, epoch: int, task: str, ids: list[int], kill_after: int | None) -> str:
    sink = await open_sink(work)

    async def batches() -> AsyncIterator[Any]:
        for number, record in enumerate(ids):
            if number == kill_after:
                die()
            yield ids_batch([record])

    committer = sink.as_distributed_commit()
    assert committer is not None
    return await committer.stage(epoch, task, batches())


async def commit(work: Path, epoch: int, descriptors: list[str], kill: str | None) -> None:
    arm(kill)
    sink = await open_sink(work)
    committer = sink.as_distributed_commit()
    assert committer is not None
    await committer.commit_aggregated(epoch, descriptors)


def main(argv: list[str]) -> None:
    mode, work = argv[0], Path(argv[1])
    if mode == "pipeline":
        asyncio.run(pipeline(work, int(argv[2]), argv[3] if len(argv) > 3 else None))
    elif mode == "stage":
        ids = [int(text) for text in argv[4].split(",")]
        kill_after = int(argv[5]) if len(argv) > 5 else None
        print(asyncio.run(stage(work, int(argv[2]), argv[3], ids, kill_after)))
    else:
        descriptors = json.loads(Path(argv[3]).read_text())
        asyncio.run(commit(work, int(argv[2]), descriptors, argv[4] if len(argv) > 4 else None))


if __name__ == "__main__":
    main(sys.argv[1:])
