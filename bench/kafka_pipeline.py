"""Throughput of Kafka -> Spark -> Kafka through laminar, exactly once, against Spark's own.

One run starts a Kafka broker (``laminar_conformance.services.kafka_service()``: the cluster
named by ``LAMINAR_KAFKA_BOOTSTRAP``, else a local one), produces N messages of ``--size``
bytes (a sequence number, then random bytes: they do not compress) to an input topic of
``--partitions`` partitions — a steady backlog, 5M messages of 1 KiB by default — and times
four ways to move them:

- laminar pipeline: ``format("laminar")`` ``kafka`` source -> ``kafka`` sink on Spark
  ``local[2]``, exactly once (a Kafka transaction per micro-batch);
- Spark's own pipeline: ``format("kafka")`` source -> sink, with the ``spark-sql-kafka-0-10``
  jars from Maven Central (its sink is at-least-once);
- laminar source: the ``kafka`` source connector's ``poll_batch`` loop, in this process;
- plain consumer: a confluent-kafka ``consume()`` loop, in this process, with the fetch
  settings of the source's consumer (``fetch.wait.max.ms=100``, ``fetch.queue.backoff.ms=10``:
  under librdkafka's default of 1 s, a reader that empties the client's 64 MiB of prefetched
  messages waits out that pause, and the bench would time the pauses, not the loop).
  ``--no-readers`` leaves these two out; ``--readers-only`` runs only them (no Spark, no
  warm-up topic).

Each Spark pipeline runs in a process of its own (its own session and JVM: the Kafka jars are
set at session start) on ``local[2]``, each with its own default micro-batch size (laminar:
everything available up to ``laminar.max.bytes.per.batch``; Spark: everything available), or
both with ``--batch-messages`` (the laminar one's ``laminar.max.records.per.batch``, Spark's
``maxOffsetsPerTrigger``). Each process first runs its query once, untimed, on a warm-up topic
(``--warm-up`` messages, at most 1M by default: Python workers started, JVM classes loaded and
their hot code compiled), then ``--repeat`` timed queries, each from building it until
``trigger(availableNow=True)`` finishes, each into a topic of its own. (After a warm-up of
10,000 messages, five timed queries of Spark's own pipeline in a row took 4.88, 3.31, 2.73,
2.47 and 2.53 s: a median of three then weighed the JVM's warming up as much as the pipeline.)
Every output topic is read back with ``isolation.level=read_committed`` and then deleted: a
laminar one must hold every message exactly once (else the run fails); duplicates in Spark's
are reported. For a laminar output, the time its one producer took for each epoch is printed:
from the epoch's first record to its epoch marker, by the records' timestamps (the flush and
the commit come after). The child processes print, on standard error, where each query's time
went (Spark's phases) and the peak memory of their Python processes. The in-process readers,
taking turns, each read all N messages from the start ``--repeat`` times and sum the bytes of
their values. Times and ratios are medians; the readers' ratio is also printed for each
turn (issue 39: the source >= 0.8x the plain consumer).

Usage::

    python bench/kafka_pipeline.py [--messages 5000000] [--size 1024] [--partitions 2]
        [--batch-messages N] [--warm-up MESSAGES] [--repeat 3] [--no-readers | --readers-only]
        [--compare-epoch-writer] [--spark-kafka-version VERSION] [--spark-kafka-pin G:A:V]

``--compare-epoch-writer`` also times the laminar pipeline with ``laminar.epoch.writer=false``
(the commit writes each micro-batch once its tasks have ended), in a process of its own.

``--spark-kafka-version`` defaults to the installed PySpark's version; name another release
when the Maven repository has no ``spark-sql-kafka-0-10_2.13`` of that version, and pin with
``--spark-kafka-pin`` (repeatable) the version of a dependency it lacks, e.g.
``--spark-kafka-version 4.2.0 --spark-kafka-pin
org.apache.spark:spark-token-provider-kafka-0-10_2.13:4.0.0``.

Prints each variant's time and messages/s and the ratios. Target (issue 39): the laminar
pipeline >= 1.0x Spark's own pipeline, while giving exactly-once, which Spark's sink does not.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import bisect
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc
import pyspark
from _memory import PeakRss, print_peaks
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from laminar_conformance.services import ServiceError, die_with_parent, kafka_service
from laminar_conformance.services._kafka import resolve_maven_jars
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from laminar_sdk import load_connector_registry, spark_temporary_files_in
from laminar_sdk.spark import build_session

TARGET = 0.8  # the in-process readers (issue 39)
PIPELINE_TARGET = 1.0  # the laminar pipeline against Spark's own (issue 39)
WARM_UP = 1_000_000
SEQUENCE_DIGITS = 12  # each value starts with its sequence number, so duplicates show
# The rest of a value is random bytes, cut from a pool far larger than LZ4's 64 KiB window at
# spread-out places: values do not compress, so no variant gains by compressing what it moves.
PADDING_POOL = 1 << 24
PADDING_STRIDE = 7919
FETCH = 10_000  # messages per consume() call, as the kafka source's batch.size default
SPARK_KAFKA_ARTIFACT = "org.apache.spark:spark-sql-kafka-0-10_2.13"
TIMEOUT_S = 600.0
VARIANTS = ("laminar", "laminar-no-epoch-writer", "spark")
"""The pipelines; the second (``--compare-epoch-writer``) is laminar with
``laminar.epoch.writer=false``: the commit writes each micro-batch once its tasks ended."""
_JAR = re.compile(r"(?P<artifact>.+?)-\d[^_]*\.jar")  # artifact-VERSION.jar


@dataclass(frozen=True, slots=True)
class Route:
    """Where one pipeline run reads and writes."""

    input: str
    output: str


@dataclass(frozen=True, slots=True)
class Topics:
    """The bench's topics, named after the run: the inputs and each query's output.

    :param run: makes the names unique.
    :param repeat: how many timed queries each pipeline runs (each writes a topic of its own).
    """

    run: str
    repeat: int

    def input(self, *, warm_up: bool = False) -> str:
        return f"bench-{'warm-up' if warm_up else 'in'}-{self.run}"

    def routes(self, variant: str) -> list[Route]:
        """The warm-up query's route, then the timed queries'."""
        return [
            Route(self.input(warm_up=True), f"bench-warm-up-{variant}-{self.run}"),
            *(
                Route(self.input(), f"bench-out-{variant}-{attempt}-{self.run}")
                for attempt in range(self.repeat)
            ),
        ]

    def created(self) -> list[str]:
        outputs = [route.output for variant in VARIANTS for route in self.routes(variant)]
        return [self.input(warm_up=True), self.input(), *outputs]

    def made_by_sinks(self) -> list[str]:
        """The laminar sink's epoch-marker topics."""
        return [
            f"{route.output}.laminar-epochs"
            for variant in VARIANTS
            if variant.startswith("laminar")
            for route in self.routes(variant)
        ]


