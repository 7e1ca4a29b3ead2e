"""``laminar demo``: the quick-start job — an exactly-once Spark pipeline killed and resumed.

It writes a pipeline file (the ``generator`` source feeding the ``files`` sink of
laminar-plugin-files, Parquet, exactly-once, with the embedded ``file`` checkpoint store),
runs it with ``laminar run`` in a child process whose Spark driver the crash hook kills with
SIGKILL in the middle of an epoch — after the epoch's commit was decided, before it was
published; the hook's record proves the kill was the planned one — runs it again, and counts
every id a reader of the Parquet files sees. Then it runs the conformance kit's
``quick`` profile on the files plugin's sink and prints the report.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pyarrow.dataset as ds

from laminar_sdk._cli.terminal import format_table
from laminar_sdk._contract.errors import ConfigurationError
from laminar_sdk._plugins.loading import load_connector_registry
from laminar_sdk._plugins.registry import ConnectorRole
from laminar_sdk._spark.temporary_files import spark_temporary_files_in
from laminar_sdk.faults import (
    CRASH_AT_VARIABLE,
    CRASH_RECORD_VARIABLE,
    CrashPoint,
    CrashStep,
    crash_recorded,
)

ROWS_PER_PARTITION = 50_000
PARTITIONS = 2
RECORDS_PER_EPOCH = 20_000
CRASH_POINT = CrashPoint(CrashStep.COMMIT, epoch=2)
CRASH_WHERE = (
    "after the epoch's commit was decided (its manifest is durable), before it was published"
)
SINK_CONNECTOR = "files"
SINK_DISTRIBUTION = "laminar-plugin-files"

PIPELINE = f"""\
# The quick-start pipeline: generator -> Parquet files, exactly-once, on local Spark.
[source]
connector = "generator"
rows = {ROWS_PER_PARTITION}
partitions = {PARTITIONS}

[sink]
connector = "{SINK_CONNECTOR}"
path = "sink"
format = "parquet"

[pipeline]
delivery = "exactly-once"
checkpoint_location = "checkpoint"
master = "local[2]"
trigger = "available-now"
max_records_per_batch = {RECORDS_PER_EPOCH}
"""


def _say(text: str) -> None:
    print(f"laminar demo: {text}", flush=True)


def _require_files_plugin() -> None:
    try:
        load_connector_registry().get(SINK_CONNECTOR, ConnectorRole.SINK)
    except ConfigurationError:
        raise ConfigurationError(
            f"the demo writes with the {SINK_CONNECTOR!r} sink, which is not installed: "
            f"install {SINK_DISTRIBUTION} (in a checkout: pip install -e plugins/files; from a "
            f"wheelhouse: pip install --find-links DIR {SINK_DISTRIBUTION}; see the README, "
            "Installing), or run the demo with: python3 -m tox -e demo",
            key="sink.connector",
        ) from None


def _laminar(
    arguments: Sequence[str],
    work: Path,
    *,
    crash_at: CrashPoint | None = None,
    crash_record: Path | None = None,
    log: Path | None = None,
) -> int:
    """``laminar ARGUMENTS`` in a child process; its Spark's temporary files in ``work``.

    They are removed when it ends: a driver killed by the crash hook leaves them behind.

    :param crash_at: where the crash hook kills the pipeline; it records the kill in
        ``crash_record``.
    """
    temporary = Path(tempfile.mkdtemp(prefix="spark-tmp-", dir=work))
    environment = spark_temporary_files_in(temporary)
    environment.pop(CRASH_AT_VARIABLE, None)
    environment.pop(CRASH_RECORD_VARIABLE, None)
    if crash_at is not None and crash_record is not None:
        environment[CRASH_AT_VARIABLE] = str(crash_at)
        environment[CRASH_RECORD_VARIABLE] = str(crash_record)
    command = [sys.executable, "-m", "laminar_sdk", *arguments]
    try:
        if log is None:
            return subprocess.run(command, env=environment, check=False).returncode
        with log.open("wb") as output:
            return subprocess.run(
                command, env=environment, stdout=output, stderr=subprocess.STDOUT, check=False
            ).returncode
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def published_ids(path: Path) -> list[int]:
    """The ids a reader of the sink's Parquet files sees (``_staging`` is invisible to it)."""
    if not path.exists():
        return []
    dataset = ds.dataset(path, format="parquet")
    if not dataset.files:
        return []
    ids: list[int] = dataset.to_table(columns=["id"]).column("id").to_pylist()
    return ids


