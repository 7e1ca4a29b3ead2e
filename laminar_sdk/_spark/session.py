"""Building a Spark session whose Python workers run this interpreter."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark import SparkContext
from pyspark.find_spark_home import _find_spark_home
from pyspark.sql import SparkSession

from laminar_sdk._spark.class_archive import driver_archive_option

PYTHON_VARIABLE = "PYSPARK_PYTHON"

DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"

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

    A driver it starts maps an archive of Spark's classes, and starts in about half the CPU
    time. When the archive of this Java and Spark installation does not exist yet, this driver
    starts without it and a training driver writes it in the background (about 30 s of one
    core, once; ``laminar spark-archive`` does it in the foreground).
    ``LAMINAR_SPARK_CLASS_ARCHIVE=off`` turns this off (docs/pipelines.md, "Drivers that start
    in half the time").

    :param master: the Spark master URL, ``local[2]`` by default.
    :param app_name: the application's name.
    :param conf: Spark settings; pass dotted names as ``**{"spark.driver.memory": "2g"}``.
    """
    os.environ.setdefault(PYTHON_VARIABLE, sys.executable)
    settings = DEFAULT_CONF | conf
    if SparkContext._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        java_options = settings.get(DRIVER_JAVA_OPTIONS, "")
        callers = f"{java_options} {os.environ.get('SPARK_SUBMIT_OPTS', '')}"
        archive = driver_archive_option(Path(_find_spark_home()), callers)
        if archive is not None:
            settings[DRIVER_JAVA_OPTIONS] = f"{java_options} {archive}".strip()
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
