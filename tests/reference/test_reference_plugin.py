"""The reference connectors as a plugin: found through the real entry point, and well-behaved."""

from __future__ import annotations

import pytest

from laminar_sdk import (
    Closed,
    ConfigurationError,
    ConnectorConfig,
    ConnectorRole,
    InvalidState,
    SinkConnector,
    load_connector_registry,
)
from laminar_sdk.reference import GeneratorSource, MemorySink, MemorySource, NullSink

EXPECTED = {
    ("generator", ConnectorRole.SOURCE): GeneratorSource,
    ("memory", ConnectorRole.SOURCE): MemorySource,
    ("memory", ConnectorRole.SINK): MemorySink,
    ("null", ConnectorRole.SINK): NullSink,
}


def test_the_installed_entry_point_registers_every_reference_connector():
    registry = load_connector_registry(environ={})
    found = {
        (spec.name, spec.role): spec for spec in registry if spec.distribution == "laminar-sdk"
    }
    assert set(found) == set(EXPECTED)
    for key, spec in found.items():
        assert type(spec.create()) is EXPECTED[key]
        assert spec.description
        assert spec.config_keys, f"{spec.name} declares its keys"
        for config_key in spec.config_keys:
            assert config_key.description, f"{spec.name}.{config_key.name} is described"
            assert (
                config_key.required
                or config_key.default is not None
                or (spec.name == "null" and config_key.name == "path")
            ), f"{spec.name}.{config_key.name} has a default"


def test_opening_through_the_registry_applies_defaults_and_names_bad_keys(run, tmp_path):
    registry = load_connector_registry(environ={})
    source, config = run(registry.open_source("generator", {"rows": "3"}))
    assert config.get("partitions") == "1"
    assert run(source.poll_batch(10)).num_rows == 3
    with pytest.raises(ConfigurationError, match="did you mean 'rows'") as error:
        run(registry.open_source("generator", {"rowz": "3"}))
    assert error.value.key == "rowz"
    with pytest.raises(ConfigurationError) as error:
        run(registry.open_sink("memory", {}))
    assert error.value.key == "path"
    sink, _ = run(registry.open_sink("memory", {"path": str(tmp_path)}))
    assert sink.capabilities().exactly_once


def configs(tmp_path) -> dict[type, ConnectorConfig]:
    return {
        GeneratorSource: ConnectorConfig("generator", {}),
        MemorySource: ConnectorConfig("memory", {"path": str(tmp_path / "source")}),
        MemorySink: ConnectorConfig("memory", {"path": str(tmp_path / "sink")}),
        NullSink: ConnectorConfig("null", {}),
    }


def first_call(run, connector):
    """The connector's first I/O call after open: polling a source, beginning an epoch."""
    if isinstance(connector, SinkConnector):
        return run(connector.begin_epoch(0))
    return run(connector.poll_batch(1))


@pytest.mark.parametrize("connector_type", list(EXPECTED.values()))
def test_calls_before_open_after_close_and_a_second_open_are_refused(run, tmp_path, connector_type):
    config = configs(tmp_path)[connector_type]
    connector = connector_type()
    with pytest.raises(InvalidState, match="open"):
        first_call(run, connector)
    run(connector.open(config))
    with pytest.raises(InvalidState, match="already open"):
        run(connector.open(config))
    first_call(run, connector)
    run(connector.close())
    run(connector.close())
    with pytest.raises(Closed):
        first_call(run, connector)
    with pytest.raises(Closed):
        run(connector.open(config))
