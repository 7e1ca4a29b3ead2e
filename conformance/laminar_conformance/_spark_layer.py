"""The Spark layer: the plugin in a real pipeline on Spark, killed at crash points and restarted.

A *case* is one pipeline, with the reference connectors on the other side of the plugin: a
sink under test is fed by the ``generator`` source (its ids turned into the sink's records by
the sink's test context, through an Arrow stage), a source under test feeds the ``memory``
sink (its records turned into ids by the source's test context). The pipeline runs in a child
process per crash of the case's *crash schedule* — each killed by the SDK's crash hook
(``LAMINAR_SPARK_CRASH_AT``) at its crash point, the next restarting from the checkpoint
location — and then once more to its end. The ids a reader sees are then counted: none may be
lost, and with exactly-once delivery none may be there twice.

Schedules are drawn by Hypothesis with the run's seed: crash points (the ten of the design
notes) at increasing epochs, the kill inside a call placed at one of its first events. Spark
cases take tens of seconds each, so there is no shrinking: a failure prints its schedule, the
seed and the command that replays it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import itertools
import json
import pickle
import shutil
import signal
import tempfile
import threading
import time
import types
from collections import Counter
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from pyarrow import parquet

from laminar_conformance._delivery import read_enough
from laminar_conformance._faults import TraceEvent
from laminar_conformance._figures import Figures
from laminar_conformance._probe import SourceTraits, source_traits
from laminar_conformance._profiles import NO_SPARK_OPTION, SPARK_CRASHES_FLAG, SPARK_CRASHES_OPTION
from laminar_conformance._report import SPARK_SCHEDULES_PROPERTY
from laminar_conformance._skips import skip, stated_reasons
from laminar_conformance._spark_pipeline import (
    CONTEXT_IDS,
    RECORD_KEY,
    TAKE_RECORDS,
    ChildRun,
    Crash,
    IdsTransform,
    RunningChild,
    SparkPipeline,
    one_after_another,
    start_child,
)
from laminar_conformance._suite import Target
from laminar_conformance._timeline import Timeline
from laminar_conformance.contexts import SinkTestContext, SourceTestContext
from laminar_sdk import PLUGIN_ENTRY_POINT_GROUP, ConnectorRole
from laminar_sdk.faults import CrashPoint, CrashStep
from laminar_sdk.reference import MemorySink

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

NO_SPARK_REASON = "switched off (--no-spark, or --laminar-no-spark in pytest)"
PYSPARK_MISSING = "pyspark not installed (pip install laminar-sdk[spark])"

GENERATOR_PARTITIONS = 2
IDS_PER_EPOCH = 12
"""Records per micro-batch; divisible by the partition counts contexts usually have."""
EXTRA_PLUGINS_DISTRIBUTION = "laminar-conformance-extra-plugins"


def spark_skip_reason(config: pytest.Config) -> str | None:
    """Why the Spark layer does not run here, or ``None`` when it does."""
    if config.getoption(NO_SPARK_OPTION, False):
        return NO_SPARK_REASON
    if importlib.util.find_spec("pyspark") is None:
        return PYSPARK_MISSING
    return None


def describe_crash(point: CrashPoint) -> str:
    """``point`` as the hook takes it, and its number (1 to 10, docs/epoch-protocol.md)."""
    return f"{point} (crash point {point.step.number})"


@dataclass(slots=True)
class CaseResult:
    """What one case did: the crashes that fired, the epochs committed, what went wrong.

    ``trace`` is its timeline: one row per run of the driver (``instance`` counts runs from
    0), a box per micro-batch that run committed (Spark's commit log), and the kill.
    """

    fired: list[str] = field(default_factory=list)
    writer_kills: list[str] = field(default_factory=list)
    epochs: int = 0
    problems: list[str] = field(default_factory=list)
    trace: list[TraceEvent] = field(default_factory=list)

    def ran(self, run: int, committed: Sequence[int], killed_at: CrashPoint | None) -> None:
        """Add run ``run`` to the trace: the micro-batches it committed, then its kill."""
        self.trace += [TraceEvent(run, "micro-batch", batch, "ok") for batch in committed]
        if killed_at is not None:
            what = f"killed: {killed_at.step.value}"
            self.trace.append(TraceEvent(run, what, killed_at.epoch, f"crash: {killed_at}"))


class SparkLayer:
    """The Spark cases of one connector: their pipelines, schedules and checks.

    :param target: the connector under test.
    :param figures: the check's figures, filled in as cases run.
    :param plugins: the suite's extra plugin modules, shipped to Spark as installed plugins.
    """

    def __init__(
        self,
        target: Target,
        figures: Figures,
        plugins: Sequence[object],
        progress: Callable[[str], None] = lambda line: None,
        early: EarlyDrivers | None = None,
    ) -> None:
        self.target = target
        self.figures = figures
        self.epochs = max(target.profile.spark_crashes + 2, 5)
        self.ids = list(range(self.epochs * IDS_PER_EPOCH))
        self.schedules_run: list[str] = []
        self._progress = progress
        self._early = early
        self._python_path = early.python_path if early else ship_plugins(target, plugins)

    # Schedules ---------------------------------------------------------------------------

    def schedules(self) -> SearchStrategy[tuple[CrashPoint, ...]]:
        """Crash schedules: ``spark_crashes`` distinct crash points at increasing epochs.

        Hypothesis tries the simplest example first, and a quick run has room for one case:
        the lists it draws from start at a place the seed chooses, so that the first case
        differs from seed to seed (and is the same for the same seed).
        """
        from hypothesis import strategies as st  # noqa: PLC0415 - after pytest's rewriting

        crashes = self.target.profile.spark_crashes
        turn = self.target.seed or 0
        steps = _rotated(list(CrashStep), turn)
        # The last epoch is left out: the pipeline must run on after the last crash.
        epochs = _rotated(list(range(self.epochs - 1)), turn // len(steps))

        def events(step: CrashStep) -> st.SearchStrategy[int]:
            if not step.inside_a_call:
                return st.just(1)
            last = 12 if step is CrashStep.CHECKPOINT_WRITE else 4
            return st.sampled_from(_rotated(list(range(1, last + 1)), turn // 7))

        @st.composite
        def schedule(draw: Callable[..., Any]) -> tuple[CrashPoint, ...]:
            chosen = draw(st.permutations(steps))[:crashes]
            at = sorted(draw(st.sets(st.sampled_from(epochs), min_size=crashes, max_size=crashes)))
            return tuple(
                CrashPoint(step, epoch, event=draw(events(step)))
                for step, epoch in zip(chosen, at, strict=True)
            )

        return schedule()

    # One case ----------------------------------------------------------------------------

    def run_case(self, schedule: tuple[CrashPoint, ...]) -> None:
        """Run the pipeline through ``schedule``, then check what a reader sees.

        :raises AssertionError: naming the schedule, the seed, and what went wrong.
        """
        early, self._early = self._early, None  # the first case's drivers
        directory = early.directory if early else case_directory(self.target)
        case = _Case.build(self.target, directory, self.ids)
        self.schedules_run.append(",".join(map(str, schedule)))
        try:
            result = self._run(case, schedule, early.children if early else {})
        finally:
            case.close()
        changed = f" ({case.removal.outcome()})" if case.removal else ""
        self.schedules_run[-1] += changed
        self.figures.cases += 1
        self.figures.faults += len(result.fired)
        self.figures.epochs += result.epochs
        self.figures.restarts += len(result.fired)
        if not result.problems:
            shutil.rmtree(directory, ignore_errors=True)
            return
        seed = "derandomized" if self.target.seed is None else str(self.target.seed)
        crashes = ", ".join(describe_crash(point) for point in schedule)
        fired = ", ".join(result.fired) or "none"
        timeline = Timeline(tuple(result.trace), tuple(result.problems), rows="run")
        self.figures.timeline = timeline.to_json()
        raise AssertionError(
            f"on Spark, {self.target.role} {self.target.connector!r} in the pipeline "
            f"{case.pipeline.source} -> {case.pipeline.sink} ({case.pipeline.delivery}, "
            f"{len(case.ids)} ids in micro-batches of {IDS_PER_EPOCH}), crash schedule "
            f"[{crashes}] (fired: {fired}){changed}, seed {seed}: "
            + "; ".join(result.problems)
            + "\n"
            + timeline.text()
            + f"\nThe runs' logs and the pipeline are kept in {directory}\n"
            f"Replay this schedule: {self.target.replay_command()} --spark-crashes "
            + ",".join(map(str, schedule))
        )

    def _run(
        self,
        case: _Case,
        schedule: tuple[CrashPoint, ...],
        standing_by: MutableMapping[str, RunningChild],
    ) -> CaseResult:
        result = CaseResult()
        plan: list[CrashPoint | None] = [*schedule, None]  # the last run goes to the end
        crashes: list[Crash] = [self._crash(case, point) for point in schedule]
        children = one_after_another(
            case.pipeline,
            case.directory,
            list(zip(run_names(len(schedule)), [*crashes, None], strict=True)),
            python_path=self._python_path,
            standing_by=standing_by,
        )
        with contextlib.closing(children):
            for index, point in enumerate(plan):
                number = index + 1
                self._progress(
                    f"Spark run {number}, to the end"
                    if point is None
                    else f"Spark run {number}, to be killed at {describe_crash(point)}"
                )
                committed = case.pipeline.spark_batches("commits")
                arrive = case.arriving(f"while run {number} ran", last=point is None)
                planned = functools.partial(case.pipeline.spark_batches, "offsets")
                with _arriving(arrive, planned) as arrived:
                    run = next(children).wait(case.read_again if case.source_under_test else None)
                if sum(arrived):
                    self._progress(f"{sum(arrived)} new ids appended while run {number} ran")
                self._report_removal(case, f"while run {number} ran")
                newly = sorted(set(case.pipeline.spark_batches("commits")) - set(committed))
                result.ran(index, newly, point if run.crashed else None)
                result.writer_kills += [str(kill.get("crash")) for kill in run.writer_kills]
                if run.crashed:
                    result.fired.append(str(point))
                    down = f"while the driver was down after run {number}"
                    if (arrive_while_down := case.arriving(down)) is not None:
                        # Data keeps arriving while the driver is down, in every partition: the
                        # restart must replay the micro-batch it had planned exactly, not what
                        # the source holds now.
                        appended = arrive_while_down()
                        self._progress(f"{appended} new ids appended while the driver is down")
                        self._report_removal(case, down)
                    continue
                if run.stopped:
                    result.problems.append(f"run {number} was stopped: {run.stopped}")
                    return result
                if run.returncode != 0:
                    what = (
                        "the last run (no crash)"
                        if point is None
                        else f"run {number} (to crash at {point})"
                    )
                    result.problems.append(_failed(run, what))
                    return result
                break
        result.epochs = len(case.pipeline.spark_batches("commits"))
        if case.removal is not None and case.removal.error:
            result.problems.append(case.removal.error)
        expected_kill = case.pipeline.epoch_writer_kills
        if expected_kill and expected_kill not in result.writer_kills:
            result.problems.append(
                f"the epoch writer was never killed at {expected_kill}: the sink's micro-batches "
                "did not go through it, so the handover to a new instance was not tried"
            )
        if not result.fired:
            result.problems.append(
                "no crash point of the schedule fired: the pipeline ran to its end without "
                f"reaching them ({len(case.ids)} ids took {result.epochs} micro-batches)"
            )
        result.problems += case.delivery_problems()
        return result

    def _report_removal(self, case: _Case, when: str) -> None:
        """Say on the terminal that partition 0 went ``when``, if it just did."""
        if case.removal is not None and case.removal.removed == when:
            self._progress(f"partition 0 removed {when}: the reader had all its records")

    def _crash(self, case: _Case, point: CrashPoint) -> Crash:
        """``point`` as the hook reads it in its run.

        A source that is not range-readable is read in Spark's planning process, which counts
        its reads from 0 in each run: that run's first read is of the micro-batch after those
        in Spark's offset log when it starts, so its point is known only then.
        """
        if point.step is not CrashStep.SOURCE_READ or case.range_readable:
            return str(point)

        def when_started() -> str:
            planned = case.pipeline.spark_batches("offsets")
            first = planned[-1] + 1 if planned else 0
            return str(
                CrashPoint(point.step, max(point.epoch - first, 0), point.event, point.after_ms)
            )

        return when_started


ARRIVAL_INTERVAL_S = 2.0
"""The longest a live source goes without new ids while a run to be killed runs."""

_ARRIVAL_WATCH_S = 0.1
"""How often the feeder looks at Spark's offset log for a micro-batch planned since."""


@contextlib.contextmanager
def _arriving(
    arrive: Callable[[], int] | None, planned: Callable[[], list[int]]
) -> Iterator[list[int]]:
    """Call ``arrive`` (a live source's append) while this block runs a pipeline.

    It is called as soon as Spark's offset log (``planned``) holds a micro-batch it did not
    hold before — new records then land between a micro-batch's planning and its reads, where
    a source polled again for a re-run would return them — and at least every
    :data:`ARRIVAL_INTERVAL_S`, so a run slow to plan still sees records arrive.

    Yields the list of how many each call appended (empty when ``arrive`` is ``None``).
    """
    arrived: list[int] = []
    if arrive is None:
        yield arrived
        return
    stop = threading.Event()

    def feed() -> None:
        seen = set(planned())
        last = time.monotonic()
        while not stop.wait(_ARRIVAL_WATCH_S):
            now = set(planned())
            if now - seen or time.monotonic() - last >= ARRIVAL_INTERVAL_S:
                arrived.append(arrive())
                seen |= now
                last = time.monotonic()

    feeder = threading.Thread(target=feed, name="laminar-conformance-arrivals", daemon=True)
    feeder.start()
    try:
        yield arrived
    finally:
        stop.set()
        feeder.join()


def run_names(crashes: int) -> list[str]:
    """The names of a case's runs, for a schedule of ``crashes`` crash points."""
    return [f"run-{number}" for number in range(1, crashes + 1)] + ["run-last"]


def case_directory(target: Target) -> Path:
    """A new directory for a case of ``target``'s Spark check: its pipeline, files and logs."""
    return Path(tempfile.mkdtemp(prefix="spark-", dir=target.directory))


def ship_plugins(target: Target, plugins: Sequence[object]) -> tuple[str, ...]:
    """Make the suite's extra plugin modules installed plugins for Spark's workers.

    Spark's Python workers find connectors through installed entry points only: each module
    gets one in a directory put on their ``PYTHONPATH``, with the module's own.

    :returns: the directories to put first on the ``PYTHONPATH`` of the pipelines' children.
    :raises pytest.skip.Exception: for an extra plugin that is not a module.
    """
    if not plugins:
        return ()
    site = Path(tempfile.mkdtemp(prefix="spark-plugins-", dir=target.directory))
    roots: list[str] = [str(site)]
    lines = []
    for plugin in plugins:
        if not isinstance(plugin, types.ModuleType) or plugin.__file__ is None:
            skip(
                "spark",
                f"extra plugin {plugin!r} is not a module: Spark's workers load connectors "
                "from installed plugins or plugin modules only",
            )
        lines.append(f"{plugin.__name__} = {plugin.__name__}")
        file = Path(plugin.__file__)
        depth = plugin.__name__.count(".") + (file.name == "__init__.py")
        roots.append(str(file.parents[depth]))
    dist_info = site / f"{EXTRA_PLUGINS_DISTRIBUTION.replace('-', '_')}-0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {EXTRA_PLUGINS_DISTRIBUTION}\nVersion: 0\n"
    )
    (dist_info / "entry_points.txt").write_text(
        f"[{PLUGIN_ENTRY_POINT_GROUP}]\n" + "\n".join(lines) + "\n"
    )
    return tuple(dict.fromkeys(roots))


