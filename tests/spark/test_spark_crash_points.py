"""Crash points 3, 6, 9 and 10 — inside a call — and the abort path, on Spark and in process.

The hook (``LAMINAR_SPARK_CRASH_AT=STEP:EPOCH[:WHEN]``) is first checked in this process, with
a stand-in for the kill that raises :class:`SimulatedCrash`: where each point fires, what a
torn checkpoint write leaves, and that recovery survives it. Then on Spark: a pipeline in a
child process (the conformance kit's runner) is SIGKILLed inside ``pre_commit``, inside
``commit_epoch``, inside a source read and inside a checkpoint write, and restarted from its
checkpoint location: every id exactly once, nothing of a rolled-back epoch visible.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

import pytest
from laminar_conformance.spark import ChildRun, SparkPipeline, run_in_child, start_child
from spark_pipelines import (
    MAX_RECORDS_PER_BATCH,
    committed_epochs,
    exactly_once_pipeline,
    expected_ids,
)

from laminar_sdk import (
    CheckpointCorrupted,
    CheckpointManifest,
    ConfigurationError,
    ConnectorConfig,
    ConnectorRole,
    EpochCoordinator,
    ProtocolStep,
    SinkConnector,
    SourceConnector,
    crash_point,
    faults,
    load_connector_registry,
    open_checkpointer,
    spark_temporary_files_in,
)
from laminar_sdk._spark import fault_seam
from laminar_sdk.faults import (
    CRASH_AT_FILE_PREFIX,
    CRASH_AT_VARIABLE,
    CRASH_RECORD_VARIABLE,
    KILL_WRITER_VARIABLE,
    CrashPoint,
    CrashStep,
    SimulatedCrash,
    crash_observer,
    watched_sink,
    watched_source,
)
from laminar_sdk.reference import MemorySink, ids_batch

# In process: the hook's logic, with a kill that raises instead of SIGKILL. ------------------


def stand_in_kill() -> NoReturn:
    raise SimulatedCrash("the crash hook fired")


EPOCHS = [[0, 1, 2], [3, 4], [5, 6, 7]]


@pytest.fixture(scope="module")
def registry():
    return load_connector_registry()


@pytest.fixture
def record(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "crash-record"
    monkeypatch.setenv(CRASH_RECORD_VARIABLE, str(path))
    return path


async def load_manifest_file(path: Path) -> CheckpointManifest:
    return CheckpointManifest.from_json(path.read_bytes(), path=str(path))


def recorded(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def run_epochs(registry, out: Path, checkpoints: Path, crash: str | None, *, wrap=False):
    """Epochs 0-2 through the coordinator, like Spark's commits: crash, then restart."""
    environ = {CRASH_AT_VARIABLE: crash} if crash else {}
    sink, _ = await registry.open_sink("memory", {"path": str(out)})
    if wrap:
        sink = watched_sink(sink, environ, kill=stand_in_kill)
    observer = crash_observer(environ, kill=stand_in_kill)
    coordinator = EpochCoordinator(
        open_checkpointer(str(checkpoints)), {"out": sink}, observer=observer
    )
    await coordinator.recover()
    for epoch, ids in enumerate(EPOCHS):
        await coordinator.run_epoch(epoch, [ids_batch(ids)], {})
    await sink.close()


def crash(registry, tmp_path, crash_at: str, *, wrap=False) -> None:
    with pytest.raises(SimulatedCrash):
        asyncio.run(run_epochs(registry, tmp_path / "out", tmp_path / "ckpt", crash_at, wrap=wrap))


def restart(registry, tmp_path) -> None:
    asyncio.run(run_epochs(registry, tmp_path / "out", tmp_path / "ckpt", None))
    assert sorted(MemorySink.committed_ids(tmp_path / "out")) == list(range(8))


def crash_and_restart(registry, tmp_path, crash_at: str, *, wrap=False) -> None:
    crash(registry, tmp_path, crash_at, wrap=wrap)
    restart(registry, tmp_path)


