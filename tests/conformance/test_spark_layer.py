"""The conformance kit's Spark layer: correct connectors pass, a sink that is not crash-safe fails.

The reference connectors adopt the Spark suites as a plugin would (a drawn crash schedule, the
session's seed). A sink that keeps its commit record only in memory — fine as long as one
instance runs an epoch from ``pre_commit`` to ``commit_epoch`` — is caught on Spark when the
driver dies between the two and the restart's new instance has to finish the commit. The
command ``laminar conformance run`` reports the layer's figures.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import io
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from laminar_conformance import _spark_layer, _spark_pipeline
from laminar_conformance._figures import Figures
from laminar_conformance._probe import SourceTraits
from laminar_conformance._profiles import PROFILES
from laminar_conformance._report import CheckResult, ReportCollector
from laminar_conformance._spark_layer import SparkLayer
from laminar_conformance._suite import Target
from laminar_conformance.contexts import ConformancePlugins
from laminar_conformance.spark import SparkSinkSuite, SparkSourceSuite

from laminar_sdk import ConnectorConfig, ConnectorRole
from laminar_sdk._scaffold import lowest_supported
from laminar_sdk.faults import CrashPoint, CrashStep
from laminar_sdk.reference import MemorySource

HERE = Path(__file__).parent
ROOT = HERE.parents[1]

# The reference connectors' Spark layer runs nightly (`tox -e full`). In CI the layer runs on
# connectors written as outsiders write them: a polled source of three partitions and a sink
# it catches (below), and the project `laminar new-plugin` writes (tests/test_scaffold.py).


@pytest.mark.spark
@pytest.mark.full
class TestMemorySinkOnSpark(SparkSinkSuite):
    connector = "memory"


@pytest.mark.spark
@pytest.mark.full
class TestMemorySourceOnSpark(SparkSourceSuite):
    connector = "memory"


@pytest.mark.spark
@pytest.mark.full
class TestGeneratorSourceOnSpark(SparkSourceSuite):
    connector = "generator"


# An installed plugin: the broken variant of broken.py, and the memory sink it derives from,
# both committing from one instance (not distributed) so that Spark calls their pre_commit and
# commit_epoch.
ONE_INSTANCE_PLUGIN = """
from broken import CommitStateInMemory, SinkContext

from laminar_sdk import hookimpl
from laminar_sdk.reference import MemorySink


class OneInstanceMemorySink(MemorySink):
    def as_distributed_commit(self):
        return None


class OneInstanceCommitStateInMemory(CommitStateInMemory):
    def as_distributed_commit(self):
        return None


SINKS = {
    "one-instance-memory": OneInstanceMemorySink,
    "one-instance-commit-state-in-memory": OneInstanceCommitStateInMemory,
}


@hookimpl
def laminar_register_connectors(registry):
    for name, sink in SINKS.items():
        registry.add_sink(name, sink, config_keys=MemorySink.CONFIG_KEYS)


@hookimpl
def laminar_conformance_context(connector, role, workdir):
    return SinkContext(connector, workdir) if role == "sink" and connector in SINKS else None
"""

SUITE = """
from laminar_conformance.spark import SparkSinkSuite


class TestOnSpark(SparkSinkSuite):
    connector = "{connector}"
