"""External systems for conformance tests: start them, or find the ones already running.

Each service is chosen the same way: an address from an environment variable wins (an existing
cluster); otherwise a container where a Docker engine answers; otherwise a process this
package starts on loopback from the system's own published artifacts. Toxiproxy, the proxy of
the network-fault checks, is always a local process (:func:`toxiproxy_server`).
"""

from __future__ import annotations

from laminar_conformance.services._kafka import (
    KAFKA_BOOTSTRAP_VARIABLE,
    KAFKA_PROXIED_VARIABLE,
    KAFKA_VERSION,
    KafkaService,
    LocalKafka,
    ServiceProvider,
    choose_kafka_provider,
    docker_engine_available,
    kafka_service,
    resolve_kafka_jars,
    resolve_maven_jars,
)
from laminar_conformance.services._moto_s3 import S3Endpoint, moto_s3_server
from laminar_conformance.services._postgres import (
    POSTGRES_DSN_VARIABLE,
    POSTGRES_PASSWORD_FILE_VARIABLE,
    POSTGRES_USER,
    SERVER_SETTINGS,
    LocalPostgres,
    PostgresService,
    choose_postgres_provider,
    find_postgres_binaries,
    postgres_service,
)
from laminar_conformance.services._process import ServiceError, die_with_parent, free_port, spawn
from laminar_conformance.services._spark_connect import LocalSparkConnect
from laminar_conformance.services._toxiproxy import (
    TOXIPROXY_SERVER_VARIABLE,
    TOXIPROXY_VERSION,
    Proxy,
    Toxic,
    ToxiproxyServer,
    resolve_toxiproxy_server,
    toxiproxy_server,
)

__all__ = [
    "KAFKA_BOOTSTRAP_VARIABLE",
    "KAFKA_PROXIED_VARIABLE",
    "KAFKA_VERSION",
    "POSTGRES_DSN_VARIABLE",
    "POSTGRES_PASSWORD_FILE_VARIABLE",
    "POSTGRES_USER",
    "SERVER_SETTINGS",
    "TOXIPROXY_SERVER_VARIABLE",
    "TOXIPROXY_VERSION",
    "KafkaService",
    "LocalKafka",
    "LocalPostgres",
    "LocalSparkConnect",
    "PostgresService",
    "Proxy",
    "S3Endpoint",
    "ServiceError",
    "ServiceProvider",
    "Toxic",
    "ToxiproxyServer",
    "choose_kafka_provider",
    "choose_postgres_provider",
    "die_with_parent",
    "docker_engine_available",
    "find_postgres_binaries",
    "free_port",
    "kafka_service",
    "moto_s3_server",
    "postgres_service",
    "resolve_kafka_jars",
    "resolve_maven_jars",
    "resolve_toxiproxy_server",
    "spawn",
    "toxiproxy_server",
]