@dataclass(frozen=True, slots=True)
class Contents:
    """What a topic holds, read committed: records, distinct sequence numbers, value bytes.

    ``created_ms``: every record's timestamp (its producer's clock when it was produced).
    """

    records: int
    distinct: int
    value_bytes: int
    created_ms: array.array[int]


# Kafka ------------------------------------------------------------------------------------


def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1) for name in names])
    for future in futures.values():
        future.result(timeout=60)


def delete_topics(bootstrap: str, names: list[str]) -> None:
    """Best effort: on a shared cluster, leave no bench topics behind."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(names, operation_timeout=30).values():
        try:
            future.result(timeout=60)
        except Exception as error:  # noqa: BLE001 - a topic never created is fine
            if "UNKNOWN_TOPIC" not in str(error):
                print(f"note: could not delete a bench topic: {error}", file=sys.stderr)


def produce(bootstrap: str, topic: str, messages: int, size: int, partitions: int) -> float:
    """Produce ``messages`` values of ``size`` bytes, spread evenly; return the seconds taken."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.size": 1 << 20,
            "queue.buffering.max.messages": 500_000,
        }
    )
    padding = size - SEQUENCE_DIGITS
    pool = os.urandom(PADDING_POOL + padding)
    began = time.perf_counter()
    for sequence in range(messages):
        start = sequence * PADDING_STRIDE % PADDING_POOL
        value = b"%012d" % sequence + pool[start : start + padding]
        while True:
            try:
                producer.produce(topic, value, partition=sequence % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120) != 0:
        raise SystemExit(f"producing to {topic}: messages still unacknowledged after 120 s")
    return time.perf_counter() - began


