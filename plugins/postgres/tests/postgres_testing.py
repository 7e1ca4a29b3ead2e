"""Helpers of the PostgreSQL plugin's tests: fresh tables, and what readers of them see."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from laminar_conformance.services import PostgresService
from psycopg import sql


class Database:
    """A connection to the test server that drops every table it named when closed."""

    def __init__(self, service: PostgresService) -> None:
        self.service = service
        self.password = (
            None if service.password_file is None else service.password_file.read_text().strip()
        )
        self.connection = self.connect()
        self.tables: list[str] = []

    def connect(self) -> psycopg.Connection[Any]:
        if self.password is None:
            return psycopg.connect(self.service.dsn, autocommit=True)
        return psycopg.connect(self.service.dsn, autocommit=True, password=self.password)

    def properties(self) -> dict[str, str]:
        """The connection keys of a connector's configuration."""
        found = {"dsn": self.service.dsn}
        if self.service.password_file is not None:
            found["password.file"] = str(self.service.password_file)
        return found

    def name(self, prefix: str = "t") -> str:
        """A fresh table name, dropped at the end of the test."""
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        self.tables.append(name)
        return name

    def execute(self, statement: str | sql.Composable, params: Any = None) -> list[Any]:
        with self.connection.cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchall() if cursor.description is not None else []

    def ids(self, table: str, column: str = "id") -> list[int]:
        query = sql.SQL("SELECT {} FROM {} ORDER BY 1").format(
            sql.Identifier(column), sql.Identifier(table)
        )
        return [row[0] for row in self.execute(query)]

    def close(self) -> None:
        for (gid,) in self.execute("SELECT gid FROM pg_prepared_xacts"):
            if any(table in gid for table in self.tables):
                self.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        for (slot,) in self.execute("SELECT slot_name FROM pg_replication_slots WHERE NOT active"):
            if slot in self.tables:
                self.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        for table in self.tables:
            self.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(table)))
        self.connection.close()