@pytest.mark.parametrize("step", list(CrashStep), ids=lambda step: step.value)
def test_every_crash_point_round_trips_through_the_variable(step):
    for point in (CrashPoint(step, 3), CrashPoint(step, 0)):
        assert CrashPoint.parse(str(point)) == point
    if step.inside_a_call:
        assert CrashPoint.parse(f"{step.value}:2:5") == CrashPoint(step, 2, event=5)
        assert CrashPoint.parse(f"{step.value}:2:40ms") == CrashPoint(step, 2, after_ms=40)
        assert str(CrashPoint(step, 2, after_ms=40)) == f"{step.value}:2:40ms"
    assert [s.number for s in CrashStep] == list(range(1, 11))


@pytest.mark.parametrize(
    "value", ["commit:1:2", "commit-inside:1:0", "nope:1", "commit-inside:x", "done:-1", "done"]
)
def test_a_malformed_crash_point_is_refused_naming_the_variable(value):
    with pytest.raises(ConfigurationError, match=CRASH_AT_VARIABLE) as error:
        CrashPoint.parse(value)
    assert "pre-commit-inside, commit-inside, source-read, checkpoint-write" in str(error.value)


def test_a_crash_point_in_a_file_is_read_each_time_and_none_until_the_file_says_one(tmp_path):
    path = tmp_path / "crash-at"
    environ = {CRASH_AT_VARIABLE: f"{CRASH_AT_FILE_PREFIX}{path}"}
    assert faults.configured_crash_point(environ) is None, "no file yet: no crash point"
    path.write_text("")
    assert faults.configured_crash_point(environ) is None, "an empty file: no crash point"
    path.write_text("commit-inside:2:3\n")
    assert faults.configured_crash_point(environ) == CrashPoint(CrashStep.COMMIT_INSIDE, 2, event=3)
    path.write_text("commit:x")
    with pytest.raises(ConfigurationError, match=f"the file {path}"):
        faults.configured_crash_point(environ)


def test_without_the_variable_nothing_is_wrapped_or_observed(registry):
    source, sink = registry.create_source("generator"), registry.create_sink("memory")
    assert watched_source(source, {}) is source
    assert watched_sink(sink, {}) is sink
    assert crash_observer({}) is None
    # A point the wrappers do not handle leaves the connectors alone too.
    assert watched_sink(sink, {CRASH_AT_VARIABLE: "commit-inside:1"}) is sink
    assert watched_source(source, {CRASH_AT_VARIABLE: "checkpoint-write:1"}) is source


def test_the_bridge_lets_faults_in_only_where_a_variable_asks(registry, monkeypatch):
    source, sink = registry.create_source("generator"), registry.create_sink("memory")
    monkeypatch.delenv(CRASH_AT_VARIABLE, raising=False)
    monkeypatch.delenv(KILL_WRITER_VARIABLE, raising=False)
    assert fault_seam.opened_source(source) is source
    assert fault_seam.opened_sink(sink) is sink
    assert fault_seam.coordinator_observer() is None
    assert fault_seam.after_each_batch() is None
    assert fault_seam.deliberate_kill("(gone)") is None
    monkeypatch.setenv(CRASH_AT_VARIABLE, "pre-commit-inside:1")
    assert isinstance(fault_seam.opened_sink(sink), faults._WatchedSink)
    monkeypatch.setenv(CRASH_AT_VARIABLE, "commit:2")
    assert fault_seam.coordinator_observer() is not None
    assert "crash point 5 ('commit') of epoch 2 (gone)" in str(fault_seam.deliberate_kill("(gone)"))
    monkeypatch.setenv(KILL_WRITER_VARIABLE, "/nonexistent/marker")
    assert fault_seam.after_each_batch() is faults.kill_writer_once


def test_only_the_seam_of_the_bridge_imports_the_fault_machinery():
    bridge = Path(fault_seam.__file__).parent
    importers = sorted(
        path.name
        for path in bridge.glob("*.py")
        if re.search(r"^\s*from laminar_sdk(\.faults| import faults)\b", path.read_text(), re.M)
    )
    assert importers == ["fault_seam.py"]


def test_a_bridge_asked_for_no_fault_does_not_import_the_fault_machinery():
    bridge = "laminar_sdk._spark.datasource, laminar_sdk._spark.reader, laminar_sdk._spark.writer"
    check = f"import sys, {bridge}; print('laminar_sdk.faults' in sys.modules)"
    environment = {
        k: v for k, v in os.environ.items() if k not in (CRASH_AT_VARIABLE, KILL_WRITER_VARIABLE)
    }
    imported = subprocess.run(
        [sys.executable, "-c", check], env=environment, capture_output=True, text=True, check=True
    )
    assert imported.stdout.strip() == "False"


