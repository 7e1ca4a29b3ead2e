"""The same pipeline file on a Spark standalone cluster: a local master and worker, exactly once.

The master and the worker are started with ``java`` from pyspark's own jars, on loopback and
free ports; ``laminar run PIPELINE.toml`` then runs with only ``master = "spark://..."`` set.
Every process the cluster started is killed afterwards — also when the test fails, and when
the test run itself is killed (they die with it).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from laminar_conformance.services import die_with_parent
from laminar_conformance.services._kafka import _free_port

from laminar_sdk.reference import MemorySink

# Every other Spark test runs on local[2]; a cluster of its own is a nightly check.
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.full]

PYSPARK_HOME = Path(pyspark.__file__).parent
START_TIMEOUT_S = 180

PIPELINE = """
[source]
connector = "generator"
rows = 60
partitions = 2

[sink]
connector = "memory"
path = "out"

[pipeline]
delivery = "exactly-once"
checkpoint_location = "state"
max_records_per_batch = 50
trigger = "available-now"
master = "{master}"
"""


def scala_version() -> str:
    """The Scala version of pyspark's jars (the launcher asks for it outside a Spark build)."""
    for jar in (PYSPARK_HOME / "jars").glob("spark-core_*.jar"):
        found = re.match(r"spark-core_(\d+\.\d+)-", jar.name)
        if found:
            return found[1]
    raise AssertionError(f"no spark-core jar in {PYSPARK_HOME / 'jars'}")


@contextlib.contextmanager
def spark_daemon(name: str, arguments: list[str], log: Path, ready: str) -> Iterator[int]:
    """A master or worker JVM until the block ends; yields its process group.

    ``ready`` is the log line that says it started. The JVM keeps its temporary files in
    ``NAME.tmp`` beside ``log``: it is SIGKILLed, so none of its shutdown hooks would remove
    them from ``/tmp``.
    """
    java = shutil.which("java")
    assert java is not None, "java is not on PATH"
    temporary = log.with_suffix(".tmp")
    temporary.mkdir()
    environment = {
        **os.environ,
        "SPARK_HOME": str(PYSPARK_HOME),
        "SPARK_SCALA_VERSION": scala_version(),
    }
    classpath = f"{PYSPARK_HOME / 'conf'}{os.pathsep}{PYSPARK_HOME / 'jars'}/*"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [
                java,
                "-Xmx512m",
                f"-Djava.io.tmpdir={temporary}",
                "-cp",
                classpath,
                f"org.apache.spark.deploy.{name}",
                *arguments,
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,  # one group: the worker's executors and their Python too
            preexec_fn=die_with_parent,  # noqa: PLW1509 - only prctl
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while ready not in log.read_text(errors="replace"):
            assert process.poll() is None, f"{name} exited:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"{name} did not start:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        yield process.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def standalone_cluster(directory: Path, groups: list[int]) -> Iterator[str]:
    """A master and one worker (2 cores) on loopback; yields the master's URL.

    The process groups of the two are appended to ``groups``.
    """
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    master = ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(_free_port())]
    worker = [
        url,
        "--host", "127.0.0.1",
        "--cores", "2",
        "--memory", "1g",
        "--webui-port", str(_free_port()),
        "--work-dir", str(directory / "work"),
    ]  # fmt: skip
    registered = "Successfully registered with master"
    with (
        spark_daemon("master.Master", master, directory / "master.log", f"at {url}") as first,
        spark_daemon("worker.Worker", worker, directory / "worker.log", registered) as second,
    ):
        groups += [first, second]
        yield url


def processes_in(groups: list[int]) -> list[str]:
    """The processes still alive in ``groups``, with their command lines.

    A zombie is dead (only its exit status waits to be collected) and is not counted.
    """
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The state and the process group are the 1st and 3rd fields after the
            # parenthesised command name.
            state, _, group = (proc / "stat").read_text().rpartition(")")[2].split()[:3]
            if int(group) in groups and state != "Z":
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                found.append(f"{proc.name}: {command[:160]}")
    return found


def test_a_pipeline_file_runs_exactly_once_on_a_standalone_cluster(tmp_path):
    pipeline = tmp_path / "pipeline.toml"
    groups: list[int] = []
    with standalone_cluster(tmp_path, groups) as master:
        pipeline.write_text(PIPELINE.format(master=master))
        result = subprocess.run(
            [sys.executable, "-m", "laminar_sdk", "run", str(pipeline)],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        executors = list((tmp_path / "work").glob("app-*/*/stderr"))
        assert executors, "the micro-batches did not run on the cluster's executors"
    assert len(groups) == 2
    # SIGKILL is asynchronous: a killed process stays in /proc while the kernel tears it down.
    deadline = time.monotonic() + 15
    while (left := processes_in(groups)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], "processes of the cluster were left running"
    epochs = [line for line in result.stdout.splitlines() if line.strip().startswith("epoch ")]
    assert len(epochs) == 3, result.stdout
    assert sorted(MemorySink.committed_ids(tmp_path / "out")) == list(range(120))
