"""The PostgreSQL test service: provider selection, and a real cluster from the OS's binaries."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psycopg
import pytest
from laminar_conformance.services import (
    POSTGRES_DSN_VARIABLE,
    POSTGRES_PASSWORD_FILE_VARIABLE,
    LocalPostgres,
    PostgresService,
    ServiceError,
    ServiceProvider,
    choose_postgres_provider,
    find_postgres_binaries,
    postgres_service,
)
from laminar_conformance.services import _postgres as postgres_module

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the local launcher runs Linux's PostgreSQL packages"
)


def no_docker() -> bool:
    return False


def docker() -> bool:
    return True


def test_an_existing_server_named_in_the_environment_wins():
    environ = {POSTGRES_DSN_VARIABLE: "host=db port=5432 dbname=app user=loader"}
    assert choose_postgres_provider(environ, docker) is ServiceProvider.EXTERNAL
    assert choose_postgres_provider(environ, no_docker) is ServiceProvider.EXTERNAL


def test_a_container_when_a_docker_engine_answers_else_the_local_launcher():
    assert choose_postgres_provider({}, docker) is ServiceProvider.CONTAINER
    assert choose_postgres_provider({POSTGRES_DSN_VARIABLE: " "}, docker) is (
        ServiceProvider.CONTAINER
    )
    assert choose_postgres_provider({}, no_docker) is ServiceProvider.LOCAL


def test_an_existing_server_comes_with_its_password_file(tmp_path):
    password_file = tmp_path / "password"
    environ = {
        POSTGRES_DSN_VARIABLE: "host=db dbname=app user=loader",
        POSTGRES_PASSWORD_FILE_VARIABLE: str(password_file),
    }
    with postgres_service(environ) as service:
        assert service.provider is ServiceProvider.EXTERNAL
        assert service.dsn == "host=db dbname=app user=loader"
        assert service.password_file == password_file
        with pytest.raises(ServiceError, match="only a server the local launcher started"):
            service.restart()


@pytest.mark.parametrize(
    "dsn", ["host=db password=hunter2 user=x", "postgresql://loader:hunter2@db/app"]
)
def test_a_password_in_the_dsn_variable_is_refused_without_being_shown(dsn):
    with pytest.raises(ServiceError) as caught, postgres_service({POSTGRES_DSN_VARIABLE: dsn}):
        pass
    assert "PGPASSWORD" in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_missing_server_binaries_are_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(postgres_module, "_DEBIAN_BINARIES", tmp_path / "none")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServiceError, match="apt-get install postgresql"):
        find_postgres_binaries()


@pytest.mark.slow
def test_a_local_cluster_runs_logical_and_two_phase_and_never_shows_its_password(capfd):
    with postgres_service({}) as service:
        assert service.provider is ServiceProvider.LOCAL
        assert service.password_file is not None
        password = service.password_file.read_text().strip()
        assert len(password) >= 20
        assert oct(service.password_file.stat().st_mode & 0o777) == "0o600"
        with psycopg.connect(service.dsn, password=password, autocommit=True) as connection:
            settings = dict(
                connection.execute(
                    "SELECT name, setting FROM pg_settings WHERE name IN ('wal_level', "
                    "'max_prepared_transactions', 'listen_addresses', 'password_encryption')"
                ).fetchall()
            )
            running_as = connection.execute(
                "SELECT usename FROM pg_stat_activity WHERE pid = pg_backend_pid()"
            ).fetchone()
            (stored,) = connection.execute(
                "SELECT rolpassword FROM pg_authid WHERE rolname = current_user"
            ).fetchone()
        assert settings["wal_level"] == "logical"
        assert int(settings["max_prepared_transactions"]) > 0
        assert settings["listen_addresses"] == "127.0.0.1"
        assert running_as == ("laminar",)
        # hashed with the launcher's few rounds, and checked: a wrong password is refused
        assert stored.startswith(f"SCRAM-SHA-256${postgres_module.SCRAM_ITERATIONS}:")
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(service.dsn, password="wrong").close()
        shown = [service.dsn, repr(service), repr(service.local), str(service)]
        log = service.local.log_path.read_text()
    captured = capfd.readouterr()
    for text in [*shown, log, captured.out, captured.err]:
        assert password not in text


@pytest.mark.slow
def test_the_server_is_stopped_at_once_and_restarted_with_its_committed_data():
    with LocalPostgres() as cluster:
        service = PostgresService(
            cluster.dsn, ServiceProvider.LOCAL, cluster.password_file, cluster
        )
        password = cluster.password_file.read_text().strip()
        with psycopg.connect(cluster.dsn, password=password, autocommit=True) as connection:
            connection.execute("CREATE TABLE kept (id int)")
            connection.execute("INSERT INTO kept VALUES (1), (2)")
        service.stop(immediate=True)
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(cluster.dsn, password=password, connect_timeout=2).close()
        service.start()
        with psycopg.connect(cluster.dsn, password=password) as connection:
            assert connection.execute("SELECT count(*) FROM kept").fetchone() == (2,)
        assert "database system was interrupted" in cluster.log_path.read_text()


@pytest.mark.slow
def test_the_server_dies_with_the_process_that_started_it_even_on_sigkill(tmp_path):
    script = textwrap.dedent(
        """
        import sys, time
        from laminar_conformance.services import LocalPostgres
        cluster = LocalPostgres()
        cluster.start()
        print(cluster.data_directory, flush=True)
        time.sleep(600)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        data_directory = Path(child.stdout.readline().strip())
        pid = int((data_directory / "postmaster.pid").read_text().splitlines()[0])
        os.kill(pid, 0)  # the server runs
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"the server (pid {pid}) outlived the process that started it")