def test_the_crash_steps_between_calls_are_the_coordinators_steps():
    between = [step.protocol_step for step in CrashStep if not step.inside_a_call]
    assert between == list(ProtocolStep)


@pytest.mark.parametrize(
    ("wrapper", "contract"),
    [(faults._WatchedSource, SourceConnector), (faults._WatchedSink, SinkConnector)],
)
def test_the_wrappers_pass_every_call_of_the_contract_on(wrapper, contract):
    methods = {
        name
        for name, member in inspect.getmembers(contract, inspect.isfunction)
        if not name.startswith("_")
    }
    defaults = {name for name in methods if getattr(wrapper, name) is getattr(contract, name)}
    assert defaults == set(), "a contract method falls back to its default"


def test_commit_inside_kills_during_commit_epoch_and_recovery_finishes_it(
    registry, tmp_path, record
):
    for event in (1, 2, 3):
        crash_and_restart(registry, tmp_path / str(event), f"commit-inside:1:{event}")
    at = [fired["at"] for fired in recorded(record)]
    # The memory sink publishes an epoch with one rename: the kill comes before it, then
    # right after commit_epoch returned (there is no third event).
    assert at[0].startswith("before os.rename"), at
    assert at[1:] == ["commit_epoch returned"] * 2, at


class MarkedSink(MemorySink):
    """Marks a crash point in commit_epoch before publishing: I/O the audit hook cannot see."""

    async def commit_epoch(self, epoch: int) -> None:
        crash_point("about-to-publish")
        await super().commit_epoch(epoch)


def test_commit_inside_counts_the_crash_points_a_sink_marks(tmp_path, record):
    async def run(crash_at: str | None) -> None:
        environ = {CRASH_AT_VARIABLE: crash_at} if crash_at else {}
        sink = MarkedSink()
        await sink.open(ConnectorConfig("memory", {"path": str(tmp_path / "out")}))
        coordinator = EpochCoordinator(
            open_checkpointer(str(tmp_path / "ckpt")),
            {"out": sink},
            observer=crash_observer(environ, kill=stand_in_kill),
        )
        await coordinator.recover()
        for epoch, ids in enumerate(EPOCHS):
            await coordinator.run_epoch(epoch, [ids_batch(ids)], {})
        await sink.close()

    with pytest.raises(SimulatedCrash):
        asyncio.run(run("commit-inside:1:1"))
    assert [fired["at"] for fired in recorded(record)] == ["at crash point about-to-publish"]
    asyncio.run(run(None))
    assert sorted(MemorySink.committed_ids(tmp_path / "out")) == list(range(8))


def test_pre_commit_inside_kills_during_pre_commit_and_the_epoch_is_rolled_back(
    registry, tmp_path, record
):
    for event in range(1, 7):
        crash_and_restart(
            registry, tmp_path / str(event), f"pre-commit-inside:1:{event}", wrap=True
        )
    at = [fired["at"] for fired in recorded(record)]
    inside = [where for where in at if where.startswith("before ")]
    assert inside, f"no kill came before an operation of pre_commit: {at}"
    assert at == [*inside, *["pre_commit returned"] * (6 - len(inside))], at


def test_pre_commit_inside_of_a_distributed_sink_fires_after_the_last_batch(registry, tmp_path):
    async def stage() -> None:
        sink, _ = await registry.open_sink("memory", {"path": str(tmp_path / "out")})
        environ = {CRASH_AT_VARIABLE: "pre-commit-inside:4:9"}
        distributed = watched_sink(sink, environ, kill=stand_in_kill).as_distributed_commit()
        taken = []

        async def batches():
            for ids in EPOCHS:
                taken.append(ids)
                yield ids_batch(ids)

        await distributed.stage(3, "t-1", batches())  # another epoch: not watched
        with pytest.raises(SimulatedCrash):
            await distributed.stage(4, "t-2", batches())
        assert len(taken) == 2 * len(EPOCHS), "the kill came before the last batch was taken"

    asyncio.run(stage())


