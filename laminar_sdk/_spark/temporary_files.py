"""Where a child process that starts Spark keeps its temporary files.

Imports nothing of ``pyspark``: the conformance kit and ``laminar demo`` use it in the process
that starts the child.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

TEMPORARY_FILES_OPTION = "-Djava.io.tmpdir"
"""The JVM option naming the directory where a Spark driver keeps its temporary files."""


def spark_temporary_files_in(
    directory: Path, environment: Mapping[str, str] | None = None
) -> dict[str, str]:
    """An environment for a child process starting Spark: its temporary files in ``directory``.

    It is ``environment`` (``os.environ`` by default) and two variables. A Spark driver keeps
    files in the JVM's temporary directory, ``/tmp`` whatever ``TMPDIR`` says: its local
    directories (``spark-*``, ``blockmgr-*``), ``artifacts-*``, and native libraries it
    unpacks (``liblz4-java-*.so``). Only its shutdown removes them, so a driver killed at a
    crash point leaves them all behind. ``TMPDIR`` points Python's temporary files there (the
    Spark bridge's hand-off files among them), and ``SPARK_SUBMIT_OPTS`` (the options
    ``spark-submit`` gives the driver's JVM, which is how PySpark starts it) gains the JVM's
    temporary directory. Remove ``directory`` once the child is gone.
    """
    child = dict(os.environ if environment is None else environment)
    quoted = str(directory).replace("\\", "\\\\").replace('"', '\\"')
    inherited = child.get("SPARK_SUBMIT_OPTS", "").strip()
    option = f'{TEMPORARY_FILES_OPTION}="{quoted}"'  # the last one wins over the caller's
    child["SPARK_SUBMIT_OPTS"] = f"{inherited} {option}".strip()
    child["TMPDIR"] = str(directory)
    return child