"""


def python_path(*directories: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, directories), *sys.path])}


def run_the_spark_layer(tmp_path: Path, site: Path, connector: str) -> str:
    """The Spark layer of ``connector`` through pytest, killed at ``commit:1``; its output."""
    (tmp_path / "test_on_spark.py").write_text(SUITE.format(connector=connector))
    # Killed after micro-batch 1's manifest, before commit_epoch: the restart's new instance
    # is asked to commit an epoch another instance pre-committed.
    result = subprocess.run(
        [
            sys.executable, "-m", "pytest", "test_on_spark.py", "-p", "no:cacheprovider",
            "--laminar-spark-crashes=commit:1", "--hypothesis-seed=1", "-rf",
        ],
        cwd=tmp_path,
        env=python_path(site, HERE),
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    return f"exit status {result.returncode}\n{result.stdout}{result.stderr}"


def outsider_spark_layer(
    tmp_path: Path, connector: str, *, seed: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``laminar conformance run`` of an outsider.py source's Spark layer alone; its report."""
    report = tmp_path / "report.md"
    result = subprocess.run(
        [
            sys.executable, "-m", "laminar_conformance", "run", connector, "--role", "source",
            "--seed", seed, "--plugin", "outsider", "--report", str(report), "--reruns", "0",
            "--check", "test_spark_pipeline_killed_at_crash_points_restarts_without_loss",
        ],
        cwd=tmp_path,
        env=python_path(HERE),
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    return result, report


@pytest.fixture
def one_instance_site(install_distribution) -> Path:
    return install_distribution(
        "laminar-plugin-one-instance",
        modules={"one_instance_plugin": ONE_INSTANCE_PLUGIN},
        plugins={"one-instance": "one_instance_plugin"},
    )


@pytest.mark.spark
@pytest.mark.slow
def test_a_sink_whose_commit_record_lives_in_memory_is_caught(tmp_path, one_instance_site):
    output = run_the_spark_layer(tmp_path, one_instance_site, "one-instance-commit-state-in-memory")
    assert output.startswith("exit status 1\n"), output[-5000:]
    assert "1 failed" in output, output[-5000:]
    assert "FAILED test_on_spark.py::TestOnSpark::" in output
    assert "crash schedule [commit:1 (crash point 5)] (fired: commit:1), seed 1: lost ids" in output
    # The case's timeline: the first driver committed micro-batch 0 and was killed in 1; the
    # second ran on from micro-batch 1.
    assert "timeline (each line one run of the Spark driver; a crash ends it):" in output
    assert "run 0: micro-batch(0) -> killed: commit(1) [crash: commit:1]" in output
    assert "run 1: micro-batch(1) -> micro-batch(2)" in output
    replay = "laminar conformance run one-instance-commit-state-in-memory --role sink --seed 1"
    assert f"Replay this schedule: {replay} --spark-crashes commit:1" in output


@pytest.mark.spark
@pytest.mark.full
def test_the_same_sink_with_its_commit_record_on_disk_passes(tmp_path, one_instance_site):
    """The control of the test above: the same schedule, without the bug, passes."""
    output = run_the_spark_layer(tmp_path, one_instance_site, "one-instance-memory")
    assert output.startswith("exit status 0\n"), output[-5000:]
    assert "1 passed" in output, output[-5000:]


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.full  # nightly: CI runs the Spark layer catching a sink's bug (below)
def test_the_command_reports_the_spark_layer_and_its_figures(tmp_path):
    """A third-party polled source of three partitions, probed live: data arrives while down."""
    # Its in-process checks: tests/conformance/test_broken_variants.py.
    result, report = outsider_spark_layer(tmp_path, "outsider-queue", seed="3")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    pyspark = importlib.metadata.version("pyspark")
    planned = f"Spark layer: on local Spark (PySpark {pyspark}), 1 pipeline(s) killed at 1 crash"
    assert planned in result.stdout
    text = report.read_text()
    spark = next(line for line in text.splitlines() if line.startswith("- Spark layer:"))
    assert spark.startswith("- Spark layer: passed — 1 pipeline(s), 1 crash(es) injected"), spark
    assert "; crash schedule(s): " in spark
    # Its context can remove a partition: partition 0 goes once its records were read.
    assert " (partition 0 removed while " in spark, spark
    assert "outsider-queue: partition 0 removed while " in result.stdout
    assert "laminar conformance: outsider-queue: Spark run 1, to be killed at " in result.stdout
    assert "outsider-queue: 12 new ids appended while the driver is down" in result.stdout
    assert " new ids appended while run 1 ran" in result.stdout
    epochs = int(spark.split(" epochs committed")[0].rsplit(" ", 1)[1])
    assert epochs >= 5, spark
    assert "| test_spark_pipeline_killed_at_crash_points_restarts_without_loss | passed |" in text


@pytest.mark.spark
@pytest.mark.full
def test_a_source_that_cannot_restore_once_a_partition_is_removed_is_caught_on_spark(tmp_path):
    """The restarted driver restores offsets naming partition 0, which the layer removed once
    a reader had its records: a source that refuses them fails the case, saying so."""
    result, report = outsider_spark_layer(
        tmp_path, "outsider-refuses-a-checkpoint-past-the-files", seed="3"
    )
    assert result.returncode == 1, result.stdout[-5000:] + result.stderr[-3000:]
    text = report.read_text()
    assert "(partition 0 removed while " in text, text
    assert "CheckpointError: queue source: p0 has 0 lines, the checkpoint says 3" in text, text


@pytest.mark.spark
@pytest.mark.full
def test_a_source_that_reads_its_records_again_is_stopped_as_soon_as_it_is_certain(tmp_path):
    """A polled source whose restore() does nothing reads from its start in every micro-batch,
    forever: the run is stopped once a reader sees ids twice, not at the query's timeout."""
    result, report = outsider_spark_layer(tmp_path, "outsider-restores-nothing", seed="1")
    assert result.returncode == 1, result.stdout[-5000:] + result.stderr[-3000:]
    text = report.read_text()
    assert "was stopped: ids [" in text, text
    assert "were delivered twice with exactly-once delivery while the pipeline ran" in text
    assert "timed out" not in text


# The layer's own logic, without Spark. -------------------------------------------------------


@pytest.fixture
def target(tmp_path):
    def make(profile: str, connector: str = "memory", role=ConnectorRole.SINK) -> Target:
        plugins = ConformancePlugins.load()
        return Target(
            spec=plugins.registry.get(connector, role),
            plugins=plugins,
            profile=PROFILES[profile],
            seed=11,
            directory=tmp_path,
            extra_plugins=(),
        )

    return make


class _Session:
    """What the child does with its Spark session, recorded: only ``stop``."""

    def __init__(self, events: list[object]) -> None:
        self._events = events

    def stop(self) -> None:
        self._events.append("stop")


@pytest.mark.parametrize(("order", "ran"), [("go done:0\n", True), ("", False)])
def test_a_driver_standing_by_sets_its_crash_point_only_once_its_warm_up_is_over(
    tmp_path, monkeypatch, order, ran
):
    # The order is waiting on standard input before the warm-up starts: the warm-up must run
    # without a crash point all the same (else its own pipeline would be killed), the query
    # with it; at the end of input, the child stops without running anything.
    child = pytest.importorskip("laminar_conformance._spark_child", reason="pyspark not installed")
    crash_at = tmp_path / "run.crash-at"
    spec = tmp_path / "run.json"
    pipeline = _spark_pipeline.SparkPipeline("generator", {}, "memory", {}, str(tmp_path / "c"))
    spec.write_text(pipeline.to_json())
    events: list[object] = []
    monkeypatch.setenv(_spark_pipeline.CRASH_AT_VARIABLE, f"@{crash_at}")
    monkeypatch.setattr(child, "session", lambda pipeline, servers, log: _Session(events))
    monkeypatch.setattr(
        child,
        "warm_up",
        lambda spark, directory, like: events.append(("warm-up", crash_at.exists())),
    )
    monkeypatch.setattr(
        child, "run", lambda spark, run: events.append(("run", crash_at.read_text()))
    )
    monkeypatch.setattr(sys, "stdin", io.StringIO(order))

    assert child.main([_spark_pipeline.STANDBY_FLAG, str(spec)]) == 0

    expected = (
        [("warm-up", False), ("run", "done:0"), "stop"] if ran else [("warm-up", False), "stop"]
    )
    assert events == expected


@pytest.mark.parametrize(("profile", "crashes"), [("quick", 1), ("full", 10)])
def test_schedules_kill_at_distinct_points_of_increasing_epochs(target, profile, crashes):
    layer = SparkLayer(target(profile), Figures(), ())
    drawn = []

    @settings(max_examples=30, database=None)
    @given(schedule=layer.schedules())
    def draw(schedule):
        drawn.append(schedule)
        assert len(schedule) == crashes
        assert len({point.step for point in schedule}) == crashes
        epochs = [point.epoch for point in schedule]
        assert epochs == sorted(set(epochs)), "epochs increase, one crash each"
        assert max(epochs) < layer.epochs - 1, "the pipeline runs on after the last crash"
        for point in schedule:
            assert CrashPoint.parse(str(point)) == point
            assert point.step.inside_a_call or point.event == 1

    draw()
    if profile == "full":
        assert {point.step for schedule in drawn for point in schedule} == set(CrashStep)


def test_a_plugin_module_is_shipped_to_spark_as_an_installed_plugin(target):
    layer = SparkLayer(target("quick"), Figures(), [broken_module()])
    site, root = (Path(path) for path in layer._python_path)
    assert root == HERE
    (dist_info,) = site.glob("*.dist-info")
    assert (
        "[laminar_sdk.plugins]\nbroken = broken\n" in (dist_info / "entry_points.txt").read_text()
    )


def test_an_extra_plugin_that_is_not_a_module_is_skipped_saying_why(target):
    with pytest.raises(pytest.skip.Exception, match="is not a module"):
        SparkLayer(target("quick"), Figures(), [object()])


def broken_module():
    sys.path.insert(0, str(HERE))
    try:
        return importlib.import_module("broken")
    finally:
        sys.path.remove(str(HERE))


def test_the_report_sums_up_the_spark_checks():
    collector = ReportCollector()
    planned = (
        f"on local Spark (PySpark {importlib.metadata.version('pyspark')}), 1 pipeline(s) "
        "killed at 1 crash point(s) each and restarted"
    )
    assert collector.spark_summary(planned) == planned
    name = "test_spark_pipeline_killed_at_crash_points_restarts_without_loss"
    collector.results["a"] = CheckResult(
        name,
        "passed",
        duration_s=61.5,
        figures={"cases": 1, "faults": 2, "epochs": 6, "restarts": 2},
        schedules="commit:1,done:3",
    )
    collector.results["b"] = CheckResult(
        "test_epoch_protocol_state_machine", figures={"faults": 99}
    )
    assert collector.spark_summary(planned) == (
        "passed — 1 pipeline(s), 2 crash(es) injected (SIGKILL of the Spark driver), "
        "6 epochs committed, 2 restarts, 61.5 s; crash schedule(s): commit:1,done:3"
    )
    collector.results["a"] = CheckResult(name, "skipped", reason="pyspark not installed")
    assert collector.spark_summary(planned) == "skipped: pyspark not installed"


def test_a_live_source_gets_records_as_soon_as_spark_plans_a_micro_batch(monkeypatch):
    # Timed arrivals alone missed a run killed within its first seconds; the records must
    # land between a micro-batch's planning and its reads, whatever the run's pace.
    monkeypatch.setattr(_spark_layer, "ARRIVAL_INTERVAL_S", 3600.0)
    planned: list[int] = [0]
    calls = threading.Semaphore(0)

    def arrive() -> int:
        calls.release()
        return 4

    with _spark_layer._arriving(arrive, lambda: list(planned)) as arrived:
        assert not calls.acquire(timeout=0.5), "nothing was planned since the block began"
        planned.append(1)
        assert calls.acquire(timeout=30), "a newly planned micro-batch brought no records"
        planned.append(2)
        assert calls.acquire(timeout=30)
    assert arrived == [4, 4]


def test_a_live_source_gets_records_on_a_timer_while_nothing_is_planned(monkeypatch):
    monkeypatch.setattr(_spark_layer, "ARRIVAL_INTERVAL_S", 0.2)
    calls = threading.Semaphore(0)

    def arrive() -> int:
        calls.release()
        return 1

    with _spark_layer._arriving(arrive, list) as arrived:
        assert calls.acquire(timeout=30), "no records arrived while the run went on"
    assert arrived


def test_no_records_arrive_for_a_run_that_goes_to_the_end():
    with _spark_layer._arriving(None, list) as arrived:
        pass
    assert arrived == []


def test_a_child_dead_of_a_signal_the_kit_did_not_send_is_named_with_its_fault_trace(tmp_path):
    log = tmp_path / "driver.log"
    with log.open("wb") as output:
        child = subprocess.run(
            [sys.executable, "-c", "import ctypes; ctypes.string_at(0)"],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=_spark_pipeline.faulthandler_on(os.environ),
            check=False,
        )
    run = _spark_pipeline.ChildRun(child.returncode, (), log, 1.0)
    message = _spark_layer._failed(run, "the run to be killed at commit:1")
    assert "died of SIGSEGV (signal 11), which the kit did not send" in message
    assert "Fatal Python error: Segmentation fault" in message
    assert '"<string>", line 1 in <module>' in message


def test_a_child_that_printed_nothing_says_its_log_is_empty(tmp_path):
    log = tmp_path / "driver.log"
    log.touch()
    message = _spark_layer._failed(_spark_pipeline.ChildRun(-11, (), log, 1.0), "the run")
    assert f"(nothing: its log {log} is empty)" in message


def test_a_failed_run_says_the_error_of_its_output_on_the_first_line(tmp_path):
    # A report shows a failure's first line: the error must be on it, not only in the tail.
    log = tmp_path / "driver.log"
    log.write_text(
        '  File "outsider.py", line 160, in restore\n'
        "laminar_sdk._contract.errors.CheckpointError: queue source: p0 has 0 lines\n"
        "=== Streaming Query ===\n"
    )
    message = _spark_layer._failed(_spark_pipeline.ChildRun(1, (), log, 1.0), "the last run")
    assert message.splitlines()[0] == (
        "the last run failed with exit status 1 without a crash: CheckpointError: queue "
        "source: p0 has 0 lines; the end of its output:"
    )


def test_a_run_certain_to_have_failed_is_killed_saying_why(tmp_path):
    """A child asked whether it failed already is killed as soon as it says why (no Spark needed:
    the child is killed while its driver may still be starting)."""
    endless = _spark_pipeline.SparkPipeline(
        source="generator",
        source_options={"rows": str(10**12)},
        sink="memory",
        sink_options={"path": str(tmp_path / "sink")},
        checkpoint_location=str(tmp_path / "checkpoint"),
    )
    child = _spark_pipeline.start_child(endless, tmp_path, "run")
    answers = iter(["", "the source reads again"])
    run = child.wait(lambda: next(answers))
    assert run.stopped == "the source reads again"
    assert not run.timed_out
    assert run.returncode < 0  # killed, not ended
    assert next(answers, "asked no more") == "asked no more"


def _source_case(read_back, *, exactly_once: bool) -> _spark_layer._Case:
    pipeline = _spark_pipeline.SparkPipeline("s", {}, "memory", {}, "checkpoint")
    return _spark_layer._Case(
        Path(), pipeline, [1, 2, 3], exactly_once, False, read_back, lambda: None
    )


def test_a_source_reading_records_again_is_certain_once_a_reader_sees_too_many():
    exactly_once = _source_case(lambda: [1, 2, 1], exactly_once=True)
    assert "ids [1] (1) were delivered twice with exactly-once delivery" in (
        exactly_once.read_again()
    )
    # At least once, a replay may repeat records: only far more than appended is certain.
    assert _source_case(lambda: [1, 2, 1], exactly_once=False).read_again() == ""
    endless = _source_case(lambda: [1, 2, 3] * 40, exactly_once=False).read_again()
    assert "keeps returning records it returned before" in endless
    assert _source_case(lambda: [1, 2, 3], exactly_once=True).read_again() == ""


def _partitions(path: str) -> dict[int, list[int]]:
    """The ids a memory source at ``path`` holds now, by partition."""

    async def read() -> dict[int, list[int]]:
        source = MemorySource()
        await source.open(ConnectorConfig("memory", {"path": path}))
        held: dict[int, list[int]] = {}
        while (batch := await source.poll_batch(1000)) is not None:
            held.setdefault(int(batch.partition.id), []).extend(
                batch.records.column("id").to_pylist()
            )
        await source.close()
        return held

    return asyncio.run(read())


def test_a_source_case_removes_partition_0_once_a_reader_has_all_its_records(target, tmp_path):
    pytest.importorskip("pyspark", reason="the case pickles the context's ids() for Spark")
    case = _spark_layer._Case.build(
        target("quick", "memory", ConnectorRole.SOURCE), tmp_path, list(range(60))
    )
    path = case.pipeline.source_options["path"]
    try:
        removal = case.removal
        assert removal is not None
        assert removal.records == {0, 1, 2}, "a few records, read early"
        started = _partitions(path)
        assert started[0] == [0, 1, 2]
        assert sorted(started) == [0, 1], "the last partition appears while a run goes on"
        read: list[int] = [0, 1]
        removal.read_back = lambda: read
        assert case.arriving("while run 1 ran")() == 12
        assert not removal.removed, "a reader lacks record 2"
        held = _partitions(path)
        assert held[0] == [0, 1, 2], "nothing more is appended to the partition to be removed"
        assert set(held) == {0, 1, 2}
        read.append(2)
        assert case.arriving("while the driver was down after run 1")() == 12
        assert removal.removed == "while the driver was down after run 1"
        assert sorted(_partitions(path)) == [1, 2]
        assert case.arriving("while run 2 ran", last=True)() == 0, "the last run gets no records"
        assert removal.outcome() == "partition 0 removed while the driver was down after run 1"
    finally:
        case.close()


class _RemovableContext:
    def __init__(self, skip_checks: dict[str, str] | None = None, fails: bool = False) -> None:
        self.skip_checks = skip_checks or {}
        self.fails = fails

    def remove_partition(self, partition: int) -> None:
        if self.fails:
            raise OSError(f"partition {partition} is busy")


def _traits(*, equal_partitions: bool = False) -> SourceTraits:
    return SourceTraits(3, equal_partitions, True, (), None, None)


@pytest.mark.parametrize(
    ("context", "traits", "filled"),
    [
        (object(), _traits(), 2),
        (_RemovableContext({"partition-removal": "shards are never closed"}), _traits(), 2),
        (_RemovableContext(), _traits(equal_partitions=True), 2),
        (_RemovableContext(), _traits(), 1),
    ],
    ids=["no-remove_partition", "turned-off", "equal-partitions", "one-partition-filled"],
)
def test_no_partition_is_removed_where_the_context_cannot_or_should_not(context, traits, filled):
    assert _spark_layer._PartitionRemoval.of(context, traits, filled, [1, 2, 3], list) is None


def test_a_context_whose_removal_raises_fails_the_case_naming_it():
    removal = _spark_layer._PartitionRemoval.of(
        _RemovableContext(fails=True), _traits(), 2, [1, 2, 3, 4], lambda: [1, 2, 3]
    )
    assert removal is not None
    removal.attempt("while run 1 ran")
    assert not removal.removed
    assert removal.error == (
        "the test context's remove_partition(0) raised OSError: partition 0 is busy"
    )
    assert removal.outcome().startswith("partition 0 not removed")


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.full  # nightly: one Spark pipeline killed and restarted
def test_the_spark_layer_runs_with_the_python_it_is_pointed_at(tmp_path):
    # Another environment's interpreter, as a wrapper that says it ran and runs this one.
    ran = tmp_path / "ran"
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {ran}\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    result = subprocess.run(
        [
            sys.executable, "-m", "laminar_conformance", "run", "memory", "--role", "sink",
            "--seed", "1", "--spark-python", str(wrapper), "--reruns", "0",
            "--check", "test_spark_pipeline_killed_at_crash_points_restarts_without_loss",
        ],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip

    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    pyspark = importlib.metadata.version("pyspark")
    assert f"on local Spark (PySpark {pyspark} of {wrapper})" in result.stdout
    assert "-m laminar_conformance._spark_child" in ran.read_text(), "the children ran with it"


@pytest.fixture(scope="module")
def lowest_spark_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python with the lowest PySpark and pyarrow laminar-sdk supports, and this checkout."""
    environment = tmp_path_factory.mktemp("lowest") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(environment)], check=True)
    python = environment / "bin" / "python"
    lowest = lowest_supported("pyspark", "pyarrow")
    pins = [f"{name}=={version}" for name, version in lowest.items()]
    install = [str(python), "-m", "pip", "install", "--quiet", *pins]
    subprocess.run([*install, "-e", str(ROOT), "-e", str(ROOT / "conformance")], check=True)
    return python


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.full  # nightly: a virtual environment with PySpark installed, and two Spark runs
def test_a_source_that_needs_the_newest_pyarrow_fails_on_the_lowest_one(
    tmp_path, lowest_spark_python
):
    """The same outsider source: its Spark layer passes here, fails on the lowest PySpark."""
    connector = "outsider-queue-on-the-newest-pyarrow"
    check = "test_spark_pipeline_killed_at_crash_points_restarts_without_loss"
    command = [
        sys.executable, "-m", "laminar_conformance", "run", connector, "--role", "source",
        "--seed", "1", "--plugin", "outsider", "--reruns", "0", "--check", check,
    ]  # fmt: skip
    # Only this directory on the path: the lowest environment's own packages must be the ones
    # its Python imports.
    environment = {**os.environ, "PYTHONPATH": str(HERE)}

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, *extra],
            cwd=tmp_path,
            env=environment,
            capture_output=True,
            text=True,
            check=False,
        )

    newest = run()
    assert newest.returncode == 0, newest.stdout[-5000:] + newest.stderr[-3000:]
    lowest = run("--spark-python", str(lowest_spark_python))
    output = lowest.stdout + lowest.stderr
    assert lowest.returncode == 1, output[-5000:]
    assert "(PySpark 4.2" in output
    assert "has no attribute 'modulo'" in output, output[-5000:]
