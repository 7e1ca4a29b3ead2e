"""What the sink keeps in the database: table columns, markers, prepared transactions.

Committed epochs are recorded in the *marker table* (``marker.table``, default
``laminar_sink_epochs``, in the written table's schema), one row per ``(sink_id, partition)``:

- ``partition = '*'``: the newest epoch the sink committed whole. ``append`` mode upserts it in
  the transaction that copies the epoch's rows, so the rows and the marker commit together.
- ``partition = <gid>``: in ``two-phase`` mode, every prepared transaction inserts a row of its
  own, named by its transaction id, so that a committed prepared transaction can be told from
  one rolled back after it left ``pg_prepared_xacts``. Once every transaction of an epoch is
  committed, the epoch's ``*`` row is upserted and those rows are deleted.

A transaction id (``gid``) is ``laminar:<sink_id>:<epoch>:<suffix>``: recovery finds a sink's
orphans in ``pg_prepared_xacts`` by it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from psycopg import sql

from laminar_plugin_postgres._client import Session, qualified
from laminar_plugin_postgres._config import TableName
from laminar_plugin_postgres._values import CATALOG_QUERY, Column, columns_from_rows

WHOLE_EPOCH = "*"
"""The marker row's ``partition`` for an epoch committed whole."""


async def table_columns(session: Session, table: TableName) -> list[Column] | None:
    """The columns of ``table``; ``None`` when it does not exist."""
    rows = await session.execute(CATALOG_QUERY, (table.schema, table.name))
    return columns_from_rows(rows) or None


async def has_unique_key(session: Session, table: TableName, key: tuple[str, ...]) -> bool:
    """Whether ``table`` has a primary key or unique index on exactly the columns ``key``."""
    rows = await session.execute(
        """
        SELECT array_agg(a.attname::text ORDER BY a.attname)
        FROM pg_index i
        JOIN pg_class c ON c.oid = i.indrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY(i.indkey)
        WHERE n.nspname = %s AND c.relname = %s AND i.indisunique AND i.indpred IS NULL
        GROUP BY i.indexrelid
        """,
        (table.schema, table.name),
    )
    wanted = sorted(key)
    return any(sorted(row[0]) == wanted for row in rows)