@pytest.mark.parametrize("event", range(1, 13))
def test_a_torn_checkpoint_write_is_survived(registry, tmp_path, record, event):
    crash(registry, tmp_path, f"checkpoint-write:1:{event}")
    (fired,) = recorded(record)
    if "published as" in (fired["torn"] or ""):
        published = Path(fired["torn"].rpartition("published as ")[2])
        assert published.name in ("manifest.json", "_latest"), fired
        if published.name == "_latest":
            read = open_checkpointer(str(published.parent)).read_latest()
        else:
            read = load_manifest_file(published)
        with pytest.raises(CheckpointCorrupted):
            asyncio.run(read)
    restart(registry, tmp_path)


def test_the_torn_writes_reach_the_manifests_and_the_latest_pointer(registry, tmp_path, record):
    torn = set()
    for event in range(1, 13):
        crash_and_restart(registry, tmp_path / str(event), f"checkpoint-write:1:{event}")
    for fired in recorded(record):
        published = (fired["torn"] or "").rpartition("published as ")[2]
        torn.add(Path(published).name if published else None)
    assert {"manifest.json", "_latest"} <= torn, torn


def test_a_timed_kill_comes_during_a_slow_call(registry, tmp_path, record):
    timer_fired = threading.Event()

    class SlowCommit(MemorySink):
        finished = False

        async def commit_epoch(self, epoch: int) -> None:
            # Slow until the timer fires (30 s at most): how late a loaded machine runs the
            # timer's thread does not decide the outcome.
            await asyncio.to_thread(timer_fired.wait, 30)
            await super().commit_epoch(epoch)
            SlowCommit.finished = True

    kills = []

    def kill():  # called in the timer's thread; returning just ends that thread here
        kills.append(SlowCommit.finished)
        timer_fired.set()

    async def scenario() -> None:
        sink = SlowCommit()
        spec = registry.get("memory", ConnectorRole.SINK)
        await sink.open(spec.configure({"path": str(tmp_path / "o")}))
        observer = crash_observer({CRASH_AT_VARIABLE: "commit-inside:0:100ms"}, kill=kill)
        coordinator = EpochCoordinator(
            open_checkpointer(str(tmp_path / "c")), {"out": sink}, observer=observer
        )
        await coordinator.recover()
        started = time.monotonic()
        await coordinator.run_epoch(0, [ids_batch([1])], {})
        assert time.monotonic() - started >= 0.1, "the timer fires 100 ms into the call"

    asyncio.run(scenario())
    assert kills == [False], "the timer fired while commit_epoch was still running"
    (fired,) = recorded(record)
    assert fired["at"] == "timer"


def test_source_read_kills_at_the_chosen_call_of_the_chosen_read(registry, monkeypatch, record):
    monkeypatch.setattr(faults, "_reads_in_process", 0)
    environ = {CRASH_AT_VARIABLE: "source-read:1:3"}
    options = {"rows": "20", "partitions": "2", "batch_size": "4"}

    async def read(restore_from) -> list[int]:
        opened, _ = await registry.open_source("generator", options)
        source = watched_source(opened, environ, kill=stand_in_kill)
        try:
            await source.restore(restore_from)
            ids = []
            for _ in range(3):
                polled = await source.poll_batch(5)
                ids += polled.records.column("id").to_pylist()
            return ids
        finally:
            await source.close()

    async def scenario() -> None:
        opened, _ = await registry.open_source("generator", options)
        start = opened.checkpoint()
        await opened.close()
        assert len(await read(start)) == 12, "read 0 is not the chosen one"
        with pytest.raises(SimulatedCrash):
            await read(start)

    asyncio.run(scenario())
    (fired,) = recorded(record)
    assert fired["at"] == "poll_batch returned", "event 3: restore, poll, poll"


# On Spark: the pipeline of spark_pipelines in a child process, killed, then restarted. --------

CRASH_EPOCH = 1
ROWS = 30  # 60 rows in micro-batches of 25, 25, 10


