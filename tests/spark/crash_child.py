"""Run the exactly-once pipeline of ``spark_pipelines`` in a process of its own.

``python crash_child.py WORK ROWS``, with ``LAMINAR_SPARK_CRASH_AT`` set in the environment:
the crash hook SIGKILLs this process's Spark driver at the chosen protocol step.
"""

from __future__ import annotations

import sys
from pathlib import Path

from spark_pipelines import run_exactly_once

from laminar_sdk.spark import build_session

# The driver lives for one short query: the JIT's fast tier and a serial collector start it
# seconds sooner, which matters with several children sharing the test machine's cores.
FAST_START = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

if __name__ == "__main__":
    work, rows = Path(sys.argv[1]), int(sys.argv[2])
    spark = build_session(
        app_name="laminar-crash-child", **{"spark.driver.extraJavaOptions": FAST_START}
    )
    run_exactly_once(spark, work, rows)
