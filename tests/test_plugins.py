"""Plugin discovery through entry points: loading, validation and the registry."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from laminar_sdk import (
    ConfigurationError,
    ConnectorRole,
    PluginError,
    SinkConnector,
    SourceConnector,
    load_connector_registry,
)

# A complete plugin module, parameterised by its connector name. It is written to disk and
# found through a real .dist-info entry point, as pip would install it.
PLUGIN = """
import pyarrow as pa
from laminar_sdk import (
    ConfigKeySpec, SinkConnector, SinkConnectorCapabilities, SourceCheckpoint,
    SourceConnector, WriteResult, hookimpl,
)

SCHEMA = pa.schema([("id", pa.int64())])


class Source(SourceConnector):
    opened_with = None

    async def open(self, config):
        Source.opened_with = config

    async def poll_batch(self, max_records):
        return None

    def schema(self):
        return SCHEMA

    def checkpoint(self):
        return SourceCheckpoint()

    async def restore(self, checkpoint):
        pass

    async def close(self):
        pass


class Sink(SinkConnector):
    async def open(self, config):
        if config.require("path") == "explode":
            raise RuntimeError("cannot open the destination")

    async def write_batch(self, batch):
        return WriteResult(batch.num_rows)

    def schema(self):
        return SCHEMA

    async def close(self):
        pass

    def capabilities(self):
        return SinkConnectorCapabilities().with_exactly_once().with_two_phase_commit()


@hookimpl
def laminar_register_connectors(registry):
    registry.add_source(
        "{name}", Source, description="test source",
        config_keys=[ConfigKeySpec("count", default="3", value_type=int)],
    )
    registry.add_sink("{name}", Sink, config_keys=[ConfigKeySpec("path", required=True)])