def _partitions(consumer: Consumer, topic: str) -> list[TopicPartition]:
    metadata = consumer.list_topics(topic, timeout=30).topics[topic]
    return [TopicPartition(topic, number, OFFSET_BEGINNING) for number in metadata.partitions]


def _consumer(bootstrap: str, **settings: object) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 100,
            **settings,
        }
    )


def read_back(bootstrap: str, topic: str, expected: int) -> Contents:
    """Read ``topic`` to its end (read committed), counting records and sequence numbers."""
    consumer = _consumer(bootstrap)
    try:
        assignment = _partitions(consumer, topic)
        consumer.assign(assignment)
        seen = bytearray(expected)
        created_ms = array.array("q")
        records = distinct = value_bytes = 0
        ended: set[int] = set()
        deadline = time.monotonic() + TIMEOUT_S
        while len(ended) < len(assignment):
            if time.monotonic() > deadline:
                raise SystemExit(f"reading {topic} back did not reach its end")
            for message in consumer.consume(FETCH, 1.0):
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise SystemExit(f"reading {topic} back: {error}")
                    ended.add(message.partition() or 0)
                    continue
                ended.discard(message.partition() or 0)
                value = message.value() or b""
                created_ms.append(message.timestamp()[1])
                records += 1
                value_bytes += len(value)
                sequence = int(value[:SEQUENCE_DIGITS])
                if 0 <= sequence < expected and not seen[sequence]:
                    seen[sequence] = 1
                    distinct += 1
        return Contents(records, distinct, value_bytes, created_ms)
    finally:
        consumer.close()


