"""What a downstream received from a source, and the loop that polls until it has all of it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from laminar_sdk import PartitionInfo

T = TypeVar("T")

CALL_TIMEOUT_S = 30.0
"""How long a source call may take (beyond a context's ``poll_timeout_s``) before it fails."""


async def answered(call: Awaitable[T], what: str, timeout_s: float = CALL_TIMEOUT_S) -> T:
    """``await call``, failing when it does not return within ``timeout_s``.

    A call that waits for data instead of returning hangs Spark's planning on every
    micro-batch (and the kit with it, without this bound).

    :param what: the call, as the message names it (``poll_batch(7)``).
    :raises AssertionError: naming ``what`` and what to do.
    """
    try:
        return await asyncio.wait_for(call, timeout_s)
    except TimeoutError:
        raise AssertionError(
            f"{what} did not return within {timeout_s:.0f} s: a source call returns what is "
            "there now (poll_batch: None when nothing is) and never waits for data to arrive; "
            "on Spark, the planning of every micro-batch waits for it"
        ) from None


def read_enough(received: int, expected: int) -> bool:
    """Whether a drain that expected ``expected`` records stops after ``received``.

    A source that keeps returning records it returned before would never run dry: past
    twice what was expected (and some), the drain stops and the comparison names the repeats.
    """
    return received > 2 * expected + 64


@dataclass(slots=True)
class Delivery:
    """What a downstream received, in order, with the partition each record came from."""

    ids: list[int] = field(default_factory=list)
    partitions: list[str | None] = field(default_factory=list)

    def receive(self, ids: list[int], partition: PartitionInfo | None) -> None:
        """Add ``ids``, which came in one batch from ``partition``."""
        self.ids += ids
        self.partitions += [None if partition is None else partition.id] * len(ids)

    def truncate(self, length: int) -> None:
        """Forget everything received after the first ``length`` records."""
        del self.ids[length:]
        del self.partitions[length:]

    def by_partition(self, start: int = 0, stop: int | None = None) -> dict[str, list[int]] | None:
        """The ids received from ``start`` to ``stop``, in order, by partition id.

        ``None`` when a batch carried no :class:`~laminar_sdk.PartitionInfo`.
        """
        if None in self.partitions:
            return None
        grouped: dict[str, list[int]] = {}
        for record, partition in zip(
            self.ids[start:stop], self.partitions[start:stop], strict=True
        ):
            assert partition is not None
            grouped.setdefault(partition, []).append(record)
        return grouped


async def drain(
    poll: Callable[[], Awaitable[bool]], delivery: Delivery, expected: int, wait_s: float
) -> None:
    """Call ``poll`` (``False``: nothing came) until the source has nothing more.

    A source with nothing right now is polled again until ``delivery`` holds ``expected``
    records or ``wait_s`` has passed.
    """
    deadline = time.monotonic() + wait_s
    while not read_enough(len(delivery.ids), expected):
        if await poll():
            continue
        if len(delivery.ids) >= expected or time.monotonic() >= deadline:
            return
        await asyncio.sleep(0.01)
