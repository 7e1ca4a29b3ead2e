"""Laminar pipelines run from a Spark Connect client, against a server started from the wheel.

The server (``LocalSparkConnect``: ``spark-submit`` of ``SparkConnectServer``, as
``sbin/start-connect-server.sh`` runs it) runs the pipeline's driver; its Python workers run
laminar and the plugins, which must be installed where the server's ``PYSPARK_PYTHON`` imports
from. The client only needs PySpark's ``connect`` extra (pandas, grpcio): it never imports
laminar. A virtual environment with that extra is made once for the module (nightly).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from laminar_conformance.services import LocalSparkConnect

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.full]

ROOT = Path(__file__).parents[2]
ROWS = 2000
CLIENT = f"""\
import sys
from pyspark.sql import SparkSession

url, path, checkpoint = sys.argv[1:]
spark = SparkSession.builder.remote(url).getOrCreate()
query = (
    spark.readStream.format("laminar")
    .option("connector", "generator")
    .option("rows", "{ROWS}")
    .option("laminar.max.records.per.batch", "500")
    .load()
    .writeStream.format("laminar")
    .option("connector", "files")
    .option("path", path)
    .option("format", "jsonl")
    .option("checkpointLocation", checkpoint)
    .trigger(availableNow=True)
    .start()
)
query.awaitTermination()
"""


@pytest.fixture(scope="module")
def connect_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python with PySpark's connect extra, this checkout, the kit and the files plugin."""
    environment = tmp_path_factory.mktemp("connect") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(environment)], check=True)
    python = environment / "bin" / "python"
    pyspark = f"pyspark[connect]=={importlib.metadata.version('pyspark')}"
    checkouts = [ROOT, ROOT / "conformance", ROOT / "plugins" / "files"]
    editable = [argument for path in checkouts for argument in ("-e", str(path))]
    install = [str(python), "-m", "pip", "install", "--quiet", pyspark, *editable]
    subprocess.run(install, check=True)
    return python


def _run_client(python: Path, script: Path, server: LocalSparkConnect, *paths: Path) -> int:
    """Run the client until it ends, or until its server died (it would retry for minutes)."""
    client = subprocess.Popen(
        [str(python), str(script), server.url, *map(str, paths)], start_new_session=True
    )
    deadline = time.monotonic() + 600
    while client.poll() is None:
        assert server.process is not None
        if server.process.poll() is not None or time.monotonic() > deadline:
            os.killpg(client.pid, signal.SIGKILL)
        time.sleep(0.5)
    return client.wait()


def test_a_pipeline_from_a_connect_client_whose_server_is_killed_restarts_exactly_once(
    tmp_path, connect_python
):
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    workers = {**os.environ, "PYSPARK_PYTHON": str(connect_python)}
    # The server's driver dies with its Python worker at the commit of micro-batch 1.
    killed = {**workers, "LAMINAR_SPARK_CRASH_AT": "commit:1"}
    with LocalSparkConnect(tmp_path / "server-1.log", environ=killed) as server:
        assert _run_client(connect_python, script, server, out, checkpoint) != 0
        assert server.process is not None
        assert server.process.wait(timeout=60) == -signal.SIGKILL, "the crash point killed it"
    with LocalSparkConnect(tmp_path / "server-2.log", environ=workers) as server:
        assert _run_client(connect_python, script, server, out, checkpoint) == 0

    ids = Counter(
        json.loads(line)["id"]
        for published in out.glob("epoch=*/*.jsonl")
        for line in published.read_text().splitlines()
    )
    assert sorted(ids) == list(range(ROWS)), "lost ids"
    assert max(ids.values()) == 1, [record for record, count in ids.items() if count > 1]


def test_the_kit_runs_its_spark_layer_from_connect_clients(tmp_path, connect_python):
    check = "test_spark_pipeline_killed_at_crash_points_restarts_without_loss"
    result = subprocess.run(
        [
            sys.executable, "-m", "laminar_conformance", "run", "files", "--role", "sink",
            "--seed", "1", "--spark-python", str(connect_python), "--spark-connect",
            "--reruns", "0", "--check", check,
        ],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    pyspark = importlib.metadata.version("pyspark")
    assert f"on a local Spark Connect server (PySpark {pyspark} of {connect_python})" in (
        result.stdout
    )