def epoch_markers(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    """The laminar sink's epoch markers in ``topic``: (epoch, when it was produced, in ms)."""
    consumer = _consumer(bootstrap)
    try:
        assignment = _partitions(consumer, topic)
        consumer.assign(assignment)
        markers, ended = [], 0
        deadline = time.monotonic() + TIMEOUT_S
        while ended < len(assignment) and time.monotonic() < deadline:
            for message in consumer.consume(FETCH, 1.0):
                if message.error() is not None:
                    ended += message.error().code() == KafkaError._PARTITION_EOF
                    continue
                epoch = json.loads(message.value() or b"{}")["epoch"]
                markers.append((epoch, message.timestamp()[1]))
        return sorted(markers, key=lambda marker: marker[1])
    finally:
        consumer.close()


def produce_spans(markers: list[tuple[int, int]], created_ms: array.array[int]) -> list[str]:
    """Each epoch's records and how long its producer took, from its first record to its marker.

    The sink produces an epoch's records, then its marker, then flushes and commits; the
    epochs follow one another. So the records of an epoch are those produced after the
    previous marker and up to its own.
    """
    created = sorted(created_ms)
    spans, before = [], 0
    for epoch, marker_ms in markers:
        until = bisect.bisect_right(created, marker_ms)
        if until > before:
            seconds = (marker_ms - created[before]) / 1000
            spans.append(f"epoch {epoch}: {until - before} records in {seconds:.2f} s")
        before = until
    return spans


# In-process readers ------------------------------------------------------------------------

READER_FETCH = {"fetch.queue.backoff.ms": 10}
"""The plain consumer's fetch settings beyond ``_consumer``'s: the kafka source's defaults."""


def plain_consumer(bootstrap: str, topic: str, messages: int) -> tuple[float, int]:
    """A confluent-kafka consume() loop reading ``messages`` values; (seconds, value bytes)."""
    began = time.perf_counter()
    consumer = _consumer(bootstrap, **READER_FETCH)
    try:
        consumer.assign(_partitions(consumer, topic))
        read = value_bytes = 0
        deadline = time.monotonic() + TIMEOUT_S
        while read < messages:
            if time.monotonic() > deadline:
                raise SystemExit(f"plain consumer: {read} of {messages} messages read")
            for message in consumer.consume(FETCH, 0.05):
                if message.error() is None:
                    read += 1
                    value_bytes += len(message.value() or b"")
        return time.perf_counter() - began, value_bytes
    finally:
        consumer.close()


async def laminar_source(bootstrap: str, topic: str, messages: int) -> tuple[float, int]:
    """The ``kafka`` source's poll_batch loop reading ``messages``; (seconds, value bytes)."""
    began = time.perf_counter()
    source, _ = await load_connector_registry().open_source(
        "kafka", {"bootstrap.servers": bootstrap, "topic": topic}
    )
    try:
        read = value_bytes = 0
        deadline = time.monotonic() + TIMEOUT_S
        while read < messages:
            if time.monotonic() > deadline:
                raise SystemExit(f"laminar source: {read} of {messages} messages read")
            batch = await source.poll_batch(FETCH)
            if batch is not None:
                read += batch.num_rows
                value_bytes += pc.sum(pc.binary_length(batch.records.column("value"))).as_py()
        return time.perf_counter() - began, value_bytes
    finally:
        await source.close()


# Spark pipelines, each in a process of its own ---------------------------------------------


def spark_kafka_jars(version: str, pinned: list[str]) -> list[str]:
    """The spark-sql-kafka jars and their dependencies, less those PySpark ships already."""
    pins = ",".join(sorted(pinned))
    try:
        libs = resolve_maven_jars(
            [f"{SPARK_KAFKA_ARTIFACT}:{version}"],
            f"spark-sql-kafka/{version}"
            + (f"-{hashlib.sha256(pins.encode()).hexdigest()[:8]}" if pins else ""),
            what=f"{SPARK_KAFKA_ARTIFACT} {version}" + (f" (pinned: {pins})" if pins else ""),
            pinned=pinned,
        )
    except ServiceError as error:
        raise SystemExit(
            f"{error}\n\nname a spark-sql-kafka release the repository has with "
            "--spark-kafka-version, and pin the dependencies it lacks with --spark-kafka-pin "
            "(see the usage in this script's docstring)"
        ) from error
    shipped = {_artifact(jar) for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return sorted(str(jar) for jar in libs.glob("*.jar") if _artifact(jar) not in shipped)


def _artifact(jar: Path) -> str:
    match = _JAR.fullmatch(jar.name)
    return match["artifact"] if match else jar.name


def start_laminar(
    spark: SparkSession,
    bootstrap: str,
    route: Route,
    batch_messages: int,
    work: Path,
    *,
    epoch_writer: bool = True,
) -> StreamingQuery:
    """The laminar pipeline; ``batch_messages`` 0: the default micro-batch size."""
    records = {"laminar.max.records.per.batch": str(batch_messages)} if batch_messages else {}
    return (
        spark.readStream.format("laminar")
        .option("connector", "kafka")
        .option("bootstrap.servers", bootstrap)
        .option("topic", route.input)
        .option("laminar.delivery", "exactly-once")
        .options(**records)
        .load()
        .select("key", "value")
        .writeStream.format("laminar")
        .option("connector", "kafka")
        .option("bootstrap.servers", bootstrap)
        .option("topic", route.output)
        .option("delivery", "exactly-once")
        .option("laminar.delivery", "exactly-once")
        .option("laminar.epoch.writer", str(epoch_writer).lower())
        .option("checkpointLocation", str(work / route.output))
        .trigger(availableNow=True)
        .start()
    )


def start_spark(
    spark: SparkSession, bootstrap: str, route: Route, batch_messages: int, work: Path
) -> StreamingQuery:
    """Spark's own pipeline; ``batch_messages`` 0: the default (everything available)."""
    records = {"maxOffsetsPerTrigger": str(batch_messages)} if batch_messages else {}
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", route.input)
        .option("startingOffsets", "earliest")
        .options(**records)
        .load()
        .select("key", "value")
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", route.output)
        .option("checkpointLocation", str(work / route.output))
        .trigger(availableNow=True)
        .start()
    )


def in_own_process(
    variant: str, bootstrap: str, routes: list[Route], batch_messages: int, jars: list[str]
) -> list[float]:
    """Run one Spark pipeline per route, in order, in a new process (and process group).

    :returns: the seconds each took.
    """
    arguments = [
        sys.executable,
        __file__,
        "--pipeline",
        variant,
        "--pipeline-bootstrap",
        bootstrap,
        "--pipeline-routes",
        json.dumps([[route.input, route.output] for route in routes]),
        "--batch-messages",
        str(batch_messages),
        "--pipeline-jars",
        ",".join(jars),
    ]
    temporary = Path(tempfile.mkdtemp(prefix=f"laminar-bench-kafka-{variant}-tmp-"))
    with subprocess.Popen(
        arguments,
        stdout=subprocess.PIPE,
        text=True,
        env=spark_temporary_files_in(temporary),
        start_new_session=True,
        preexec_fn=die_with_parent,  # noqa: PLW1509 - only calls prctl, safe after fork
    ) as child:
        try:
            output, _ = child.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise SystemExit(
                f"the {variant} pipeline did not finish in {TIMEOUT_S:.0f} s"
            ) from None
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
            shutil.rmtree(temporary, ignore_errors=True)
    if child.returncode != 0:
        raise SystemExit(f"the {variant} pipeline failed (exit {child.returncode}); see above")
    return [float(seconds) for seconds in json.loads(output.strip().splitlines()[-1])]


def pipeline_main(args: argparse.Namespace) -> None:
    """Child process: run the pipeline per route; print their seconds as JSON, last line."""
    routes = [Route(*pair) for pair in json.loads(args.pipeline_routes)]
    start = {
        "laminar": start_laminar,
        "laminar-no-epoch-writer": functools.partial(start_laminar, epoch_writer=False),
        "spark": start_spark,
    }[args.pipeline]
    conf = {"spark.ui.showConsoleProgress": "false"}
    if args.pipeline_jars:
        conf["spark.jars"] = args.pipeline_jars
    work = Path(tempfile.mkdtemp(prefix=f"laminar-bench-kafka-{args.pipeline}-"))
    spark = build_session(**conf)
    spark.sparkContext.setLogLevel("ERROR")
    seconds: list[float] = []
    try:
        with PeakRss() as rss:
            for route in routes:
                began = time.perf_counter()
                query = start(spark, args.pipeline_bootstrap, route, args.batch_messages, work)
                query.awaitTermination()
                seconds.append(time.perf_counter() - began)
                print_breakdown(args.pipeline, query, seconds[-1])
        print(f"  {args.pipeline}: peak RSS of its Python processes", file=sys.stderr)
        print_peaks(rss, sys.stderr)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(seconds), flush=True)


