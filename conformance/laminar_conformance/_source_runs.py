"""Epochs of a source as the runtime reads them, through crashes inside its calls.

Each epoch is read as the Spark bridge reads a micro-batch: a new instance is opened and
restored from the last committed checkpoint (none before the first epoch), polled a few
times, asked for its checkpoint and closed; then the epoch commits — its records and its
checkpoint together, as the runtime's manifest keeps them. A crash anywhere in an epoch loses
what the epoch read (it never committed), and the next instance restores the last committed
checkpoint. A source with side effects in its calls (records moved, acknowledged or archived
as they are read) must leave them so that the restored instance returns every record after
that checkpoint, once: whatever point of a call the process died at.

The same runner runs in the kit's process (crashes simulated) and in a child process the kit
kills (:mod:`laminar_conformance._kill`), which keeps what it commits on disk for the kit to
go on from.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from laminar_conformance._delivery import CALL_TIMEOUT_S, answered
from laminar_conformance._faults import FaultPlan, FaultySource, release_crashed_run
from laminar_conformance._inside_crashes import CRASHES_PER_RUN
from laminar_sdk import SourceCheckpoint, SourceConnector
from laminar_sdk.faults import SimulatedCrash


@dataclass(frozen=True, slots=True)
class SourceSchedule:
    """How much a run reads: ``epochs`` epochs of ``polls`` polls of ``max_records`` each.

    Fewer records per poll than a partition holds, so that epochs end in the middle of
    partitions and restores seek into them.
    """

    epochs: int = CRASHES_PER_RUN + 1
    """An epoch before the crashes, and one for each crash of a run (epochs 1 to 3)."""
    polls: int = 3
    max_records: int = 2
    records_per_partition: int = 6
    """What the kit appends to each partition before the run."""

    def __str__(self) -> str:
        return (
            f"{self.epochs} epochs of {self.polls} polls of at most {self.max_records} records, "
            f"each on a new instance restored from the last committed checkpoint"
        )


def write_batches(path: Path, batches: list[pa.RecordBatch]) -> None:
    """Write an epoch's ``batches`` to ``path`` as an Arrow IPC file (none: an empty file).

    How the kit and a child process it kills hand each other an epoch's records.
    """
    schema = batches[0].schema if batches else pa.schema([])
    with pa.OSFile(str(path), "wb") as file, pa.ipc.new_file(file, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)


def read_batches(path: Path) -> list[pa.RecordBatch]:
    """The batches :func:`write_batches` wrote to ``path``."""
    with pa.memory_map(str(path)) as data:
        reader = pa.ipc.open_file(data)
        return [reader.get_batch(index) for index in range(reader.num_record_batches)]


_COMMITTED = "committed.json"


@dataclass(slots=True)
class Committed:
    """What the committed epochs read, and where the next epoch starts.

    :param directory: where each commit is also kept (by a child process the kit kills), or
        ``None``.
    """

    directory: Path | None = None
    checkpoint: str | None = None
    """The last committed epoch's checkpoint, as JSON (``None``: nothing committed yet)."""
    batches: list[list[pa.RecordBatch]] = field(default_factory=list)
    """The records of each committed epoch."""

    @property
    def epochs(self) -> int:
        """How many epochs committed: the next epoch's number."""
        return len(self.batches)

    def commit(self, checkpoint: SourceCheckpoint, batches: list[pa.RecordBatch]) -> None:
        """Commit the next epoch: its records, then (atomically) its checkpoint with them."""
        if self.directory is not None:
            write_batches(self.directory / f"epoch-{self.epochs}.arrow", batches)
            state = self.directory / f"{_COMMITTED}.tmp"
            state.write_text(
                json.dumps({"checkpoint": checkpoint.to_json(), "epochs": self.epochs + 1}),
                encoding="utf-8",
            )
            os.replace(state, self.directory / _COMMITTED)
        self.checkpoint = checkpoint.to_json()
        self.batches.append(batches)

    @classmethod
    def load(cls, directory: Path) -> Committed:
        """What a child process committed in ``directory`` before it was killed."""
        committed = cls()
        state = directory / _COMMITTED
        if not state.exists():
            return committed
        kept = json.loads(state.read_text(encoding="utf-8"))
        committed.checkpoint = kept["checkpoint"]
        for epoch in range(int(kept["epochs"])):
            committed.batches.append(read_batches(directory / f"epoch-{epoch}.arrow"))
        return committed


async def run_source_epochs(
    open_source: Callable[[], Awaitable[SourceConnector]],
    plan: FaultPlan,
    schedule: SourceSchedule,
    committed: Committed,
    *,
    poll_timeout_s: float = CALL_TIMEOUT_S,
) -> int:
    """Read the epochs of ``schedule`` not yet ``committed``, a new instance after each crash.

    :param open_source: opens a new instance (not restored).
    :param poll_timeout_s: how long a ``poll_batch`` may take before the run fails.
    :returns: the number of crashes.
    """
    crashes = 0
    while committed.epochs < schedule.epochs:
        try:
            source = FaultySource(await open_source(), plan, committed.epochs)
            if committed.checkpoint is not None:
                await source.restore(SourceCheckpoint.from_json(committed.checkpoint))
            batches = []
            for _ in range(schedule.polls):
                polled = await answered(
                    source.poll_batch(schedule.max_records),
                    f"poll_batch({schedule.max_records})",
                    poll_timeout_s,
                )
                if polled is not None:
                    batches.append(polled.records)
            checkpoint = source.checkpoint()
            await source.close()
        except SimulatedCrash as crash:
            crashes += 1  # the instance dies without close(); the next one restores
            del source
            release_crashed_run(crash)
            continue
        committed.commit(checkpoint, batches)
    return crashes
