"""Fixtures of the PostgreSQL plugin's tests: one real server per session, fresh tables per test."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from laminar_conformance.services import (
    POSTGRES_DSN_VARIABLE,
    POSTGRES_PASSWORD_FILE_VARIABLE,
    PostgresService,
    postgres_service,
)
from postgres_testing import Database


@pytest.fixture(scope="session", autouse=True)
def server() -> Iterator[PostgresService]:
    """One server for the session, from the conformance kit's launcher.

    Its address (and password file) go in ``LAMINAR_POSTGRES_DSN`` and
    ``LAMINAR_POSTGRES_PASSWORD_FILE`` too, so that the plugin's conformance contexts, and the
    Spark child processes the kit starts, use this server instead of starting their own.
    """
    with postgres_service() as service:
        saved = {name: os.environ.get(name) for name in _VARIABLES}
        os.environ[POSTGRES_DSN_VARIABLE] = service.dsn
        if service.password_file is not None:
            os.environ[POSTGRES_PASSWORD_FILE_VARIABLE] = str(service.password_file)
        try:
            yield service
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


_VARIABLES = (POSTGRES_DSN_VARIABLE, POSTGRES_PASSWORD_FILE_VARIABLE)


@pytest.fixture
def database(server: PostgresService) -> Iterator[Database]:
    """The server, and fresh tables for this test (dropped afterwards)."""
    handle = Database(server)
    yield handle
    handle.close()