def print_breakdown(variant: str, query: StreamingQuery, seconds: float) -> None:
    """Print on standard error where a query's time went, from Spark's progress reports.

    The micro-batches, and the milliseconds of each phase summed over them (``addBatch``
    holds the tasks and the commit).
    """
    phases: dict[str, int] = {}
    batches = 0
    for progress in query.recentProgress:
        if not progress.get("numInputRows"):
            continue
        batches += 1
        for phase, ms in progress.get("durationMs", {}).items():
            phases[phase] = phases.get(phase, 0) + int(ms)
    shown = ", ".join(f"{phase} {ms}" for phase, ms in sorted(phases.items(), key=lambda p: -p[1]))
    print(
        f"  {variant}: {seconds:.2f} s, {batches} micro-batch(es); ms by phase: {shown}",
        file=sys.stderr,
        flush=True,
    )


# The run ----------------------------------------------------------------------------------


@contextmanager
def bench_topics(bootstrap: str, partitions: int, repeat: int) -> Iterator[Topics]:
    topics = Topics(uuid.uuid4().hex[:8], repeat)
    create_topics(bootstrap, topics.created(), partitions)
    try:
        yield topics
    finally:
        delete_topics(bootstrap, topics.created() + topics.made_by_sinks())


def check(name: str, contents: Contents, messages: int, size: int, exact: bool) -> str:
    """A line on what an output topic holds; exits when the laminar one is not exact."""
    duplicates = contents.records - contents.distinct
    line = (
        f"{name} output: {contents.records} records, {contents.distinct} distinct of "
        f"{messages}, {duplicates} duplicates"
    )
    complete = contents.distinct == messages and contents.value_bytes >= messages * size
    if not complete or (exact and duplicates):
        raise SystemExit(f"FAILED: {line} (expected every message{' exactly once' * exact})")
    return line