def _run_pipeline(work: Path, total: int) -> bool:
    pipeline = work / "pipeline.toml"
    pipeline.write_text(PIPELINE)
    sink = work / "sink"
    _say(f"pipeline file {pipeline}: {total} rows in epochs of {RECORDS_PER_EPOCH}")

    step = CRASH_POINT.step
    _say(
        f"1/4 running it, to be killed (SIGKILL) in epoch {CRASH_POINT.epoch} at crash point "
        f"{step.number} ({step.value!r}): {CRASH_WHERE}"
    )
    log = work / "killed-run.log"
    record = work / "crash-record.jsonl"
    status = _laminar(
        ["run", str(pipeline)], work, crash_at=CRASH_POINT, crash_record=record, log=log
    )
    if not crash_recorded(CRASH_POINT, record):
        _say(f"the planned kill did not happen (exit status {status}); see {log}")
        return False
    visible = len(published_ids(sink))
    _say(
        f"killed on purpose, as planned: the crash hook SIGKILLed Spark's driver at crash point "
        f"{step.number} of epoch {CRASH_POINT.epoch}, so `laminar run` lost its driver and "
        f"exited with status {status}; its output, with that error, is in {log.name}"
    )
    _say(f"{visible} of {total} rows were visible to readers of {sink} then")

    _say("2/4 running it again: it resumes from the checkpoint")
    status = _laminar(["run", str(pipeline)], work)
    if status != 0:
        _say(f"the second run failed with status {status}")
        return False

    _say("3/4 counting every id a reader of the Parquet files sees")
    counts = Counter(published_ids(sink))
    missing = total - sum(1 for i in range(total) if counts[i])
    duplicated = sum(n - 1 for n in counts.values() if n > 1)
    rows = [
        ("expected rows", "rows seen", "distinct ids", "missing", "duplicated"),
        (str(total), str(sum(counts.values())), str(len(counts)), str(missing), str(duplicated)),
    ]
    print(format_table(rows), flush=True)
    exactly_once = missing == 0 and duplicated == 0 and len(counts) == total
    _say("exactly once: nothing lost, nothing doubled" if exactly_once else "NOT exactly once")
    return exactly_once


def _run_conformance(work: Path) -> bool:
    report = work / "conformance-files-sink.md"
    _say(f"4/4 the conformance kit's quick profile on the {SINK_CONNECTOR!r} sink")
    status = _laminar(
        [
            "conformance",
            "run",
            SINK_CONNECTOR,
            "--role",
            "sink",
            "--profile",
            "quick",
            "--report",
            str(report),
        ],
        work,
    )
    if report.exists():
        print(report.read_text(), flush=True)
    _say(
        f"conformance report {report}: "
        + ("every applicable check passed" if status == 0 else f"FAILED (exit status {status})")
    )
    return status == 0


def run_demo(workdir: Path | None = None, *, conformance: bool = True) -> int:
    """Run the demo in ``workdir`` (a new temporary directory when ``None``).

    :param conformance: also run the conformance kit's quick profile on the files sink.
    :returns: 0 when every id arrived exactly once (and the conformance run passed), else 1.
    :raises ConfigurationError: when laminar-plugin-files is not installed.
    """
    _require_files_plugin()
    work = workdir or Path(tempfile.mkdtemp(prefix="laminar-demo-"))
    if workdir is not None and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    passed = _run_pipeline(work, ROWS_PER_PARTITION * PARTITIONS)
    if passed and conformance:
        passed = _run_conformance(work)
    return 0 if passed else 1
