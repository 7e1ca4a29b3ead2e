"""The Kafka plugin's test helpers: topics on the session's broker, producers, and readers."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

CLIENT_LOGGER = logging.getLogger("tests.kafka.librdkafka")


def wait_until_visible(admin: AdminClient, topic: str, partitions: int) -> None:
    """Wait until a topic just created has a leader for each partition (metadata lags)."""
    deadline = time.monotonic() + 30
    while True:
        found = admin.list_topics(topic, timeout=30).topics.get(topic)
        if (
            found is not None
            and found.error is None
            and len(found.partitions) == partitions
            and all(p.leader >= 0 for p in found.partitions.values())
        ):
            return
        assert time.monotonic() < deadline, f"topic {topic} never became ready"
        time.sleep(0.05)


def end_offset(consumer: Consumer, partition: TopicPartition) -> int:
    """The partition's last stable offset, asking again while the broker (re)starts."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return consumer.get_watermark_offsets(partition, timeout=30)[1]
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@dataclass
class Kafka:
    """The session's broker, and the topics one test made on it."""

    bootstrap: str
    admin: AdminClient
    topics: list[str] = field(default_factory=list)

    def topic(self, partitions: int = 1, *, config: dict[str, str] | None = None) -> str:
        """A new topic with a unique name."""
        name = f"test-{uuid.uuid4().hex[:12]}"
        new = NewTopic(name, num_partitions=partitions, config=config or {})
        self.admin.create_topics([new])[name].result(timeout=30)
        self.topics.append(name)
        wait_until_visible(self.admin, name, partitions)
        return name

    def producer(self, **settings: object) -> Producer:
        return Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "enable.idempotence": True,
                "logger": CLIENT_LOGGER,
                **settings,
            }
        )

    def produce(
        self,
        topic: str,
        values: Sequence[bytes | None],
        *,
        partition: int = 0,
        keys: Sequence[bytes | None] | None = None,
        headers: list[tuple[str, bytes]] | None = None,
        timestamp_ms: int = 0,
    ) -> None:
        """Produce ``values`` to ``partition`` and wait until all are acknowledged."""
        producer = self.producer()
        for index, value in enumerate(values):
            producer.produce(
                topic,
                value,
                None if keys is None else keys[index],
                partition,
                timestamp=timestamp_ms,
                headers=headers,
            )
        assert producer.flush(30) == 0

    def transactional_producer(self, name: str | None = None) -> Producer:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": name or f"test-tx-{uuid.uuid4().hex[:8]}",
                "linger.ms": 1,
                "logger": CLIENT_LOGGER,
            }
        )
        producer.init_transactions(30)
        return producer

    def committed_values(
        self, topic: str, partitions: int = 1, *, timeout_s: float = 30
    ) -> list[bytes | None]:
        """Every value a ``read_committed`` consumer sees now, partition by partition."""
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"test-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 10,
                "logger": CLIENT_LOGGER,
            }
        )
        try:
            keys = [TopicPartition(topic, p) for p in range(partitions)]
            ends = {tp.partition: end_offset(consumer, tp) for tp in keys}
            # Leaders known first: an offset "beginning" waits 500 ms for them otherwise.
            consumer.list_topics(topic, timeout=30)
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
            positions = dict.fromkeys(range(partitions), 0)
            values: dict[int, list[bytes | None]] = {p: [] for p in range(partitions)}
            deadline = time.monotonic() + timeout_s
            while any(positions[p] < ends[p] for p in positions):
                assert time.monotonic() < deadline, f"could not read {topic} to {ends}"
                for message in consumer.consume(1000, 0.1):
                    error = message.error()
                    partition = message.partition() or 0
                    offset = message.offset() or 0
                    if error is not None:
                        assert error.code() == KafkaError._PARTITION_EOF, error
                        positions[partition] = max(positions[partition], offset)
                        continue
                    if offset < ends[partition]:
                        values[partition].append(message.value())
                    positions[partition] = max(positions[partition], offset + 1)
            return [value for p in range(partitions) for value in values[p]]
        finally:
            consumer.close()

    def committed_ids(self, topic: str, partitions: int = 1) -> list[int]:
        return sorted(int(value or b"-1") for value in self.committed_values(topic, partitions))

    def topic_settings(self, topic: str) -> tuple[int, dict[str, str]] | None:
        """``topic``'s partition count and configuration values; ``None`` when it does not exist."""
        found = self.admin.list_topics(topic, timeout=30).topics.get(topic)
        if found is None or found.error is not None:
            return None
        resource = ConfigResource(ResourceType.TOPIC, topic)
        entries = self.admin.describe_configs([resource])[resource].result(timeout=30)
        return len(found.partitions), {name: entry.value for name, entry in entries.items()}