def crash_then_restart(work: Path, crash: str) -> tuple[ChildRun, list[int]]:
    """Run the pipeline to be killed at ``crash``, then again: the kill, and the sink's ids."""
    pipeline = exactly_once_pipeline(work, ROWS)
    killed = run_in_child(pipeline, work, "killed", crash=crash)
    assert killed.crashed, f"the crash at {crash} did not fire:\n{killed.tail()}"
    assert killed.returncode != 0
    committed = committed_epochs(work)
    # Spark's own commit log never recorded micro-batch 1: the restart re-runs it.
    assert CRASH_EPOCH not in pipeline.spark_batches("commits"), committed
    assert len(MemorySink.committed_ids(work / "sink")) == len(committed) * MAX_RECORDS_PER_BATCH
    restarted = run_in_child(pipeline, work, "restarted")
    assert restarted.returncode == 0, restarted.tail()
    return killed, sorted(MemorySink.committed_ids(work / "sink"))


@pytest.mark.spark
@pytest.mark.full  # CI: the child's order, without Spark (conformance/test_spark_layer.py)
def test_a_driver_standing_by_takes_its_crash_point_only_once_warmed_up(tmp_path):
    # Released at once, while it still warms up with a pipeline of its own: the crash point
    # (done:0, which that pipeline reaches too) must kill this pipeline, not the warm-up's.
    pipeline = exactly_once_pipeline(tmp_path, ROWS)
    child = start_child(pipeline, tmp_path, "standby", crash="done:0", standby=True)
    child.release()
    run = child.wait()

    assert run.crashed, run.tail()
    assert "standing by" in run.tail(characters=100_000)
    assert pipeline.spark_batches("offsets") == [0], "this pipeline's micro-batch 0 was killed"
    assert committed_epochs(tmp_path) == ["epoch-0"]
    assert not list(tmp_path.glob("*.warm-up")), "the warm-up's files are left"


# Nightly: CI kills inside a call on Spark in tests/spark/test_live_source_recovery.py (inside
# a source's read), and counts a sink's marked points here without Spark.
SPARK_POINTS = [
    pytest.param("pre-commit-inside:1", id="3-pre-commit-inside"),
    pytest.param("commit-inside:1:2", id="6-commit-inside"),
    pytest.param("source-read:1:2", id="9-source-read"),
    # The 4th write of the checkpoint store: publishing micro-batch 1's manifest (file store).
    pytest.param("checkpoint-write:1:4", id="10-checkpoint-write-torn-manifest"),
]


@pytest.mark.spark
@pytest.mark.full
@pytest.mark.parametrize("crash", SPARK_POINTS)
def test_a_pipeline_killed_inside_a_call_restarts_exactly_once(tmp_path, crash):
    killed, ids = crash_then_restart(tmp_path, crash)
    assert ids == expected_ids(ROWS)
    if crash.startswith("checkpoint-write"):
        (fired,) = killed.crashes
        assert (fired["torn"] or "").endswith("manifest.json"), f"no torn manifest: {fired}"


# What a killed driver leaves: its temporary files, in a directory of the run's own. ------------


def test_a_child_keeps_its_temporary_files_in_a_directory_given_to_the_jvm(tmp_path):
    directory = tmp_path / 'a "quoted" \\ dir'
    inherited = {"SPARK_SUBMIT_OPTS": "-Xss4m", "TMPDIR": "/elsewhere", "KEPT": "1"}

    environment = spark_temporary_files_in(directory, inherited)

    assert environment["TMPDIR"] == str(directory)
    # The caller's options stay, and the directory comes last (so it wins), quoted for
    # spark-submit's parser: a backslash or a double quote escaped.
    expected = rf'-Xss4m -Djava.io.tmpdir="{tmp_path}/a \"quoted\" \\ dir"'
    assert environment["SPARK_SUBMIT_OPTS"] == expected
    assert environment["KEPT"] == "1"
    assert inherited["TMPDIR"] == "/elsewhere", "the caller's mapping was changed"


