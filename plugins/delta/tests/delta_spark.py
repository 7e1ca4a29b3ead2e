"""Delta Lake's own Spark connector (delta-spark) in a Spark session, to read tables as Spark does.

:func:`read_delta_ids` starts a session with Delta's connector (or takes the one running) and
reads a table's ids: what a Spark user reading the table with Delta's connector sees.

The jars of ``io.delta:delta-spark_<spark>_2.13`` (:data:`DELTA_VERSION`, with
``delta-storage`` and the Delta Kernel jars it depends on) are resolved from Maven Central with
``mvn`` once, into ``delta-spark/`` under the conformance kit's cache directory
(``$LAMINAR_CACHE_DIR``, else ``~/.cache/laminar``); jars PySpark ships already are left out.

Delta builds its connector for each Spark release it supports (4.0, 4.1 and 4.2 for
delta-spark 4.4.0); on a newer Spark (4.3) the newest build is used. Its classic reader fails
there on every table, with ``java.lang.NoSuchMethodError: 'void
org.apache.spark.sql.execution.LogicalRDD.<init>(...)'``: Spark 4.3 added a parameter to
``LogicalRDD``, whose constructor Delta's cache of a table's state calls. So reads go through
the connector's other reader, built on Delta Kernel (``spark.databricks.delta.v2.enableMode=
STRICT``, the table named ``delta.`<path>```), which reads whole tables on 4.2 and 4.3 alike.
A filter on a data column plans that scan with the classic data skipping, which fails as above
on 4.3: read the whole table and filter the rows read, as :func:`read_delta_ids` does. Writing
on 4.3: creating a table and plain appends work; an append with ``txnAppId``/``txnVersion``
(Delta's idempotent write, which looks up the table's transaction versions) fails as above.
"""

from __future__ import annotations

import re
from pathlib import Path

import pyspark
from laminar_conformance.services import resolve_maven_jars
from laminar_sdk.spark import build_session
from pyspark.sql import DataFrame, SparkSession

DELTA_VERSION = "4.4.0"
"""The delta-spark release: the newest whose jars Maven Central serves (4.4.1: PyPI only)."""
DELTA_SPARK_BUILDS = ("4.0", "4.1", "4.2")
"""The Spark releases :data:`DELTA_VERSION` is built for, oldest first."""
SCALA_VERSION = "2.13"

_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
_CATALOG_KEY = "spark.sql.catalog.spark_catalog"
_KERNEL_READER = {"spark.databricks.delta.v2.enableMode": "STRICT"}
_JAR = re.compile(r"(?P<artifact>.+?)-\d[^_]*\.jar")  # artifact-VERSION.jar


def delta_spark_build(spark_version: str = pyspark.__version__) -> str:
    """The Spark release (``major.minor``) whose build of Delta's connector runs on this one.

    The build for ``spark_version`` itself when there is one, else the newest older one.

    :raises RuntimeError: for a Spark older than every build.
    """
    wanted = tuple(int(part) for part in spark_version.split(".")[:2])
    fitting = [b for b in DELTA_SPARK_BUILDS if tuple(map(int, b.split("."))) <= wanted]
    if not fitting:
        raise RuntimeError(
            f"delta-spark {DELTA_VERSION} has no build for Spark {spark_version} or older "
            f"(it has {', '.join(DELTA_SPARK_BUILDS)}); install PySpark {DELTA_SPARK_BUILDS[0]} "
            "or newer"
        )
    return fitting[-1]


def delta_spark_jars(spark_version: str = pyspark.__version__) -> list[str]:
    """The jars of Delta's connector for ``spark_version``, less those PySpark ships.

    Resolved with ``mvn`` the first time (about 15 s), then taken from the cache.

    :raises laminar_conformance.services.ServiceError: when Maven is missing or fails.
    """
    build = delta_spark_build(spark_version)
    coordinate = f"io.delta:delta-spark_{build}_{SCALA_VERSION}:{DELTA_VERSION}"
    libs = resolve_maven_jars(
        [coordinate],
        f"delta-spark/{DELTA_VERSION}-spark{build}",
        what=f"Delta's Spark connector ({coordinate})",
    )
    shipped = {_artifact(jar) for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return sorted(str(jar) for jar in libs.glob("*.jar") if _artifact(jar) not in shipped)


def delta_session_conf(spark_version: str = pyspark.__version__) -> dict[str, str]:
    """Spark settings that load Delta's connector, its SQL extension and its catalog."""
    return {
        "spark.jars": ",".join(delta_spark_jars(spark_version)),
        "spark.sql.extensions": _EXTENSION,
        _CATALOG_KEY: _CATALOG,
    }


def delta_spark_session(**conf: str) -> SparkSession:
    """A ``local[2]`` session with Delta's connector (see :func:`delta_session_conf`).

    Jars, extensions and catalogs are fixed when a session starts: call this before anything
    else in the process starts one (or in a process of its own).

    :param conf: further Spark settings, as for :func:`laminar_sdk.spark.build_session`.
    :raises RuntimeError: when a session without Delta's catalog is running already.
    """
    spark = build_session(
        app_name="laminar-delta-spark", **(delta_session_conf() | _KERNEL_READER | conf)
    )
    if spark.conf.get(_CATALOG_KEY, None) != _CATALOG:
        raise RuntimeError(
            "a Spark session without Delta's connector is running in this process: start the "
            "session with delta_spark_session() before any other, or read in another process"
        )
    return spark


def read_delta(spark: SparkSession, path: Path | str) -> DataFrame:
    """The table at ``path`` as Delta's connector reads it (its Delta Kernel-based reader)."""
    for key, value in _KERNEL_READER.items():
        spark.conf.set(key, value)
    quoted = str(path).replace("`", "``")
    return spark.read.table(f"delta.`{quoted}`")


def read_delta_ids(
    path: Path | str, column: str = "id", spark: SparkSession | None = None
) -> list[int]:
    """Every ``column`` value of the Delta table at ``path``, sorted, as Spark+Delta sees it.

    :param spark: a session from :func:`delta_spark_session`; ``None``: that function's.
    """
    session = delta_spark_session() if spark is None else spark
    ids: list[int] = read_delta(session, path).select(column).toArrow().column(0).to_pylist()
    return sorted(ids)


def _artifact(jar: Path) -> str:
    match = _JAR.fullmatch(jar.name)
    return match["artifact"] if match else jar.name
