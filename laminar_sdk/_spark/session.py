"""Building a Spark session whose Python workers run this interpreter."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

PYTHON_VARIABLE = "PYSPARK_PYTHON"

DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
}
"""Settings :func:`build_session` applies unless ``conf`` overrides them."""


def build_session(master: str = "local[2]", app_name: str = "laminar", **conf: str) -> SparkSession:
    """A Spark session (the active one if it exists) whose Python workers run this interpreter.

    Sets ``PYSPARK_PYTHON`` to ``sys.executable`` when it is unset: without it Spark starts
    its Python workers with the system ``python``, which cannot import the SDK or the plugins.
    The web UI is off and shuffles use few partitions (:data:`DEFAULT_CONF`).

    :param master: the Spark master URL, ``local[2]`` by default.
    :param app_name: the application's name.
    :param conf: Spark settings; pass dotted names as ``**{"spark.driver.memory": "2g"}``.
    """
    os.environ.setdefault(PYTHON_VARIABLE, sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in (DEFAULT_CONF | conf).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
