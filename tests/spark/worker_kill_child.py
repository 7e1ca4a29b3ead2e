"""Run the exactly-once pipeline on ``local[2,4]`` (tasks retried up to 4 times).

``python worker_kill_child.py WORK ROWS``, with ``LAMINAR_SPARK_KILL_WRITER`` naming a marker
file: the first write task SIGKILLs its own Python worker mid-write, and Spark retries it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from spark_pipelines import run_exactly_once

from laminar_sdk.spark import build_session

if __name__ == "__main__":
    work, rows = Path(sys.argv[1]), int(sys.argv[2])
    spark = build_session(master="local[2,4]", app_name="laminar-worker-kill-child")
    run_exactly_once(spark, work, rows)
