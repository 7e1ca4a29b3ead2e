"""Durable bytes a connector keeps for itself, in the runtime's checkpoint location.

Some connectors must keep something across a crash of the process that runs them: the Kafka
sink keeps each pre-committed epoch, because another instance must commit it after a restart
and a Kafka transaction cannot be resumed. Where to keep it is the runtime's business, not the
user's: the runtime's checkpoint location already outlives any process, on a file system or an
object store, and on a cluster the instance that needs the bytes may run on another machine.
So the runtime hands a connector a :class:`StateStore` of its own through
:attr:`ConnectorConfig.state_store`.
"""

from __future__ import annotations

import asyncio
import io
import re
from abc import ABC, abstractmethod
from typing import BinaryIO

from laminar_sdk._contract.errors import CheckpointError

STATE_DIRECTORY = "state"
"""The directory under a checkpoint location that holds the connectors' state stores."""

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*(/[A-Za-z0-9_][A-Za-z0-9_.\-]*)*")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


class StateStore(ABC):
    """Named blobs one connector keeps durably, where the runtime keeps its checkpoints.

    The runtime passes one to :meth:`SourceConnector.open` / :meth:`SinkConnector.open` in
    :attr:`ConnectorConfig.state_store` when it has a checkpoint location — the Spark bridge
    always has one for a sink: ``laminar.checkpoint.location``, by default under Spark's
    ``checkpointLocation``. What a connector puts here survives a crash of its process and can
    be read by another instance, on any machine that reaches the location. Every instance of
    the same connector name in the same location sees the same store: prefix the names with
    something that tells your instances apart (a topic, a sink id) when several run at once.

    Names are ``/``-separated words of letters, digits, ``.``, ``_`` and ``-``.
    """

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the store is, safe to show (no credentials)."""

    @abstractmethod
    async def put(self, name: str, data: bytes) -> None:
        """Store ``data`` under ``name``, atomically and durably, replacing what was there.

        :raises CheckpointError: when the store cannot write, or ``name`` is not allowed.
        """

    async def put_file(self, name: str, file: BinaryIO) -> None:
        """Store the content of ``file``, from its current position on, under ``name``.

        Atomically and durably, replacing what was there, as :meth:`put` does; for content too
        large to hold in memory (a spool file a connector wrote as it went). The runtime's
        stores stream it: a file system store copies it a chunk at a time, an object store
        uploads it in parts (a multipart upload; one a crash interrupts stays in the bucket,
        invisible, until a lifecycle rule aborts it: give the bucket one). This default reads
        it whole and calls :meth:`put`.

        :raises CheckpointError: when the store cannot write, or ``name`` is not allowed.
        """
        await self.put(name, await asyncio.to_thread(file.read))

    @abstractmethod
    async def get(self, name: str) -> bytes | None:
        """The bytes stored under ``name``, or ``None`` when there are none."""

    async def get_file(self, name: str) -> BinaryIO | None:
        """What is stored under ``name``, as a binary file to read, or ``None`` when nothing is.

        For content too large to hold in memory; close the file when done. The runtime's
        stores stream it: a file system store opens the stored file, an object store
        downloads it a chunk at a time into a temporary file (gone once closed). This default
        reads it whole, with :meth:`get`.
        """
        data = await self.get(name)
        return None if data is None else io.BytesIO(data)

    @abstractmethod
    async def delete(self, name: str) -> None:
        """Remove ``name``; a missing name is not an error."""

    @abstractmethod
    async def names(self, prefix: str = "") -> list[str]:
        """Every stored name that starts with ``prefix``, sorted."""


def validate_state_name(name: str) -> str:
    """Return ``name`` when a :class:`StateStore` takes it, else raise.

    :raises CheckpointError: naming it.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > 500:
        raise CheckpointError(
            f"state name {name!r} is not allowed: use '/'-separated words of letters, digits, "
            "'.', '_' and '-', each starting with a letter, digit or '_'"
        )
    return name


def connector_space(role: str, connector: str) -> str:
    """The space of one connector in a location's state: ``<role>.<name>``, made safe."""
    return f"{role}.{_UNSAFE.sub('_', connector)}"[:200]