@dataclass(frozen=True, slots=True)
class Markers:
    """The marker table, and one sink's rows in it.

    :param table: the marker table.
    :param sink_id: the sink whose rows these are.
    """

    table: TableName
    sink_id: str

    async def create(self, session: Session) -> None:
        """Create the marker table when it is missing (concurrent creators tolerated)."""
        found = await session.execute(
            "SELECT to_regclass(%s) IS NOT NULL",
            (str(qualified(self.table).as_string(session.connection)),),
        )
        if found[0][0]:
            return
        statement = sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (sink_id text NOT NULL, partition text NOT NULL, "
            "epoch bigint NOT NULL, updated_at timestamptz NOT NULL DEFAULT now(), "
            "PRIMARY KEY (sink_id, partition))"
        ).format(qualified(self.table))
        # Two sinks creating it at once: one of them fails on the catalog's unique index.
        lock = sql.SQL("SELECT pg_advisory_xact_lock(hashtext({}))").format(
            sql.Literal(str(self.table))
        )
        await session.execute("BEGIN")
        try:
            await session.execute(lock)
            await session.execute(statement)
        except BaseException:
            await session.execute("ROLLBACK")
            raise
        await session.execute("COMMIT")

    async def last_committed(self, session: Session) -> int:
        """The newest epoch this sink committed (whole or in part); ``-1`` when none."""
        rows = await session.execute(
            sql.SQL("SELECT coalesce(max(epoch), -1) FROM {} WHERE sink_id = %s").format(
                qualified(self.table)
            ),
            (self.sink_id,),
        )
        return int(rows[0][0])

    async def whole_epoch(self, session: Session) -> int:
        """The newest epoch recorded whole (every transaction of it committed); ``-1``: none."""
        rows = await session.execute(
            sql.SQL(
                "SELECT coalesce(max(epoch), -1) FROM {} WHERE sink_id = %s AND partition = %s"
            ).format(qualified(self.table)),
            (self.sink_id, WHOLE_EPOCH),
        )
        return int(rows[0][0])

    @contextlib.asynccontextmanager
    async def sole_committer(self, session: Session) -> AsyncIterator[None]:
        """Hold this sink's commit lock (a session-level advisory lock) meanwhile.

        Two instances committing the sink's prepared transactions — the runtime's, and an old
        one presumed dead that goes on — take turns: the second finds the epoch recorded
        whole. The server releases the lock if the session dies.
        """
        key = sql.Literal(f"laminar-commit:{self.table}:{self.sink_id}")
        await session.execute(sql.SQL("SELECT pg_advisory_lock(hashtext({}))").format(key))
        try:
            yield
        finally:
            await session.execute(sql.SQL("SELECT pg_advisory_unlock(hashtext({}))").format(key))

    async def record_whole(self, session: Session, epoch: int) -> bool:
        """Upsert this sink's ``*`` row to ``epoch`` unless it says ``epoch`` or later already.

        In the caller's transaction: the row stays locked until it ends, so two instances
        committing the same epoch at once cannot both succeed.

        :returns: whether the row was moved to ``epoch`` (``False``: committed before).
        """
        rows = await session.execute(
            sql.SQL(
                "INSERT INTO {table} AS m (sink_id, partition, epoch) VALUES (%s, %s, %s) "
                "ON CONFLICT (sink_id, partition) DO UPDATE SET epoch = EXCLUDED.epoch, "
                "updated_at = now() WHERE m.epoch < EXCLUDED.epoch RETURNING m.epoch"
            ).format(table=qualified(self.table)),
            (self.sink_id, WHOLE_EPOCH, epoch),
        )
        return bool(rows)

    async def record_prepared(self, session: Session, gid: str, epoch: int) -> None:
        """Insert the row of prepared transaction ``gid`` (in that transaction)."""
        await session.execute(
            sql.SQL("INSERT INTO {} (sink_id, partition, epoch) VALUES (%s, %s, %s)").format(
                qualified(self.table)
            ),
            (self.sink_id, gid, epoch),
        )

    async def committed_transactions(self, session: Session, gids: list[str]) -> set[str]:
        """Which of ``gids`` committed (their rows are visible)."""
        rows = await session.execute(
            sql.SQL("SELECT partition FROM {} WHERE sink_id = %s AND partition = ANY(%s)").format(
                qualified(self.table)
            ),
            (self.sink_id, gids),
        )
        return {str(row[0]) for row in rows}

    async def finish_prepared_epoch(self, session: Session, epoch: int) -> None:
        """Record ``epoch`` whole and forget the rows of its (and older) transactions."""
        await session.execute("BEGIN")
        try:
            await self.record_whole(session, epoch)
            await session.execute(
                sql.SQL(
                    "DELETE FROM {} WHERE sink_id = %s AND partition <> %s AND epoch <= %s"
                ).format(qualified(self.table)),
                (self.sink_id, WHOLE_EPOCH, epoch),
            )
        except BaseException:
            await session.execute("ROLLBACK")
            raise
        await session.execute("COMMIT")


def gid_prefix(sink_id: str) -> str:
    """The start of every transaction id of ``sink_id``: ``laminar:<sink_id>:``."""
    return f"laminar:{sink_id}:"


def make_gid(sink_id: str, epoch: int, suffix: str) -> str:
    """The transaction id of one prepared transaction of ``epoch``."""
    return f"{gid_prefix(sink_id)}{epoch}:{suffix}"


def gid_epoch(gid: str, sink_id: str) -> int | None:
    """The epoch a transaction id of ``sink_id`` names; ``None`` for another sink's."""
    prefix = gid_prefix(sink_id)
    if not gid.startswith(prefix):
        return None
    epoch, _, _ = gid[len(prefix) :].partition(":")
    return int(epoch) if epoch.isdigit() else None


async def prepared_transactions(session: Session, sink_id: str) -> dict[str, int]:
    """This sink's prepared transactions in this database: gid → epoch."""
    prefix = gid_prefix(sink_id)
    rows = await session.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
        "AND left(gid, length(%s)) = %s",
        (prefix, prefix),
    )
    found: dict[str, int] = {}
    for (gid,) in rows:
        epoch = gid_epoch(str(gid), sink_id)
        if epoch is not None:
            found[str(gid)] = epoch
    return found


async def stale_prepared_transactions(
    session: Session, sink_id: str, older_than_s: float
) -> list[str]:
    """This sink's prepared transactions prepared over ``older_than_s`` seconds ago."""
    prefix = gid_prefix(sink_id)
    rows = await session.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
        "AND left(gid, length(%s)) = %s AND prepared < now() - make_interval(secs => %s) "
        "ORDER BY prepared",
        (prefix, prefix, older_than_s),
    )
    return [str(gid) for (gid,) in rows]


async def finish_prepared(session: Session, gid: str, *, commit: bool) -> None:
    """``COMMIT PREPARED`` or ``ROLLBACK PREPARED`` ``gid`` (outside any transaction)."""
    verb = "COMMIT PREPARED {}" if commit else "ROLLBACK PREPARED {}"
    await session.execute(sql.SQL(verb).format(sql.Literal(gid)))