EARLY_DRIVERS = 2
"""How many drivers of the first case start ahead of the Spark check: its first run's and the
one after."""


@dataclass(slots=True)
class EarlyDrivers:
    """The drivers of the first Spark case's first runs, started standing by ahead of it.

    :param directory: the first case's directory, where they run.
    :param python_path: the shipped extra plugins (:func:`ship_plugins`).
    :param children: by run name.
    """

    directory: Path
    python_path: tuple[str, ...]
    children: dict[str, RunningChild]

    @classmethod
    def start(
        cls, target: Target, plugins: Sequence[object], config: pytest.Config
    ) -> EarlyDrivers | None:
        """Start them, or ``None`` when the Spark check will not run pipelines.

        The Spark suites do this when the first check of their class starts, and run the Spark
        check last: its drivers start and warm up while the in-process checks run.
        """
        if spark_skip_reason(config) is not None or hasattr(config, "workerinput"):
            # Under pytest-xdist another worker may run the check: its drivers would idle here.
            return None
        if target.role is ConnectorRole.SINK and not _reads_back(target.sink_context()):
            return None  # the check skips: nothing to count the ids with
        try:
            python_path = ship_plugins(target, plugins)
        except pytest.skip.Exception:
            return None  # the check skips, saying why
        pinned = pinned_schedule(config)
        crashes = target.profile.spark_crashes if pinned is None else len(pinned)
        directory = case_directory(target)
        # Started for this pipeline's master; each runs the case's pipeline when released.
        placeholder = SparkPipeline(
            source="generator",
            source_options={},
            sink="memory",
            sink_options={},
            checkpoint_location=str(directory / "checkpoint"),
        )
        children = {
            name: start_child(placeholder, directory, name, python_path=python_path, standby=True)
            for name in run_names(crashes)[:EARLY_DRIVERS]
        }
        return cls(directory, python_path, children)

    def close(self) -> None:
        """Kill the drivers the check did not take, and clean up after them."""
        while self.children:
            _, child = self.children.popitem()
            child.kill()
            child.wait()


