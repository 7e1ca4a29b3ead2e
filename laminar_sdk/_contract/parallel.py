"""Opt-in extensions of the contract that let Spark read and write on its executors.

The seed contract moves every record through one process: a source is polled, and a sink is
written to, by a single instance. That keeps the epoch protocol simple, but caps throughput at
what one Python process does. Two opt-in capabilities lift the cap, each offered through an
``as_*`` accessor like the schema capabilities (``None`` by default):

- :class:`RangeReadableSource` (``SourceConnector.as_range_readable``): the source says where
  the data available now ends, as a checkpoint, without reading it, and any instance — in any
  process — returns the records of one partition between two checkpoints. The Spark bridge then
  plans a micro-batch on the driver and reads its partitions in parallel tasks, and replaying a
  micro-batch after a crash reads the same offsets again instead of polling.
- :class:`DistributedCommitSink` (``SinkConnector.as_distributed_commit``): each write task
  stages its share of an epoch durably and invisibly and returns a *commit descriptor* naming
  what it staged; one commit publishes the descriptors of all tasks together
  (LaminarDB's ``pre_commit`` descriptor and ``commit_aggregated``). The runtime records the
  descriptors in the epoch's manifest before it publishes them, so a commit decided before a
  crash is finished by recovery with the same descriptors.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterable, AsyncIterator, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import pyarrow as pa

from laminar_sdk._contract.checkpoint import SourceCheckpoint


@dataclass(frozen=True, slots=True)
class PartitionRange:
    """The records of one source partition between two checkpoints.

    ``start`` and ``end`` are the partition's values in two :class:`SourceCheckpoint` offsets
    maps (``checkpoint.offsets[partition]``): the range holds exactly the records that a
    source restored to a checkpoint holding ``start`` for this partition returns before its
    checkpoint holds ``end`` — everything *after* ``start``, up to and including the record
    that moved the partition to ``end``. Mind the off-by-one: neither the record ``start``
    was taken after, nor the one after ``end``.

    :param partition: the key of the partition in the checkpoints' offsets.
    :param start: the partition's offset in the start checkpoint; ``None`` when the partition
        is absent from it (read from the partition's beginning).
    :param end: the partition's offset in the end checkpoint.
    """

    partition: str
    start: str | None
    end: str


class _SortableKey(Hashable, Protocol):
    def __lt__(self, other: Any, /) -> bool: ...  # noqa: ANN401  # as int's and tuple's


KeyT = TypeVar("KeyT", bound=_SortableKey)


def share_records(available: Mapping[KeyT, int], limit: int | None) -> dict[KeyT, int]:
    """Split ``limit`` records across partitions fairly, for :meth:`RangeReadableSource.plan_end`.

    Each partition with records gets an equal share of what remains, in key order; what a
    partition cannot use (it has fewer records than its share) goes to the others, until the
    limit or every record is taken. ``share_records({0: 10, 1: 2}, 6) == {0: 4, 1: 2}``.

    :param available: the records available after the start, by partition key.
    :param limit: at most this many records in all; ``None``: everything available.
    :returns: how many records to take from each partition of ``available``.
    """
    if limit is None:
        return dict(available)
    share = dict.fromkeys(available, 0)
    remaining = max(0, limit)
    open_keys = sorted(key for key, count in available.items() if count > 0)
    while remaining and open_keys:
        each = max(1, remaining // len(open_keys))
        for key in list(open_keys):
            given = min(each, available[key] - share[key], remaining)
            share[key] += given
            remaining -= given
            if share[key] == available[key]:
                open_keys.remove(key)
            if not remaining:
                break
    return share


class RangeReadableSource(ABC):
    """A replayable source whose partitions can be read in parallel, range by range.

    Offered by :meth:`SourceConnector.as_range_readable`. The runtime calls
    :meth:`plan_end` on one instance to fix where a micro-batch ends, then
    :meth:`read_range` for each partition that moved, on instances opened in other processes
    (the same config, opened, never restored). The two must agree: the union of the ranges
    between ``start`` and ``plan_end(start, …)`` is exactly what polling a source restored to
    ``start`` returns until its checkpoint is that end.

    The Spark bridge asks an *unopened* instance whether it offers this extension, to choose
    its reader before anything is opened: let ``as_range_readable`` answer from the class, not
    from the configuration. The instance that plans may be kept open for the whole query, and
    asked to plan many micro-batches, from offsets Spark recorded in another run.
    """

    @abstractmethod
    async def plan_end(self, start: SourceCheckpoint, max_records: int | None) -> SourceCheckpoint:
        """The checkpoint after the records available now that follow ``start``.

        At most ``max_records`` records lie between ``start`` and the result (``None``: no
        bound); :func:`share_records` splits it fairly across partitions. Returns ``start``
        itself (equal offsets) when nothing new is available. The result may only name records
        that :meth:`read_range` can return from now on, in any process. Does not move this
        instance.

        The Spark bridge turns its byte budget per micro-batch into ``max_records``: by the
        schema when every column has a fixed width, else by the average size of a sample of
        the first records after ``start`` that it reads once per query with
        :meth:`read_range` (so this instance may also be asked for ranges).

        :raises CheckpointError: when ``start`` is not a checkpoint of this source.
        """

    @abstractmethod
    def read_range(self, partition_range: PartitionRange) -> AsyncIterator[pa.RecordBatch]:
        """The records of ``partition_range``, in order, as batches matching ``schema()``.

        Called on an opened instance that was not restored, possibly in another process, and
        possibly again for the same range (a retried task or a replayed micro-batch): it must
        return the same records each time. It does not move the instance's checkpoint.

        :raises ReadError: when the records are gone (expired, deleted) — never fewer records
            silently.
        """


class DistributedCommitSink(ABC):
    """A sink whose write tasks stage an epoch in parallel and commit it together.

    Offered by :meth:`SinkConnector.as_distributed_commit`. For each epoch the runtime calls
    :meth:`stage` once per write task (on instances opened in the tasks' processes; a failed
    task is retried under another ``task`` name), records the descriptors of the tasks that
    succeeded in the epoch's manifest, then calls :meth:`commit_aggregated` with them on one
    instance. ``rollback_epoch(epoch)`` of the sink must discard everything staged for the
    epoch, by any task.

    Nothing staged may be visible to a reader before :meth:`commit_aggregated`, and after it
    exactly the staged output the descriptors name is visible, once.

    The tasks stage *before* the commit runs, so the runtime does not roll the epoch it is
    about to commit back: :meth:`commit_aggregated` alone discards the staging of failed
    attempts and crashed runs. When Spark re-runs a micro-batch whose epoch is committed
    already, its tasks stage it again and the runtime skips the commit; a sink may save that
    work by staging nothing for an epoch it knows is committed.
    """

    @abstractmethod
    async def stage(self, epoch: int, task: str, batches: AsyncIterable[pa.RecordBatch]) -> str:
        """Write ``batches`` as task ``task``'s share of ``epoch``, durably and invisibly.

        ``task`` is unique per attempt, across restarts of the pipeline: staged output of an
        attempt that failed, or of a run that crashed, must never be mistaken for another's.
        Returns the commit descriptor: short text naming what was staged (e.g. a JSON list
        of file names) — it is kept in the checkpoint manifest, so keep it small. Nothing is
        lost: every record of ``batches`` is in the staged output when this returns.
        ``batches`` may hold no batch at all (a task of an empty Spark partition): stage
        nothing, and return a descriptor all the same.
        """

    @abstractmethod
    async def commit_aggregated(self, epoch: int, descriptors: Sequence[str]) -> None:
        """Publish the staged output ``descriptors`` name as epoch ``epoch``, atomically.

        Staged output of ``epoch`` that no descriptor names (failed attempts, a crashed run)
        is discarded, never published. Idempotent: committing an epoch that is already
        committed does nothing, so recovery may call it again after a crash inside it.
        """
