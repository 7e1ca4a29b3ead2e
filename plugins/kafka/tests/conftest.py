"""Fixtures of the Kafka plugin's tests: one real broker per session, fresh topics per test."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient
from kafka_testing import CLIENT_LOGGER, Kafka
from laminar_conformance.services import (
    KAFKA_BOOTSTRAP_VARIABLE,
    KAFKA_PROXIED_VARIABLE,
    KafkaService,
    kafka_service,
)
from laminar_sdk import ConnectorRegistry, load_connector_registry

from laminar_plugin_kafka.testing import release_topics


@pytest.fixture(scope="session", autouse=True)
def broker() -> Iterator[KafkaService]:
    """One broker for the session, from the conformance kit's launcher.

    Its address is put in ``LAMINAR_KAFKA_BOOTSTRAP`` too (and its proxied listener in
    ``LAMINAR_KAFKA_PROXIED``), so the plugin's conformance contexts (which ask
    ``kafka_service()``) use this broker instead of starting their own.
    """
    with kafka_service() as service, pytest.MonkeyPatch.context() as environment:
        environment.setenv(KAFKA_BOOTSTRAP_VARIABLE, service.bootstrap_servers)
        if service.proxied is not None:
            environment.setenv(KAFKA_PROXIED_VARIABLE, "=".join(service.proxied))
        try:
            yield service
        finally:
            release_topics()  # the conformance contexts' topics, while the broker runs


@pytest.fixture(scope="session")
def registry() -> ConnectorRegistry:
    """The installed plugins' connectors, the ``kafka`` ones among them."""
    return load_connector_registry()


@pytest.fixture
def kafka(broker: KafkaService) -> Iterator[Kafka]:
    """The broker, and fresh topics for this test (deleted afterwards)."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers, "logger": CLIENT_LOGGER})
    handle = Kafka(broker.bootstrap_servers, admin)
    yield handle
    existing = admin.list_topics(timeout=30).topics
    doomed = [
        name
        for name in existing
        if any(name == topic or name.startswith(topic + ".") for topic in handle.topics)
    ]
    if doomed:
        # Wait: a callback pending when the admin client is collected aborts the process.
        futures = admin.delete_topics(doomed, operation_timeout=30)
        concurrent.futures.wait(list(futures.values()), timeout=60)
