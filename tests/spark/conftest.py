"""One shared ``local[2]`` Spark session for every Spark test, and a stand-in task context."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator

import pytest

if importlib.util.find_spec("pyspark") is None:
    # Without the `spark` extra there is nothing here to run.
    collect_ignore_glob = ["*.py"]
else:
    from pathlib import Path

    from live_sources import PARTITIONS, SPOOL_PLUGIN, TICKET_PLUGIN, Appender
    from pyspark import TaskContext
    from pyspark.sql import SparkSession

    from laminar_sdk.spark import build_session

    @pytest.fixture(scope="session")
    def spark() -> Iterator[SparkSession]:
        session = build_session(app_name="laminar-sdk-tests")
        yield session
        session.stop()

    @pytest.fixture
    def in_task() -> Iterator[Callable[..., TaskContext]]:
        """Make this process look like a Spark task of a streaming micro-batch, for a while.

        Call it with the micro-batch's id and the task's partition (and attempt number).
        """

        def enter(batch_id: int, partition: int, attempt: int = 0) -> TaskContext:
            TaskContext._setTaskContext(None)
            properties = {"streaming.sql.batchId": str(batch_id), "sql.streaming.queryId": "q-1"}
            return TaskContext(
                partitionId=partition, attemptNumber=attempt, localProperties=properties
            )

        yield enter
        TaskContext._setTaskContext(None)

    def installed(install_distribution, name: str, module: Path) -> str:
        """Install plugin ``name`` from ``module`` as pip would; the directory, for Spark."""
        site = install_distribution(
            f"laminar-plugin-{name}",
            modules={module.stem: module.read_text()},
            plugins={name: module.stem},
        )
        return str(site)

    @pytest.fixture
    def spool_site(install_distribution) -> str:
        """Where the ``spool`` plugin is installed, for a Spark child's ``python_path``."""
        return installed(install_distribution, "spool", SPOOL_PLUGIN)

    @pytest.fixture
    def ticket_site(install_distribution) -> str:
        """Where the ``ticket`` plugin is installed, for a Spark child's ``python_path``."""
        return installed(install_distribution, "ticket", TICKET_PLUGIN)

    @pytest.fixture
    def appender(tmp_path: Path) -> Iterator[Appender]:
        """Appends to ``tmp_path/spool`` (20 records per partition at once) until the test ends."""
        spool = tmp_path / "spool"
        spool.mkdir()
        running = Appender(spool, PARTITIONS)
        running.add(20)
        running.start()
        yield running
        running.stop()
