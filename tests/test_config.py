"""Connector configuration: reading, validation, and secrets that never show."""

from __future__ import annotations

import json
import logging
import pickle

import pytest

from laminar_sdk import (
    REDACTED,
    ConfigKeySpec,
    ConfigurationError,
    ConnectorConfig,
    redact_secrets,
)

SPECS = (
    ConfigKeySpec("bootstrap.servers", required=True, description="Kafka brokers"),
    ConfigKeySpec("batch.size", default="500", value_type=int),
    ConfigKeySpec("linger.ratio", default="0.5", value_type=float),
    ConfigKeySpec("enable.idempotence", default="true", value_type=bool),
    ConfigKeySpec("auth.credential", secret=True, value_type=int),
    ConfigKeySpec("sasl.password", secret=True),
    ConfigKeySpec("opaque", secret=True),
)
SECRET = "hunter2-S3CR3T"


def config(**properties: str) -> ConnectorConfig:
    return ConnectorConfig("kafka", {k.replace("_", "."): v for k, v in properties.items()})


def test_require_and_get():
    cfg = config(bootstrap_servers="localhost:9092")
    assert cfg.require("bootstrap.servers") == "localhost:9092"
    assert cfg.get("bootstrap.servers") == "localhost:9092"
    assert cfg.get("topic") is None
    assert cfg.get("topic", "events") == "events"
    assert "bootstrap.servers" in cfg
    assert len(cfg) == 1
    assert cfg.keys() == ["bootstrap.servers"]
    with pytest.raises(
        ConfigurationError, match="kafka: missing required config key 'topic'"
    ) as info:
        cfg.require("topic")
    assert info.value.key == "topic"


def test_get_parsed():
    cfg = config(batch_size="100", enable_idempotence="No", ratio="0.25")
    assert cfg.get_parsed("batch.size", int) == 100
    assert cfg.get_parsed("enable.idempotence", bool) is False
    assert cfg.get_parsed("ratio", float) == 0.25
    assert cfg.get_parsed("absent", int) is None
    assert cfg.get_parsed("absent", int, 7) == 7
    with pytest.raises(ConfigurationError, match="'batch.size' must be float") as info:
        config(batch_size="ten").get_parsed("batch.size", float)
    assert info.value.key == "batch.size"


def test_properties_with_prefix():
    cfg = config(kafka_acks="all", kafka_linger_ms="5", topic="t")
    assert cfg.properties_with_prefix("kafka.") == {"acks": "all", "linger.ms": "5"}
    assert cfg.properties_with_prefix("nothing.") == {}


def test_validate_applies_defaults_and_keeps_given_values():
    validated = config(bootstrap_servers="b:9092", batch_size="42").validate(SPECS)
    assert validated.properties == {
        "bootstrap.servers": "b:9092",
        "batch.size": "42",
        "linger.ratio": "0.5",
        "enable.idempotence": "true",
    }


def test_validate_missing_required_key_names_it():
    with pytest.raises(
        ConfigurationError, match="missing required config key 'bootstrap.servers'"
    ) as info:
        config(batch_size="1").validate(SPECS)
    assert info.value.key == "bootstrap.servers"
    assert "Kafka brokers" in str(info.value)


def test_validate_unknown_key_names_it_and_suggests():
    with pytest.raises(
        ConfigurationError, match="unknown config key 'batch.sise'; did you mean 'batch.size'"
    ) as info:
        config(bootstrap_servers="b", batch_sise="1").validate(SPECS)
    assert info.value.key == "batch.sise"
    with pytest.raises(ConfigurationError, match="unknown config key 'zzz'; accepted keys: "):
        config(bootstrap_servers="b", zzz="1").validate(SPECS)


def test_validate_allows_declared_prefixes():
    validated = config(bootstrap_servers="b", kafka_acks="all").validate(
        SPECS, allow_prefixes=["kafka."]
    )
    assert validated.get("kafka.acks") == "all"


@pytest.mark.parametrize(
    ("key", "value", "type_name"),
    [
        ("batch.size", "1.5", "int"),
        ("linger.ratio", "fast", "float"),
        ("enable.idempotence", "maybe", "bool"),
    ],
)
def test_validate_wrong_type_names_key_and_type(key, value, type_name):
    with pytest.raises(
        ConfigurationError, match=f"'{key}' must be {type_name}, got '{value}'"
    ) as info:
        ConnectorConfig("kafka", {"bootstrap.servers": "b", key: value}).validate(SPECS)
    assert info.value.key == key


def test_non_string_values_are_rejected_with_the_key():
    with pytest.raises(ConfigurationError, match="'batch.size' must be a string") as info:
        ConnectorConfig("kafka", {"batch.size": 5})  # type: ignore[dict-item]
    assert info.value.key == "batch.size"