"""


def plugin_source(name: str) -> str:
    return PLUGIN.replace("{name}", name)


def test_installed_plugin_registers_source_and_sink(install_distribution, run):
    install_distribution(
        "laminar-plugin-alpha",
        version="2.1.0",
        modules={"alpha_plugin": plugin_source("alpha")},
        plugins={"alpha": "alpha_plugin"},
    )
    registry = load_connector_registry()
    source_spec = registry.get("alpha", ConnectorRole.SOURCE)
    assert (source_spec.distribution, source_spec.version) == ("laminar-plugin-alpha", "2.1.0")
    assert source_spec.description == "test source"
    assert isinstance(registry.create_source("alpha"), SourceConnector)
    assert isinstance(registry.create_sink("alpha"), SinkConnector)
    assert registry.create_sink("alpha") is not registry.create_sink("alpha"), "new each time"

    source, config = run(registry.open_source("alpha", {}))
    assert config.get("count") == "3", "declared defaults are applied before open"
    assert type(source).opened_with is config
    sink, _ = run(registry.open_sink("alpha", {"path": "/tmp/out"}))
    assert sink.capabilities().exactly_once


def test_open_validates_config_before_opening(install_distribution, run):
    install_distribution(
        "laminar-plugin-alpha",
        modules={"alpha_plugin": plugin_source("alpha")},
        plugins={"alpha": "alpha_plugin"},
    )
    registry = load_connector_registry()
    with pytest.raises(ConfigurationError, match="alpha: missing required config key 'path'"):
        run(registry.open_sink("alpha", {}))
    with pytest.raises(ConfigurationError, match="unknown config key 'paht'; did you mean 'path'"):
        run(registry.open_sink("alpha", {"path": "x", "paht": "y"}))
    with pytest.raises(ConfigurationError, match="'count' must be int"):
        run(registry.open_source("alpha", {"count": "many"}))


def test_plugin_raising_in_open_is_reported_with_its_distribution(install_distribution, run):
    install_distribution(
        "laminar-plugin-alpha",
        modules={"alpha_plugin": plugin_source("alpha")},
        plugins={"alpha": "alpha_plugin"},
    )
    registry = load_connector_registry()
    with pytest.raises(
        PluginError,
        match=r"sink connector 'alpha' \(from laminar-plugin-alpha\) raised in open\(\): "
        r"RuntimeError: cannot open",
    ) as info:
        run(registry.open_sink("alpha", {"path": "explode"}))
    assert isinstance(info.value.__cause__, RuntimeError)


def test_unknown_connector_lists_installed_ones(install_distribution):
    install_distribution(
        "laminar-plugin-alpha",
        modules={"alpha_plugin": plugin_source("alpha")},
        plugins={"alpha": "alpha_plugin"},
    )
    registry = load_connector_registry()
    with pytest.raises(
        ConfigurationError,
        match=r"no sink connector named 'alhpa' is installed; installed: .*alpha",
    ) as info:
        registry.get("alhpa", ConnectorRole.SINK)
    assert info.value.key == "connector"
    with pytest.raises(
        ConfigurationError,
        match="'alpha' is both a source and a sink connector: say which role with "
        "--role source or --role sink",
    ):
        registry.get("alpha")


def test_plugin_that_fails_to_import_names_distribution_and_cause(install_distribution):
    install_distribution(
        "laminar-plugin-broken",
        modules={"broken_plugin": "import a_module_that_does_not_exist\n"},
        plugins={"broken": "broken_plugin"},
    )
    with pytest.raises(PluginError) as info:
        load_connector_registry()
    message = str(info.value)
    assert "'broken' from distribution laminar-plugin-broken failed to import" in message
    assert "ModuleNotFoundError" in message
    assert "a_module_that_does_not_exist" in message
    assert "LAMINAR_DISABLE_PLUGINS=broken" in message, "says how to get going again"
    assert info.value.distribution == "laminar-plugin-broken"
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_misspelt_hook_fails_loudly(install_distribution):
    install_distribution(
        "laminar-plugin-typo",
        modules={
            "typo_plugin": """
                from laminar_sdk import hookimpl

                @hookimpl
                def laminar_register_conectors(registry):
                    pass
            """
        },
        plugins={"typo": "typo_plugin"},
    )
    with pytest.raises(PluginError, match="laminar-plugin-typo declares a bad hook") as info:
        load_connector_registry()
    assert "laminar_register_conectors" in str(info.value)
    assert "laminar_register_connectors" in str(info.value), "lists the hooks that exist"


def test_hook_with_wrong_arguments_fails_loudly(install_distribution):
    install_distribution(
        "laminar-plugin-args",
        modules={
            "args_plugin": """
                from laminar_sdk import hookimpl

                @hookimpl
                def laminar_register_connectors(registry, extra):
                    pass
            """
        },
        plugins={"args": "args_plugin"},
    )
    with pytest.raises(PluginError, match="(?s)laminar-plugin-args declares a bad hook.*extra"):
        load_connector_registry()


def test_two_plugins_with_the_same_connector_name_are_refused(install_distribution):
    install_distribution(
        "laminar-plugin-one",
        modules={"one_plugin": plugin_source("shared")},
        plugins={"one": "one_plugin"},
    )
    install_distribution(
        "laminar-plugin-two",
        modules={"two_plugin": plugin_source("shared")},
        plugins={"two": "two_plugin"},
    )
    with pytest.raises(PluginError) as info:
        load_connector_registry()
    message = str(info.value)
    assert "connector named 'shared'" in message
    assert "laminar-plugin-one" in message
    assert "laminar-plugin-two" in message


def test_plugin_raising_while_registering(install_distribution):
    install_distribution(
        "laminar-plugin-raise",
        modules={
            "raise_plugin": """
                from laminar_sdk import hookimpl

                @hookimpl
                def laminar_register_connectors(registry):
                    raise ValueError("no license key")
            """
        },
        plugins={"raise": "raise_plugin"},
    )
    with pytest.raises(
        PluginError,
        match="'raise' from distribution laminar-plugin-raise failed while registering its "
        "connectors: ValueError: no license key",
    ):
        load_connector_registry()


def test_factory_returning_the_wrong_type(install_distribution):
    install_distribution(
        "laminar-plugin-wrong",
        modules={
            "wrong_plugin": """
                from laminar_sdk import hookimpl

                @hookimpl
                def laminar_register_connectors(registry):
                    registry.add_source("wrong", dict)
                    registry.add_sink("bad name!", dict)
            """
        },
        plugins={"wrong": "wrong_plugin"},
    )
    with pytest.raises(PluginError, match="registers a sink named 'bad name!'"):
        load_connector_registry()


def test_factory_returning_the_wrong_type_is_caught_on_create(install_distribution):
    install_distribution(
        "laminar-plugin-wrong",
        modules={
            "wrong_plugin": """
                from laminar_sdk import hookimpl

                @hookimpl
                def laminar_register_connectors(registry):
                    registry.add_source("wrong", dict)
            """
        },
        plugins={"wrong": "wrong_plugin"},
    )
    registry = load_connector_registry()
    with pytest.raises(PluginError, match="factory returned dict, not a SourceConnector subclass"):
        registry.create_source("wrong")


def test_allowlist_and_denylist(install_distribution, monkeypatch):
    install_distribution(
        "laminar-plugin-one",
        modules={"one_plugin": plugin_source("one")},
        plugins={"one": "one_plugin"},
    )
    install_distribution(
        "laminar-plugin-broken",
        modules={"broken_plugin": "raise ImportError('x')\n"},
        plugins={"broken": "broken_plugin"},
    )
    monkeypatch.setenv("LAMINAR_PLUGINS", "laminar-plugin-one")
    names = {spec.name for spec in load_connector_registry()}
    assert "one" in names, "allowlisted by distribution name"

    monkeypatch.setenv("LAMINAR_PLUGINS", "one")
    assert "one" in {spec.name for spec in load_connector_registry()}, "or by plugin name"

    monkeypatch.setenv("LAMINAR_PLUGINS", "someone-else")
    assert "one" not in {spec.name for spec in load_connector_registry()}

    monkeypatch.delenv("LAMINAR_PLUGINS")
    monkeypatch.setenv("LAMINAR_DISABLE_PLUGINS", "broken, Laminar_Plugin_One")
    assert "one" not in {spec.name for spec in load_connector_registry()}

    monkeypatch.setenv("LAMINAR_DISABLE_PLUGINS", "broken")
    assert "one" in {spec.name for spec in load_connector_registry()}


def test_the_sdk_itself_registers_through_the_same_entry_point():
    registry = load_connector_registry(environ={"LAMINAR_PLUGINS": ""})
    builtin = {spec.distribution for spec in registry}
    assert builtin == {"laminar-sdk"}, "the allowlist does not apply to the SDK's own connectors"
    assert len(registry) > 0
    without_reference = load_connector_registry(environ={"LAMINAR_DISABLE_PLUGINS": "reference"})
    assert "laminar-sdk" not in {spec.distribution for spec in without_reference}


def test_importing_the_sdk_loads_no_plugins(tmp_path):
    code = (
        "import sys, laminar_sdk\n"
        "assert 'pyspark' not in sys.modules, 'pyspark imported at import time'\n"
        "assert 'laminar_sdk.reference' not in sys.modules, 'plugins loaded at import time'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)


def test_capability_names_include_the_opt_in_extensions():
    registry = load_connector_registry()
    assert registry.get("generator", ConnectorRole.SOURCE).capability_names() == (
        "replay",
        "range_readable",
    )
    assert registry.get("memory", ConnectorRole.SINK).capability_names() == (
        "exactly_once",
        "idempotent",
        "two_phase_commit",
        "distributed_commit",
    )
    assert registry.get("null", ConnectorRole.SINK).capability_names() == ("partitioned",)


def test_first_party_test_contexts_are_imported_only_when_the_kit_asks_for_one(tmp_path):
    # A pipeline loads every installed plugin and opens connectors: the test contexts in the
    # plugins' `testing` modules must stay out of it; the kit's hook call brings them in.
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from pathlib import Path
        from laminar_sdk import load_plugins

        registry, manager = load_plugins()
        source, _ = asyncio.run(registry.open_source("files", {{"path": {str(tmp_path)!r}}}))
        asyncio.run(source.close())
        for name in ("files", "kafka", "postgres"):
            assert f"laminar_plugin_{{name}}" in sys.modules, name
        loaded = sorted(name for name in sys.modules if name.endswith(".testing"))
        print("before", loaded)
        context = manager.hook.laminar_conformance_context(
            connector="files", role="sink", workdir=Path({str(tmp_path)!r})
        )
        print("after", type(context).__module__)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["before []", "after laminar_plugin_files.testing"]
