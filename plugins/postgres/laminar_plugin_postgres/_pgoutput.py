"""A reader of ``pgoutput`` messages (protocol version 1), as logical decoding returns them.

``pg_logical_slot_peek_binary_changes(slot, NULL, n, 'proto_version', '1',
'publication_names', 'pub')`` returns one row per message of PostgreSQL's built-in output
plugin (the one logical replication uses). Only what change data capture needs is kept:
transactions (``Begin`` / ``Commit``), the relations' columns (``Relation``) and the rows
(``Insert``, ``Update``, ``Delete``, ``Truncate``), each value in its text form. The format is
PostgreSQL's "Logical Replication Message Formats".
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

POSTGRES_EPOCH_US = 946_684_800_000_000
"""2000-01-01 in microseconds since 1970-01-01: pgoutput's timestamps count from there."""

UNCHANGED = object()
"""A value that an update did not send (an unchanged TOASTed value)."""


def lsn_text(lsn: int) -> str:
    """An LSN as PostgreSQL writes it (``16/B374D848``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """An LSN written as PostgreSQL does.

    :raises ValueError: for anything else.
    """
    high, separator, low = text.partition("/")
    if not separator:
        raise ValueError(f"not an LSN: {text!r}")
    return (int(high, 16) << 32) | int(low, 16)


@dataclass(frozen=True, slots=True)
class Relation:
    """A relation's columns as the stream describes them.

    :param oid: the relation's id in the stream's messages.
    :param schema: its schema.
    :param name: its name.
    :param columns: the column names, in order.
    :param key: which columns are part of the replica identity.
    """

    oid: int
    schema: str
    name: str
    columns: tuple[str, ...]
    key: tuple[bool, ...]


Tuple = list[str | object | None]
"""A row's values in text form; ``None`` is SQL NULL, :data:`UNCHANGED` a value not sent."""


@dataclass(slots=True)
class Change:
    """One row change of one relation.

    :param op: ``insert``, ``update``, ``delete`` or ``truncate``.
    :param relation: the relation's oid.
    :param old: the old row (``delete``, ``update`` with replica identity), in full (``O``) or
        its key columns only (``K``, others ``None``); ``None`` when not sent.
    :param old_is_key: whether ``old`` holds the key columns only.
    :param new: the new row (``insert``, ``update``).
    """

    op: str
    relation: int
    old: Tuple | None = None
    old_is_key: bool = False
    new: Tuple | None = None


@dataclass(slots=True)
class Transaction:
    """A committed transaction and its changes, in order.

    :param xid: the transaction id.
    :param commit_lsn: the LSN of its commit record.
    :param end_lsn: the LSN just after it: decoding resumes past it from here.
    :param commit_time_us: the commit time, microseconds since 1970-01-01 UTC.
    """

    xid: int
    commit_lsn: int = 0
    end_lsn: int = 0
    commit_time_us: int = 0
    changes: list[Change] = field(default_factory=list)


class ProtocolError(ValueError):
    """A message that is not pgoutput protocol version 1."""


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.position = 0

    def take(self, form: str) -> int:
        (value,) = struct.unpack_from(form, self.data, self.position)
        self.position += struct.calcsize(form)
        return int(value)

    def byte(self) -> str:
        value = chr(self.data[self.position])
        self.position += 1
        return value

    def string(self) -> str:
        end = self.data.index(b"\0", self.position)
        text = self.data[self.position : end].decode()
        self.position = end + 1
        return text

    def tuple_data(self) -> Tuple:
        values: Tuple = []
        for _ in range(self.take("!h")):
            kind = self.byte()
            if kind == "n":
                values.append(None)
            elif kind == "u":
                values.append(UNCHANGED)
            elif kind == "t":
                length = self.take("!i")
                values.append(self.data[self.position : self.position + length].decode())
                self.position += length
            else:
                raise ProtocolError(f"unknown tuple value kind {kind!r}")
        return values


class Decoder:
    """Turns the stream's messages into transactions, keeping the relations it was told of."""

    def __init__(self) -> None:
        self.relations: dict[int, Relation] = {}
        self._open: Transaction | None = None

    def feed(self, message: bytes) -> Transaction | None:
        """Read one message; return the transaction it completes (at ``Commit``), if any.

        :raises ProtocolError: for a message of another protocol.
        """
        cursor = _Cursor(message)
        kind = cursor.byte()
        if kind == "B":
            cursor.take("!q")  # final LSN, also in Commit
            cursor.take("!q")  # commit time, also in Commit
            self._open = Transaction(cursor.take("!I"))
            return None
        if kind == "C":
            transaction = self._require_open(kind)
            cursor.byte()  # flags (none defined)
            transaction.commit_lsn = cursor.take("!q")
            transaction.end_lsn = cursor.take("!q")
            transaction.commit_time_us = cursor.take("!q") + POSTGRES_EPOCH_US
            self._open = None
            return transaction
        if kind == "R":
            self._relation(cursor)
        elif kind in "IUD":
            self._require_open(kind).changes.append(self._change(kind, cursor))
        elif kind == "T":
            transaction = self._require_open(kind)
            count = cursor.take("!i")
            cursor.byte()  # options (CASCADE, RESTART IDENTITY)
            for _ in range(count):
                transaction.changes.append(Change("truncate", cursor.take("!I")))
        elif kind not in "OYM":  # origins, types and messages carry nothing needed here
            raise ProtocolError(f"unknown pgoutput message {kind!r}")
        return None

    def _require_open(self, kind: str) -> Transaction:
        if self._open is None:
            raise ProtocolError(f"pgoutput message {kind!r} outside a transaction")
        return self._open

    def _relation(self, cursor: _Cursor) -> None:
        oid = cursor.take("!I")
        schema, name = cursor.string(), cursor.string()
        cursor.byte()  # replica identity setting
        columns: list[str] = []
        key: list[bool] = []
        for _ in range(cursor.take("!h")):
            flags = cursor.take("!b")
            columns.append(cursor.string())
            cursor.take("!I")  # type oid
            cursor.take("!i")  # type modifier
            key.append(bool(flags & 1))
        self.relations[oid] = Relation(oid, schema, name, tuple(columns), tuple(key))

    def _change(self, kind: str, cursor: _Cursor) -> Change:
        relation = cursor.take("!I")
        if kind == "I":
            cursor.byte()  # 'N'
            return Change("insert", relation, new=cursor.tuple_data())
        marker = cursor.byte()
        if kind == "D":
            return Change("delete", relation, old=cursor.tuple_data(), old_is_key=marker == "K")
        old: Tuple | None = None
        if marker in "KO":
            old = cursor.tuple_data()
            cursor.byte()  # 'N'
        return Change(
            "update", relation, old=old, old_is_key=marker == "K", new=cursor.tuple_data()
        )
