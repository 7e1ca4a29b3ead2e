"""The plugin as installed: found through its entry point, and loadable without the kit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from laminar_sdk import ConnectorRole, load_connector_registry

from laminar_plugin_files import FilesSink, FilesSource


def test_the_entry_point_registers_a_source_and_a_sink_named_files():
    registry = load_connector_registry()
    source = registry.get("files", ConnectorRole.SOURCE)
    sink = registry.get("files", ConnectorRole.SINK)
    assert (source.distribution, sink.distribution) == ("laminar-plugin-files",) * 2
    assert isinstance(registry.create_source("files"), FilesSource)
    assert isinstance(registry.create_sink("files"), FilesSink)
    assert {key.name for key in source.config_keys} == {
        "path",
        "format",
        "schema",
        "pattern",
        "batch_size",
        "s3.endpoint",
        "s3.region",
        "s3.access_key",
        "s3.secret_key",
        "s3.session_token",
        "s3.allow_http",
        "s3.timeout_s",
        "s3.max_attempts",
    }
    secret = {key.name for key in source.config_keys if key.secret}
    assert secret == {"s3.access_key", "s3.secret_key", "s3.session_token"}
    assert {key.name for key in sink.config_keys} == {"path", "format", "schema", "rows_per_file"}
    assert [key.name for key in sink.config_keys if key.required] == ["path"]


def test_the_plugin_loads_and_gives_contexts_without_the_conformance_kit(tmp_path: Path):
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path

        sys.modules["laminar_conformance"] = None  # as if the kit were not installed

        from laminar_sdk import ConnectorRole, load_plugins

        registry, manager = load_plugins()
        registry.get("files", ConnectorRole.SINK)
        hook = manager.hook.laminar_conformance_context
        sink = hook(connector="files", role="sink", workdir=Path({str(tmp_path)!r}))
        source = hook(connector="files", role="source", workdir=Path({str(tmp_path)!r}))
        other = hook(connector="memory", role="sink", workdir=Path({str(tmp_path)!r}))
        sink.committed_ids()
        print(type(sink).__name__, type(source).__name__, other)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["FilesSinkContext", "FilesSourceContext", "None"]
