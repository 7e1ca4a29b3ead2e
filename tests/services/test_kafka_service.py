"""The Kafka test service: provider selection, and a real broker started from Kafka's jars."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from laminar_conformance.services import (
    KAFKA_BOOTSTRAP_VARIABLE,
    KafkaService,
    LocalKafka,
    ServiceError,
    ServiceProvider,
    choose_kafka_provider,
    docker_engine_available,
    free_port,
    resolve_maven_jars,
)
from laminar_conformance.services import _kafka as kafka_module


def no_docker() -> bool:
    return False


def docker() -> bool:
    return True


def test_an_existing_cluster_named_in_the_environment_wins():
    environ = {KAFKA_BOOTSTRAP_VARIABLE: "kafka-1:9092,kafka-2:9092"}
    assert choose_kafka_provider(environ, docker) is ServiceProvider.EXTERNAL
    assert choose_kafka_provider(environ, no_docker) is ServiceProvider.EXTERNAL


def test_a_container_when_a_docker_engine_answers():
    assert choose_kafka_provider({}, docker) is ServiceProvider.CONTAINER
    assert (
        choose_kafka_provider({KAFKA_BOOTSTRAP_VARIABLE: "  "}, docker) is ServiceProvider.CONTAINER
    )


def test_the_local_launcher_otherwise():
    assert choose_kafka_provider({}, no_docker) is ServiceProvider.LOCAL


def test_the_helpers_other_code_uses_are_exported():
    assert callable(resolve_maven_jars)
    port = free_port()
    assert 1024 <= port <= 65535


def test_probing_for_docker_without_an_engine_leaks_no_socket(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-engine.sock'}")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        assert docker_engine_available() is False
        gc.collect()  # an unclosed socket would be reported (and raised) here


def test_only_a_broker_started_here_can_be_restarted():
    service = KafkaService("kafka-1:9092", ServiceProvider.EXTERNAL)
    assert not service.restartable
    with pytest.raises(ServiceError, match="only a broker started by the local launcher"):
        service.restart()


def test_missing_java_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    monkeypatch.setenv("PATH", str(tmp_path))
    broker = LocalKafka(workdir=tmp_path)
    with pytest.raises(ServiceError, match="no `java` on PATH.*install Java 17"):
        broker.start()


def produce_and_count(bootstrap: str, topic: str, *, produce: int) -> int:
    if produce:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        for i in range(produce):
            producer.produce(topic, value=str(i).encode())
        assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"count-{time.time()}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    seen = 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is not None and message.error() is None:
            seen += 1
        elif seen:
            break
    consumer.close()
    return seen


def test_a_launcher_removes_the_work_directories_of_launchers_that_died(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    script = (
        "import os\n"
        "from laminar_conformance.services import LocalKafka\n"
        "print(LocalKafka()._workdir, flush=True)\n"
        "os._exit(0)  # dies without closing, as a killed test process does\n"
    )
    died = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        check=True,
    )
    abandoned = Path(died.stdout.strip())
    unknown = tmp_path / "laminar-kafka-of-an-older-launcher"
    unknown.mkdir()
    assert abandoned.parent == tmp_path
    assert abandoned.exists()

    living = LocalKafka()
    try:
        assert not abandoned.exists(), "the dead launcher's directory is still there"
        assert unknown.exists(), "a directory without a lock file is not known to be abandoned"
        LocalKafka().close()
        assert living._workdir.exists(), "a living launcher's directory was removed"
    finally:
        living.close()
    assert not living._workdir.exists()


def test_each_broker_gets_a_copy_of_the_formatted_log_directory_with_ids_of_its_own(tmp_path):
    template = tmp_path / "formatted"
    template.mkdir()
    (template / "bootstrap.checkpoint").write_bytes(b"\x00features")
    meta = "#written by the storage tool\nnode.id=1\ndirectory.id=D\nversion=1\ncluster.id=C\n"
    (template / "meta.properties").write_text(meta)
    ids = []
    for broker in ("one", "two"):
        data = tmp_path / broker / "data"
        kafka_module._format_log_directory(data, tmp_path / "no-jars-needed", template)
        assert (data / "bootstrap.checkpoint").read_bytes() == b"\x00features"
        lines = (data / "meta.properties").read_text().splitlines()
        assert [line for line in lines if not line.startswith(("cluster.id", "directory.id"))] == [
            "#written by the storage tool", "node.id=1", "version=1"
        ]  # fmt: skip
        ids.append({line.partition("=")[0]: line.partition("=")[2] for line in lines})
    assert ids[0]["cluster.id"] != ids[1]["cluster.id"]
    assert ids[0]["directory.id"] != ids[1]["directory.id"]
    assert (template / "meta.properties").read_text() == meta, "the template must stay as it was"


@pytest.mark.slow
@pytest.mark.full  # nightly: every Kafka test in CI starts a broker through the launcher
def test_local_broker_serves_clients_survives_a_restart_and_leaves_nothing_behind(tmp_path):
    broker = LocalKafka(workdir=tmp_path)
    with broker:
        assert produce_and_count(broker.bootstrap_servers, "events", produce=25) == 25
        broker.restart(graceful=False)
        assert produce_and_count(broker.bootstrap_servers, "events", produce=0) == 25, (
            "acknowledged records must survive a broker crash"
        )
        pid = broker._process.pid  # checking the process is really gone
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.slow
def test_a_broker_started_from_a_short_lived_thread_outlives_the_thread(monkeypatch, tmp_path):
    # PR_SET_PDEATHSIG fires when the *thread* that forked the broker ends; the launcher forks
    # from a thread that lives as long as the process. The cluster id starts with "-", which
    # kafka-storage takes for an option unless it is given as --cluster-id=ID; and the work
    # directory does not exist yet.
    monkeypatch.setattr(kafka_module, "_cluster_id", lambda: "-" + "A" * 21)
    template = tmp_path / "formatted"  # formatted here, with that id
    monkeypatch.setattr(kafka_module, "_formatted_log_directory", lambda version: template)
    broker = LocalKafka(workdir=tmp_path / "not" / "there")
    started = threading.Thread(target=broker.start)
    started.start()
    started.join()
    try:
        assert broker._process is not None, "the broker did not start"
        assert (template / "meta.properties").is_file(), "the formatted directory was not kept"
        time.sleep(2)  # a broker tied to the ended thread is SIGKILLed at once
        assert broker._process.poll() is None, "the broker died with the thread that started it"
        assert produce_and_count(broker.bootstrap_servers, "events", produce=3) == 3
    finally:
        broker.close()


@pytest.mark.slow
def test_broker_dies_with_the_process_that_started_it(tmp_path):
    script = (
        "import sys, time\n"
        "from laminar_conformance.services import LocalKafka\n"
        "broker = LocalKafka()\n"
        "broker.start()\n"
        "print(broker._process.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True
    ) as starter:
        broker_pid = int(starter.stdout.readline())
        os.kill(broker_pid, 0)  # running
        starter.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(broker_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(broker_pid, signal.SIGKILL)
    pytest.fail("the broker outlived the killed test process")