def report(name: str, seconds: list[float], messages: int, note: str = "") -> float:
    """Print the median of ``seconds`` (and each of them, when several); return the median."""
    median = statistics.median(seconds)
    each = f"  (each: {', '.join(f'{value:.2f}' for value in seconds)})" if len(seconds) > 1 else ""
    rate = messages / median / 1e3
    print(f"{name:>16}: {median:7.2f} s  {rate:8.1f} k messages/s{each}{note}", flush=True)
    return median


def read_in_process(
    bootstrap: str, topic: str, messages: int, size: int, repeat: int
) -> dict[str, float]:
    """Time both in-process readers ``repeat`` times each, alternating; return the medians.

    Prints each turn's times, their ratio and the load average as it goes.
    """
    seconds: dict[str, list[float]] = {"plain consumer": [], "laminar source": []}
    for turn in range(repeat):
        plain, plain_bytes = plain_consumer(bootstrap, topic, messages)
        source, source_bytes = asyncio.run(laminar_source(bootstrap, topic, messages))
        if plain_bytes != messages * size or source_bytes != messages * size:
            raise SystemExit(
                f"FAILED: values read: plain consumer {plain_bytes} bytes, laminar source "
                f"{source_bytes} bytes; expected {messages * size}"
            )
        seconds["plain consumer"].append(plain)
        seconds["laminar source"].append(source)
        print(
            f"  readers, turn {turn + 1}: plain consumer {plain:.2f} s, laminar source "
            f"{source:.2f} s: {plain / source:.2f}x (load {os.getloadavg()})",
            flush=True,
        )
    return {name: report(name, values, messages) for name, values in seconds.items()}