def test_spec_declaration_errors():
    with pytest.raises(TypeError, match="value_type"):
        ConfigKeySpec("x", value_type=list)
    with pytest.raises(TypeError, match="required key cannot have a default"):
        ConfigKeySpec("x", required=True, default="1")


# Secrets ---------------------------------------------------------------------------------


def secret_config() -> ConnectorConfig:
    return ConnectorConfig(
        "kafka",
        {"bootstrap.servers": "b", "sasl.password": SECRET, "opaque": SECRET, "plain": "visible"},
    ).validate(SPECS, allow_prefixes=["plain"])


def test_secrets_never_render(caplog):
    cfg = secret_config()
    renderings = [
        repr(cfg),
        str(cfg),
        f"{cfg}",
        f"{cfg!r}",
        "%s" % (cfg,),  # noqa: UP031 - the %-operator is a rendering users reach for
        json.dumps(cfg.redacted()),
    ]
    with caplog.at_level(logging.INFO):
        logging.getLogger("laminar.test").info("opening with %s", cfg)
        logging.getLogger("laminar.test").info("opening with %r", cfg)
    renderings.append(caplog.text)
    for rendering in renderings:
        assert SECRET not in rendering
        assert REDACTED in rendering
        assert "visible" in rendering, "non-secret values stay readable"
    assert cfg.require("sasl.password") == SECRET, "the connector itself can read it"


# Every form of a password inside a connection string that drivers accept.
CONNECTION_STRINGS = [
    f"host=db password={SECRET} dbname=app",
    f"host=db PASSWORD = '{SECRET} with \\' a quote' user=loader",
    f"postgresql://loader:{SECRET}@db:5432/app",
    f"postgresql://loader:{SECRET}@with-an-at@db/app?sslmode=require",
    f"postgresql://loader@db:5432/app?password={SECRET}",
    f"postgres://loader@db/app?sslmode=require&PassWord={SECRET}",
    f"Server=db;Password={SECRET};Database=app",
]


@pytest.mark.parametrize("value", CONNECTION_STRINGS)
def test_a_password_inside_a_connection_string_never_renders(value):
    cfg = ConnectorConfig("postgres", {"dsn": value, "table": "visible"})
    for rendering in (repr(cfg), str(cfg), json.dumps(cfg.redacted()), redact_secrets(value)):
        assert SECRET not in rendering
        assert "with-an-at" not in rendering, "the password runs to the host's @"
        assert REDACTED in rendering
        assert "db" in rendering, "the rest of the string stays readable"
    assert cfg.require("dsn") == value, "the connector itself reads the whole string"


@pytest.mark.parametrize(
    "value", ["host=db user=loader dbname=app", "https://example.com/a:b@c", "passwords=2"]
)
def test_a_connection_string_without_a_password_is_shown_as_written(value):
    assert redact_secrets(value) == value
    assert ConnectorConfig("x", {"dsn": value}).redacted() == {"dsn": value}


def test_a_key_check_refuses_a_value_wherever_the_config_is_validated():
    def check(value: str) -> str | None:
        return "it must not end in a slash" if value.endswith("/") else None

    specs = [ConfigKeySpec("path", required=True, check=check)]
    assert ConnectorConfig("files", {"path": "/data"}).validate(specs).require("path") == "/data"
    with pytest.raises(ConfigurationError) as caught:
        ConnectorConfig("files", {"path": "/data/"}).validate(specs)
    assert str(caught.value) == "files: path: it must not end in a slash"
    assert caught.value.key == "path"


def test_declared_secret_without_a_secret_looking_name_is_redacted():
    cfg = secret_config()
    assert cfg.is_secret("opaque")
    assert cfg.redacted()["opaque"] == REDACTED


def test_secret_looking_names_are_redacted_without_a_spec():
    cfg = ConnectorConfig(
        "s3", {"aws.secret.access.key": SECRET, "api_key": SECRET, "token": SECRET}
    )
    assert SECRET not in repr(cfg)
    assert set(cfg.redacted().values()) == {REDACTED}


def test_secret_values_stay_out_of_error_messages():
    bad = ConnectorConfig("kafka", {"bootstrap.servers": "b", "auth.credential": SECRET})
    with pytest.raises(ConfigurationError) as info:
        bad.validate(SPECS)
    assert info.value.key == "auth.credential"
    assert SECRET not in str(info.value)
    assert REDACTED in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        ConnectorConfig("kafka", {"db.password": 12345})  # type: ignore[dict-item]
    assert "12345" not in str(info.value)


def test_pickle_keeps_values_and_secret_marks_for_executors():
    cfg = secret_config()
    restored = pickle.loads(pickle.dumps(cfg))
    assert restored == cfg
    assert restored.require("opaque") == SECRET
    assert SECRET not in repr(restored)


def test_config_is_not_a_mapping_so_dict_cannot_leak_secrets():
    with pytest.raises(TypeError):
        dict(secret_config())  # type: ignore[call-overload]