@pytest.mark.spark
@pytest.mark.full  # in CI, the demo's killed run checks the same (tests/spark/test_laminar_run.py)
def test_a_killed_driver_leaves_no_temporary_files(tmp_path):
    pipeline = exactly_once_pipeline(tmp_path, ROWS)
    child = start_child(pipeline, tmp_path, "killed", crash="commit-inside:1:2")
    temporary = tmp_path / "killed.tmp"
    deadline = time.monotonic() + 120
    # The driver's block manager directory shows the JVM took the directory it was given
    # (without it, it goes to /tmp).
    while not list(temporary.glob("blockmgr-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    made_there = sorted(path.name.split("-")[0] for path in temporary.iterdir())
    killed = child.wait()

    assert killed.crashed, killed.tail()
    assert "blockmgr" in made_there, f"the driver's files are not in {temporary}: {made_there}"
    assert not temporary.exists(), "the killed driver's temporary files were left behind"


# The abort path: a sink call fails, Spark calls abort, a restart commits exactly once. --------

FAILING_PLUGIN = """
from pathlib import Path

from laminar_sdk import ConfigKeySpec, TransactionError, hookimpl
from laminar_sdk.reference import MemorySink


class FailingSink(MemorySink):
    # Commits from one instance (not distributed); fails once in epoch 1 at the call its
    # 'fail' key names, while the marker file _fail-once in its directory exists.
    CONFIG_KEYS = (
        *MemorySink.CONFIG_KEYS,
        ConfigKeySpec("fail", required=True, description="write_batch or commit_epoch"),
    )

    async def open(self, config):
        await super().open(config)
        self._fail = config.require("fail")
        self._marker = Path(config.require("path")) / "_fail-once"
        self._epoch_number = None

    def as_distributed_commit(self):
        return None

    def _fail_once(self, call, epoch):
        if (call, epoch) == (self._fail, 1) and self._marker.exists():
            self._marker.unlink()
            raise TransactionError(f"injected failure in {call} of epoch {epoch}")

    async def begin_epoch(self, epoch):
        self._epoch_number = epoch
        await super().begin_epoch(epoch)

    async def write_batch(self, batch):
        self._fail_once("write_batch", self._epoch_number)
        return await super().write_batch(batch)

    async def commit_epoch(self, epoch):
        self._fail_once("commit_epoch", epoch)
        await super().commit_epoch(epoch)


@hookimpl
def laminar_register_connectors(registry):
    registry.add_sink("failing-memory", FailingSink, config_keys=FailingSink.CONFIG_KEYS)
"""


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.full  # nightly: CI checks the abort and rollback of a raising sink without Spark
def test_a_failing_sink_call_is_aborted_and_a_restart_commits_exactly_once(
    tmp_path, install_distribution
):
    site = install_distribution(
        "laminar-plugin-failing",
        modules={"failing_plugin": FAILING_PLUGIN},
        plugins={"failing": "failing_plugin"},
    )

    def failing_pipeline(call: str) -> SparkPipeline:
        work = tmp_path / call
        (work / "sink").mkdir(parents=True)
        (work / "sink" / "_fail-once").touch()
        return dataclasses.replace(
            exactly_once_pipeline(work, ROWS),
            sink="failing-memory",
            sink_options={"path": str(work / "sink"), "fail": call},
        )

    calls = ["write_batch", "commit_epoch"]
    pipelines = {call: failing_pipeline(call) for call in calls}
    children = {
        call: start_child(pipelines[call], tmp_path / call, "failed", python_path=(str(site),))
        for call in calls
    }
    failed = {call: child.wait() for call, child in children.items()}
    after_failure = {call: committed_epochs(tmp_path / call) for call in calls}
    staged = {
        call: sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / call).rglob("_staging/*"))
        for call in calls
    }
    children = {
        call: start_child(pipelines[call], tmp_path / call, "restarted", python_path=(str(site),))
        for call in calls
    }
    restarted = {call: child.wait() for call, child in children.items()}
    for call in calls:
        assert failed[call].returncode != 0, failed[call].tail()
        assert not failed[call].crashed
        assert not (tmp_path / call / "sink" / "_fail-once").exists(), f"{call} never failed"
        assert f"injected failure in {call} of epoch 1" in failed[call].tail(20_000)
        assert restarted[call].returncode == 0, restarted[call].tail()
        assert sorted(MemorySink.committed_ids(tmp_path / call / "sink")) == expected_ids(ROWS)

    # Undecided (write_batch failed): epoch 1 rolled back, nothing of it left, then rewritten.
    assert after_failure["write_batch"] == ["epoch-0"]
    assert staged["write_batch"] == [], "a rolled-back epoch left staged data"
    # Decided (commit_epoch failed after the manifest): Spark's abort finished the commit.
    assert after_failure["commit_epoch"] == ["epoch-0", "epoch-1"], "abort did not finish it"