def run(args: argparse.Namespace) -> None:
    pipelines = not args.readers_only
    jars = spark_kafka_jars(args.spark_kafka_version, args.spark_kafka_pin) if pipelines else []
    messages = args.messages
    batches = f"micro-batches of {args.batch_messages}" if args.batch_messages else "defaults"
    with (
        kafka_service() as kafka,
        bench_topics(kafka.bootstrap_servers, args.partitions, args.repeat) as topics,
    ):
        bootstrap = kafka.bootstrap_servers
        print(
            f"broker {bootstrap} ({kafka.provider.value}); {messages} messages of {args.size} "
            f"bytes, {args.partitions} partitions; "
            + (
                f"{batches}; warm-up {args.warm_up} messages; {args.repeat} timed run(s) each, "
                f"medians; spark-sql-kafka {args.spark_kafka_version}"
                + "".join(f", pinned {pin}" for pin in args.spark_kafka_pin)
                if pipelines
                else f"the in-process readers only, {args.repeat} turn(s) each, medians"
            )
            + f"; load {os.getloadavg()}",
            flush=True,
        )
        if pipelines:
            produce(bootstrap, topics.input(warm_up=True), args.warm_up, args.size, args.partitions)
        produced = produce(bootstrap, topics.input(), messages, args.size, args.partitions)
        report("produce", [produced], messages)
        seconds = {}
        if args.readers:
            seconds = read_in_process(bootstrap, topics.input(), messages, args.size, args.repeat)
        chosen = [v for v in VARIANTS if args.compare_epoch_writer or v != VARIANTS[1]]
        for variant in chosen if pipelines else ():
            routes = topics.routes(variant)
            warm_up, *timed = in_own_process(
                variant, bootstrap, routes, args.batch_messages, jars if variant == "spark" else []
            )
            note = f"  (warm-up query {warm_up:.2f} s)"
            seconds[f"{variant} pipeline"] = report(f"{variant} pipeline", timed, messages, note)
            for route in routes[1:]:
                contents = read_back(bootstrap, route.output, messages)
                laminar = variant.startswith("laminar")
                print(check(variant, contents, messages, args.size, laminar))
                if laminar:
                    markers = epoch_markers(bootstrap, f"{route.output}.laminar-epochs")
                    spans = produce_spans(markers, contents.created_ms)
                    print(f"  produce time per epoch: {'; '.join(spans)}")
                delete_topics(bootstrap, [route.output])  # room on the broker's disk
            print(f"(load {os.getloadavg()})", flush=True)
    if pipelines:
        pipeline = seconds["spark pipeline"] / seconds["laminar pipeline"]
        verdict = "met" if pipeline >= PIPELINE_TARGET else "MISSED"
        print(
            f"laminar pipeline / spark pipeline: {pipeline:.2f}x (target >= "
            f"{PIPELINE_TARGET}x, issue 39: {verdict}; laminar exactly-once, spark at-least-once)"
        )
        if args.compare_epoch_writer:
            without = seconds["spark pipeline"] / seconds["laminar-no-epoch-writer pipeline"]
            print(f"laminar without the epoch writer / spark pipeline: {without:.2f}x")
    if args.readers:
        source = seconds["plain consumer"] / seconds["laminar source"]
        verdict = "met" if source >= TARGET else "MISSED"
        print(
            f"laminar source / plain consumer:   {source:.2f}x "
            f"(target >= {TARGET}x, issue 39: {verdict}; medians; load {os.getloadavg()})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5_000_000)
    parser.add_argument("--size", type=int, default=1024, help="bytes per message value")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument(
        "--batch-messages",
        type=int,
        default=0,
        help="messages per micro-batch for both pipelines (default 0: each one's defaults)",
    )
    parser.add_argument(
        "--warm-up",
        type=int,
        help=f"messages of each untimed warm-up query (default: {WARM_UP:,} at most)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each variant")
    parser.add_argument(
        "--readers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time the in-process readers (the kafka source, a plain consumer)",
    )
    parser.add_argument(
        "--readers-only",
        action="store_true",
        help="time only the in-process readers: no Spark pipeline, no warm-up topic",
    )
    parser.add_argument(
        "--compare-epoch-writer",
        action="store_true",
        help="also time the laminar pipeline with laminar.epoch.writer=false",
    )
    parser.add_argument("--spark-kafka-version", default=pyspark.__version__)
    parser.add_argument("--spark-kafka-pin", action="append", default=[], metavar="G:A:V")
    # Internal: run one Spark pipeline in this process (see in_own_process).
    parser.add_argument("--pipeline", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--pipeline-bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--pipeline-routes", help=argparse.SUPPRESS)
    parser.add_argument("--pipeline-jars", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.warm_up is None:
        args.warm_up = min(args.messages, WARM_UP)
    if args.pipeline:
        pipeline_main(args)
        return
    if args.size < SEQUENCE_DIGITS:
        parser.error(f"--size must be at least {SEQUENCE_DIGITS} (values carry a sequence number)")
    if min(args.messages, args.partitions, args.warm_up, args.repeat) < 1:
        parser.error("--messages, --partitions, --warm-up, --repeat: >= 1")
    if args.batch_messages < 0:
        parser.error("--batch-messages: >= 0 (0: each pipeline's defaults)")
    if args.readers_only and not args.readers:
        parser.error("--readers-only and --no-readers: choose one")
    run(args)


if __name__ == "__main__":
    main()