def _epoch_writer_kill(target: Target, ids: list[int]) -> str:
    """Where a one-instance sink's epoch writer kills itself: a step of the last micro-batch.

    Only the pipeline's last run reaches that micro-batch (crash schedules leave it out): the
    writer dies with the driver still up, and the commit waiting for it must finish the
    micro-batch on a new instance of the sink, in another process. The step turns with the
    seed.
    """
    steps = [step for step in CrashStep if step.protocol_step is not None]
    step = steps[(target.seed or 0) % len(steps)]
    return str(CrashPoint(step, len(ids) // IDS_PER_EPOCH - 1))


def _reads_back(context: SinkTestContext) -> bool:
    try:
        return context.committed_ids() is not None
    finally:
        context.close()


def _rotated(values: list[Any], turn: int) -> list[Any]:
    if not values:
        return values
    turn %= len(values)
    return values[turn:] + values[:turn]


def _failed(run: ChildRun, what: str) -> str:
    if run.timed_out:
        how = "timed out without a crash"
    elif run.returncode < 0:
        name = _signal_name(-run.returncode)
        how = (
            f"died of {name} (signal {-run.returncode}), which the kit did not send: the "
            "driver's Python process crashed (a fault in a C extension the connector loads, "
            "or in the JVM it started); its faulthandler trace, if it printed one, ends its "
            "output"
        )
    else:
        how = f"failed with exit status {run.returncode} without a crash"
    from laminar_sdk.spark import failure_line  # noqa: PLC0415 - imports pyspark, which ran

    said = f": {failure_line(run.output())}" if run.output() else ""
    return f"{what} {how}{said}; the end of its output:\n{run.tail()}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "an unknown signal"


REMOVED_RECORDS = 3
"""Records of the partition the Spark layer removes: few, so that it is read early."""


@dataclass(slots=True)
class _PartitionRemoval:
    """Partition 0 of a source under test, taken away once a reader has all its records.

    Where the test context can remove a partition (``remove_partition``), partition 0 gets
    :data:`REMOVED_RECORDS` records at the start and no more; each time new records arrive
    (while a run to be killed goes on, and while its driver is down), the layer looks whether
    the reader has them all, and if so removes the partition, as its system would (a directory
    deleted, a shard closed): Spark's offset log and the source's checkpoints still name it,
    and the restarted driver restores them.
    """

    remove: Callable[[int], None]
    records: frozenset[int]
    read_back: Callable[[], list[int]]
    removed: str = ""
    """When partition 0 was removed (``""``: not yet)."""
    error: str = ""
    """What the context's ``remove_partition`` raised, if it did."""

    @classmethod
    def of(
        cls,
        context: SourceTestContext,
        traits: SourceTraits,
        filled: int,
        ids: list[int],
        read_back: Callable[[], list[int]],
    ) -> _PartitionRemoval | None:
        """The removal of ``context``'s partition 0, when it can be done.

        :param filled: the partitions that get records at the start (partition 0 and one
            more at least: the others keep the pipeline going once it is gone).
        """
        remove = getattr(context, "remove_partition", None)
        turned_off = "partition-removal" in stated_reasons(context)
        if not callable(remove) or turned_off or traits.equal_partitions or filled < 2:
            return None
        return cls(remove, frozenset(ids[:REMOVED_RECORDS]), read_back)

    def attempt(self, when: str) -> None:
        """Remove partition 0 now if it is still there and the reader has all its records."""
        if self.removed or self.error or not self.records <= set(self.read_back()):
            return
        try:
            self.remove(0)
        except Exception as raised:  # noqa: BLE001 - the context's own code: reported
            self.error = (
                f"the test context's remove_partition(0) raised {type(raised).__name__}: {raised}"
            )
        else:
            self.removed = when

    def outcome(self) -> str:
        """What happened to partition 0 in the case, for its schedule in the report."""
        if self.removed:
            return f"partition 0 removed {self.removed}"
        return "partition 0 not removed: the reader did not have all its records in time"


@dataclass(slots=True)
class _Case:
    """One pipeline around the connector under test, in its own directory."""

    directory: Path
    pipeline: SparkPipeline
    ids: list[int]
    exactly_once: bool
    range_readable: bool
    read_back: Callable[[], Sequence[int] | None]
    close: Callable[[], None]
    arrive: Callable[[], int] | None = None
    """Append a micro-batch of new records to a live source, across its partitions, while a
    run goes on or its driver is down; returns how many (``None``: the source is not live)."""
    source_under_test: bool = False
    """Whether the connector under test is the pipeline's source (its sink is ``memory``)."""
    removal: _PartitionRemoval | None = None
    """A source under test's partition 0, removed while the pipeline goes on."""

    @classmethod
    def build(cls, target: Target, directory: Path, ids: list[int]) -> _Case:
        if target.role is ConnectorRole.SINK:
            return cls._sink_case(target, directory, ids)
        return cls._source_case(target, directory, ids)

    @classmethod
    def _sink_case(cls, target: Target, directory: Path, ids: list[int]) -> _Case:
        context: SinkTestContext = target.sink_context()
        if context.committed_ids() is None:
            context.close()
            skip(
                "read-back",
                "the test context cannot read the destination back (committed_ids() is None)",
            )
        records = directory / "records.parquet"
        batch = context.batch(ids)
        parquet.write_table(
            pa.Table.from_batches([batch]).append_column(RECORD_KEY, pa.array(ids, pa.int64())),
            records,
        )
        sink = target.plugins.registry.create_sink(target.connector)
        exactly_once = sink.capabilities().exactly_once
        writer_kill = (
            "" if sink.as_distributed_commit() is not None else _epoch_writer_kill(target, ids)
        )
        pipeline = SparkPipeline(
            source="generator",
            source_options={
                "rows": str(len(ids) // GENERATOR_PARTITIONS),
                "partitions": str(GENERATOR_PARTITIONS),
                "batch_size": str(IDS_PER_EPOCH // 2),
            },
            sink=target.connector,
            sink_options=dict(context.config().properties),
            checkpoint_location=str(directory / "checkpoint"),
            delivery="exactly-once" if exactly_once else "at-least-once",
            max_records_per_batch=IDS_PER_EPOCH,
            transform=IdsTransform(TAKE_RECORDS, str(records)),
            epoch_writer_kills=writer_kill,
        )
        return cls(
            directory, pipeline, ids, exactly_once, True, context.committed_ids, context.close
        )

    @classmethod
    def _source_case(cls, target: Target, directory: Path, ids: list[int]) -> _Case:
        from pyspark import cloudpickle  # noqa: PLC0415 - only when Spark runs

        traits = source_traits(target)
        context: SourceTestContext = target.source_context()
        partitions = traits.partitions
        ids = ids[: len(ids) - len(ids) % partitions] if traits.equal_partitions else list(ids)
        sink = directory / "sink"

        def read_back() -> list[int]:
            return MemorySink.committed_ids(sink) if sink.exists() else []

        def append(fresh: list[int], into: Sequence[int]) -> None:
            for share, partition in enumerate(into):
                context.append(fresh[share :: len(into)], partition if partitions > 1 else None)

        # A live source's last partition is first written while the first run to be killed
        # goes on (a topic's partitions increased, a new file under a directory): the pipeline
        # must read it from its beginning, once.
        appears = partitions > 1 and traits.live_appends and not traits.equal_partitions
        filled = range(partitions - 1 if appears else partitions)
        removal = _PartitionRemoval.of(context, traits, len(filled), ids, read_back)
        if removal is None:
            append(ids, filled)
        else:
            append(sorted(removal.records), [0])
            append(ids[len(removal.records) :], filled[1:])
        arriving = range(1 if removal else 0, partitions)
        fresh_ids = itertools.count(max(ids, default=-1) + 1)

        def arrive() -> int:
            fresh = [next(fresh_ids) for _ in range(IDS_PER_EPOCH - IDS_PER_EPOCH % partitions)]
            append(fresh, arriving)
            ids.extend(fresh)
            return len(fresh)

        try:
            pickled: bytes = cloudpickle.dumps(context.ids)  # type: ignore[no-untyped-call]
            pickle.loads(pickled)  # noqa: S301 - what was just pickled here
        except Exception as error:  # noqa: BLE001 - any pickling failure means the same
            context.close()
            skip(
                "spark",
                f"the test context's ids() cannot be shipped to Spark's executors "
                f"({type(error).__name__}: {error}): keep clients out of the context's "
                "state, or open them lazily",
            )
        (directory / "ids.pickle").write_bytes(pickled)
        source = target.plugins.registry.create_source(target.connector)
        replays = source.supports_replay()
        pipeline = SparkPipeline(
            source=target.connector,
            source_options=dict(context.config().properties),
            sink="memory",
            sink_options={"path": str(sink)},
            checkpoint_location=str(directory / "checkpoint"),
            delivery="exactly-once" if replays else "at-least-once",
            max_records_per_batch=IDS_PER_EPOCH,
            transform=IdsTransform(CONTEXT_IDS, str(directory / "ids.pickle")),
        )
        range_readable = source.as_range_readable() is not None
        return cls(
            directory,
            pipeline,
            ids,
            replays,
            range_readable,
            read_back,
            context.close,
            arrive if traits.live_appends else None,
            source_under_test=True,
            removal=removal,
        )

    def arriving(self, when: str, *, last: bool = False) -> Callable[[], int] | None:
        """What to do each time the pipeline goes on, returning how many ids it appended.

        Remove partition 0 if a reader has all its records by then (said to happen ``when``),
        then append new records (:attr:`arrive`) — but not in the ``last`` run, which must
        find everything there when it starts (``availableNow``). ``None``: nothing to do.
        """
        arrive, removal = None if last else self.arrive, self.removal
        if removal is None:
            return arrive

        def go_on() -> int:
            removal.attempt(when)
            return arrive() if arrive is not None else 0

        return go_on

    def read_again(self) -> str:
        """Why the run has failed already, for a source under test that reads records again.

        Certain while the run goes on, and never right: with exactly-once delivery, an id the
        reader sees twice; in any case, more ids than twice those appended (a source that keeps
        returning what it returned before never ends, and would run to the timeout). ``""``
        when neither.
        """
        visible = Counter(self.read_back() or ())
        twice = sorted(record for record, count in visible.items() if count > 1)
        if twice and self.exactly_once:
            return (
                f"ids {_shown(twice)} ({len(twice)}) were delivered twice with exactly-once "
                "delivery while the pipeline ran: the source returned records again (does "
                "restore() resume after the checkpoint's offsets?)"
            )
        if read_enough(visible.total(), len(self.ids)):
            return (
                f"the reader saw {visible.total()} records of {len(self.ids)} ids appended "
                "while the pipeline ran: the source keeps returning records it returned before "
                "(does restore() resume after the checkpoint's offsets?)"
            )
        return ""

    def delivery_problems(self) -> list[str]:
        """How what a reader sees now differs from every id once (or at least once)."""
        visible = Counter(self.read_back() or ())
        expected = set(self.ids)
        lost = sorted(expected - set(visible))
        problems = [f"lost ids {_shown(lost)} ({len(lost)} of {len(self.ids)})"] if lost else []
        unknown = sorted(set(visible) - expected)
        if unknown:
            problems.append(f"ids nobody wrote are visible: {_shown(unknown)}")
        twice = sorted(record for record, count in visible.items() if count > 1)
        if twice and self.exactly_once:
            problems.append(
                f"duplicated ids {_shown(twice)} ({len(twice)}) with exactly-once delivery: "
                "an epoch was committed twice, or a rolled-back epoch left a trace"
            )
        return problems


def _shown(ids: list[int]) -> str:
    return json.dumps(ids if len(ids) <= 12 else [*ids[:12], "..."])


def run_spark_layer(
    target: Target,
    figures: Figures,
    plugins: Sequence[object],
    request: pytest.FixtureRequest,
    early: EarlyDrivers | None = None,
) -> None:
    """The Spark check: cases of the profile's crash schedules, drawn with the run's seed.

    ``--laminar-spark-crashes`` sets the schedule instead (one case). Each run is announced on
    the terminal; the schedules run are kept in the check's user properties for the report.

    :raises pytest.skip.Exception: when the layer is switched off, or pyspark is missing.
    :raises ConfigurationError: for a malformed ``--laminar-spark-crashes``.
    """
    config = request.config
    reason = spark_skip_reason(config)
    if reason is not None:
        skip("spark", reason)
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")

    def progress(line: str) -> None:
        if terminal is None:
            return
        # Shown as it happens: a Spark run takes tens of seconds.
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            terminal.write_line(f"    laminar conformance: {target.connector}: {line}")

    layer = SparkLayer(target, figures, plugins, progress, early)
    try:
        _run_cases(layer, config)
    finally:
        schedules = "; ".join(layer.schedules_run)
        request.node.user_properties.append((SPARK_SCHEDULES_PROPERTY, schedules))


def pinned_schedule(config: pytest.Config) -> tuple[CrashPoint, ...] | None:
    """The crash schedule ``--laminar-spark-crashes`` pins (one case), or ``None``."""
    pinned = config.getoption(SPARK_CRASHES_OPTION, None)
    if not pinned:
        return None
    return CrashPoint.parse_schedule(pinned, SPARK_CRASHES_FLAG)


def _run_cases(layer: SparkLayer, config: pytest.Config) -> None:
    target = layer.target
    pinned = pinned_schedule(config)
    if pinned is not None:
        layer.run_case(pinned)
        return
    from hypothesis import Phase, given, settings  # noqa: PLC0415 - after pytest's rewriting

    @given(schedule=layer.schedules())
    def case(schedule: tuple[CrashPoint, ...]) -> None:
        layer.run_case(schedule)

    # Cases take tens of seconds: no shrinking, no replay of earlier failures.
    chosen = settings(
        target.settings(target.profile.spark_cases),
        phases=[Phase.explicit, Phase.generate],
        database=None,
    )
    target.seeded(chosen(case))()
