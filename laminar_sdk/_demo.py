"""``laminar demo``: the quick-start job — an exactly-once Spark pipeline killed and resumed.

It writes a pipeline file (the ``generator`` source feeding the ``memory`` sink, exactly-once,
with the embedded ``file`` checkpoint store), runs it with ``laminar run`` in a child process
that is killed with SIGKILL in the middle of an epoch — after the epoch's commit was decided,
before it was published — runs it again, and counts every id the sink's readers see.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from laminar_sdk._spark.faults import CRASH_AT_VARIABLE
from laminar_sdk._terminal import format_table
from laminar_sdk.reference import MemorySink

ROWS_PER_PARTITION = 50_000
PARTITIONS = 2
RECORDS_PER_EPOCH = 20_000
CRASH_EPOCH = 2
CRASH_STEP = "commit"

PIPELINE = f"""\
# The quick-start pipeline: generator -> memory sink, exactly-once, on local Spark.
[source]
connector = "generator"
rows = {ROWS_PER_PARTITION}
partitions = {PARTITIONS}

[sink]
connector = "memory"
path = "sink"

[pipeline]
delivery = "exactly-once"
checkpoint_location = "checkpoint"
master = "local[2]"
trigger = "available-now"
max_records_per_batch = {RECORDS_PER_EPOCH}
"""


def _say(text: str) -> None:
    print(f"laminar demo: {text}", flush=True)


def _run_pipeline(pipeline: Path, *, crash_at: str | None = None, log: Path | None = None) -> int:
    environment = dict(os.environ)
    environment.pop(CRASH_AT_VARIABLE, None)
    if crash_at is not None:
        environment[CRASH_AT_VARIABLE] = crash_at
    command = [sys.executable, "-m", "laminar_sdk", "run", str(pipeline)]
    if log is None:
        return subprocess.run(command, env=environment, check=False).returncode
    with log.open("wb") as output:
        return subprocess.run(
            command, env=environment, stdout=output, stderr=subprocess.STDOUT, check=False
        ).returncode


def run_demo(workdir: Path | None = None) -> int:
    """Run the demo in ``workdir`` (a new temporary directory when ``None``).

    :returns: 0 when every id arrived exactly once, 1 otherwise.
    """
    work = workdir or Path(tempfile.mkdtemp(prefix="laminar-demo-"))
    if workdir is not None and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    pipeline = work / "pipeline.toml"
    pipeline.write_text(PIPELINE)
    total = ROWS_PER_PARTITION * PARTITIONS
    _say(f"pipeline file {pipeline}: {total} rows in epochs of {RECORDS_PER_EPOCH}")

    _say(f"1/3 running it, to be killed (SIGKILL) in epoch {CRASH_EPOCH} at step {CRASH_STEP!r}")
    log = work / "killed-run.log"
    status = _run_pipeline(pipeline, crash_at=f"{CRASH_STEP}:{CRASH_EPOCH}", log=log)
    visible = len(MemorySink.committed_ids(work / "sink"))
    _say(f"killed (exit status {status}, its output is in {log.name}); {visible} of {total} rows")
    _say("were visible to readers then")

    _say("2/3 running it again: it resumes from the checkpoint")
    status = _run_pipeline(pipeline)
    if status != 0:
        _say(f"the second run failed with status {status}")
        return 1

    _say("3/3 counting every id a reader of the sink sees")
    counts = Counter(MemorySink.committed_ids(work / "sink"))
    missing = total - sum(1 for i in range(total) if counts[i])
    duplicated = sum(n - 1 for n in counts.values() if n > 1)
    rows = [
        ("expected rows", "rows seen", "distinct ids", "missing", "duplicated"),
        (str(total), str(sum(counts.values())), str(len(counts)), str(missing), str(duplicated)),
    ]
    print(format_table(rows), flush=True)
    exactly_once = missing == 0 and duplicated == 0 and len(counts) == total
    _say("exactly once: nothing lost, nothing doubled" if exactly_once else "NOT exactly once")
    return 0 if exactly_once else 1
