"""A Spark Connect server on loopback, started from the PySpark installation itself.

``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`` (what
``sbin/start-connect-server.sh`` runs, without its daemon wrapper: ``spark-submit`` execs the
JVM, so the server is one process that dies with whoever started it). Clients connect with
``SparkSession.builder.remote(server.url)``; laminar's data sources, the plugins and their
Python dependencies must be importable by the server's Python workers (its environment's
``PYSPARK_PYTHON``), not only by the client.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from laminar_conformance.services._process import ServiceError, free_port, spawn, stop_process

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def spark_home() -> Path:
    """The Spark installation of the ``pyspark`` package this Python imports."""
    from pyspark.find_spark_home import _find_spark_home  # noqa: PLC0415 - pyspark optional

    return Path(_find_spark_home())


class LocalSparkConnect:
    """A Spark Connect server on a free loopback port, its driver on ``master``.

    :param log: where the server's output goes.
    :param master: the master of the server's driver.
    :param conf: Spark settings of the server (``spark.driver.extraJavaOptions``...).
    :param environ: the server's environment (default: this process's); its Python workers
        run ``PYSPARK_PYTHON`` from it.
    :param start_timeout_s: how long :meth:`start` waits for the server to accept clients.
    """

    def __init__(
        self,
        log: Path,
        *,
        master: str = "local[2]",
        conf: Mapping[str, str] | None = None,
        environ: Mapping[str, str] | None = None,
        start_timeout_s: float = 180.0,
    ) -> None:
        self._log = log
        self._master = master
        self._conf = dict(conf or {})
        self._environ = dict(os.environ if environ is None else environ)
        self._timeout_s = start_timeout_s
        self._port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``sc://127.0.0.1:PORT``, for ``SparkSession.builder.remote``."""
        return f"sc://127.0.0.1:{self._port}"

    def start(self) -> str:
        """Start the server and wait until it accepts clients; return :attr:`url`.

        :raises ServiceError: when it exits or does not answer in time, with its log's end.
        """
        settings = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self._port),
            "spark.ui.enabled": "false",
            **self._conf,
        }
        command = [str(spark_home() / "bin" / "spark-submit"), "--class", SERVER_CLASS]
        command += ["--name", "Spark Connect server", "--master", self._master]
        for key, value in settings.items():
            command += ["--conf", f"{key}={value}"]
        with self._log.open("ab") as log:
            self.process = spawn(command, stdout=log, stderr=subprocess.STDOUT, env=self._environ)
        deadline = time.monotonic() + self._timeout_s
        while True:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self._port), timeout=1),
            ):
                return self.url
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop(graceful=False)
                tail = self._log.read_text(errors="replace")[-3000:]
                raise ServiceError(
                    f"the Spark Connect server did not start on 127.0.0.1:{self._port} within "
                    f"{self._timeout_s:g}s; its log ({self._log}) ends:\n{tail}"
                )
            time.sleep(0.2)

    def stop(self, *, graceful: bool = True) -> None:
        """Stop the server: SIGTERM and wait (or SIGKILL at once when not ``graceful``)."""
        process, self.process = self.process, None
        stop_process(process, graceful=graceful)

    def __enter__(self) -> LocalSparkConnect:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
