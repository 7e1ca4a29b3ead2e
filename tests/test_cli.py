"""The ``laminar`` command: plugin listing and inspection."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pyarrow as pa
import pytest

from laminar_sdk import ConnectorConfig
from laminar_sdk._cli.main import COMMAND_ENTRY_POINT_GROUP, main
from laminar_sdk.reference import IDS_SCHEMA, MemorySink

PLUGIN = """
import pyarrow as pa
from laminar_sdk import (
    ConfigKeySpec, SinkConnector, SinkConnectorCapabilities, WriteResult, hookimpl,
)


class Sink(SinkConnector):
    async def open(self, config):
        pass

    async def write_batch(self, batch):
        return WriteResult(batch.num_rows)

    def schema(self):
        return pa.schema([("id", pa.int64())])

    async def close(self):
        pass

    def capabilities(self):
        return SinkConnectorCapabilities().with_exactly_once().with_idempotent()


@hookimpl
def laminar_register_connectors(registry):
    registry.add_sink(
        "vault", Sink, description="writes to the vault",
        config_keys=[
            ConfigKeySpec("url", required=True, description="where the vault is"),
            ConfigKeySpec("retries", default="3", value_type=int, description="attempts"),
            ConfigKeySpec("token", secret=True, description="access token"),
        ],
    )
"""


@pytest.fixture
def vault_plugin(install_distribution):
    install_distribution(
        "laminar-plugin-vault",
        version="0.3.1",
        modules={"vault_plugin": PLUGIN},
        plugins={"vault": "vault_plugin"},
    )


def test_plugins_list_shows_name_role_distribution_version_capabilities(vault_plugin, capsys):
    assert main(["plugins", "list"]) == 0
    out = capsys.readouterr().out
    header, *rows = out.splitlines()
    assert header.split() == ["CONNECTOR", "ROLE", "DISTRIBUTION", "VERSION", "CAPABILITIES"]
    vault = next(row.split() for row in rows if row.startswith("vault "))
    assert vault == ["vault", "sink", "laminar-plugin-vault", "0.3.1", "exactly_once,idempotent"]
    # The parallel-path extensions a connector offers are listed with its capabilities.
    generator = next(row.split() for row in rows if row.startswith("generator "))
    assert generator[-1] == "replay,range_readable"
    memory_sink = next(row.split() for row in rows if row.startswith("memory ") and " sink " in row)
    assert memory_sink[-1].endswith(",distributed_commit")


def test_plugins_show_describes_keys_and_marks_secrets(vault_plugin, capsys):
    assert main(["plugins", "show", "vault"]) == 0
    out = capsys.readouterr().out
    assert "vault (sink connector)" in out
    assert "laminar-plugin-vault 0.3.1" in out
    assert "writes to the vault" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("    ")}
    assert lines["url"].split()[:3] == ["url", "str", "yes"]
    assert lines["retries"].split()[:4] == ["retries", "int", "no", "3"]
    assert "[secret]" in lines["token"]
    assert "[secret]" not in lines["url"]


def test_plugins_show_without_role_shows_both_roles_of_a_connector_that_has_both(capsys):
    # `memory` (the SDK's reference plugin) is a source and a sink.
    assert main(["plugins", "show", "memory"]) == 0
    out = capsys.readouterr().out
    source, sink = out.split("\n\n")
    assert source.startswith("memory (source connector)\n")
    assert sink.startswith("memory (sink connector)\n")
    for role in (source, sink):
        assert "  distribution: laminar-sdk " in role
        assert "  config keys:" in role
        assert any(line.split()[:1] == ["path"] for line in role.splitlines()), role
    assert "distributed_commit" in sink
    assert "distributed_commit" not in source


def test_plugins_show_with_role_shows_that_role_only(capsys):
    assert main(["plugins", "show", "memory", "--role", "sink"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("memory (sink connector)\n")
    assert "(source connector)" not in out


def test_plugins_show_a_role_the_connector_lacks_names_the_installed_ones(vault_plugin, capsys):
    assert main(["plugins", "show", "vault", "--role", "source"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("laminar: error: no source connector named 'vault' is installed")


def test_plugins_show_unknown_connector_exits_2_with_advice(vault_plugin, capsys):
    assert main(["plugins", "show", "valt"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("laminar: error: no connector named 'valt' is installed")
    assert "vault" in err
    assert "laminar plugins list" in err


def test_broken_plugin_gives_one_clear_line_not_a_traceback(install_distribution, capsys):
    install_distribution(
        "laminar-plugin-broken",
        modules={"broken_plugin": "1/0\n"},
        plugins={"broken": "broken_plugin"},
    )
    assert main(["plugins", "list"]) == 2
    err = capsys.readouterr().err
    assert "laminar-plugin-broken failed to import" in err
    assert "ZeroDivisionError" in err
    assert "Traceback" not in err


def test_console_script_is_installed():
    result = subprocess.run(
        [sys.executable, "-m", "laminar_sdk", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.startswith("laminar ")


def commands_from(monkeypatch, *entry_points):
    """Make ``laminar`` see only ``entry_points`` in the group that adds commands."""

    def installed(group):
        return [point for point in entry_points if point.group == group]

    monkeypatch.setattr(metadata, "entry_points", installed)
    return COMMAND_ENTRY_POINT_GROUP


def test_the_kit_adds_laminar_conformance_through_its_entry_point(capsys):
    group = COMMAND_ENTRY_POINT_GROUP
    installed = {point.name: point.value for point in metadata.entry_points(group=group)}
    assert installed == {"conformance": "laminar_conformance._cli:add_conformance_commands"}
    with pytest.raises(SystemExit):
        main(["conformance", "run", "--help"])
    assert "--strict" in capsys.readouterr().out


def test_without_the_kit_laminar_conformance_says_how_to_get_it(monkeypatch, capsys):
    commands_from(monkeypatch)
    assert main(["conformance"]) == 2
    assert "needs the conformance kit: pip install laminar-conformance" in capsys.readouterr().err


def test_a_command_that_cannot_be_loaded_says_which_and_the_rest_still_works(monkeypatch, capsys):
    group = "laminar_sdk.commands"
    broken = metadata.EntryPoint("conformance", "no_such_module_here:add", group)
    assert commands_from(monkeypatch, broken) == group
    assert main(["conformance"]) == 2
    err = capsys.readouterr().err
    assert "the `laminar conformance` command of entry point 'no_such_module_here:add'" in err
    assert "reinstall the distribution that provides it" in err
    assert main(["plugins", "list"]) == 0


def test_plugins_show_marks_path_keys_and_whether_they_must_exist(capsys):
    assert main(["plugins", "show", "files", "--role", "source"]) == 0
    source = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[5:]}
    assert main(["plugins", "show", "files", "--role", "sink"]) == 0
    sink = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[5:]}
    assert source["path"].endswith("[path, must exist]")
    assert sink["path"].endswith("[path, may be created]")
    assert "[path" not in sink["format"]


CHECKED_PIPELINE = """
[source]
connector = "generator"
rows = 100

[transform]
sql = "SELECT * FROM source WHERE id % 2 = 0"

[sink]
connector = "files"
path = "out"
rows_per_file = {rows_per_file}

[pipeline]
delivery = "{delivery}"
checkpoint_location = "state"
"""


def checked_pipeline(tmp_path, rows_per_file="10", delivery="exactly-once"):
    path = tmp_path / "pipeline.toml"
    path.write_text(CHECKED_PIPELINE.format(rows_per_file=rows_per_file, delivery=delivery))
    return path


def test_run_check_says_what_it_checked_and_starts_nothing(tmp_path, capsys):
    path = checked_pipeline(tmp_path)
    assert main(["run", "--check", str(path)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split(maxsplit=1)[1] for line in out.splitlines()[2:-1]}
    assert rows["source"] == "generator (laminar-sdk 0.1.0): options valid: rows=100"
    assert rows["sink"].endswith(
        "options valid: path=" + str(tmp_path / "out") + ", rows_per_file=10"
    )
    assert rows["sink.path"] == f"{tmp_path / 'out'} (does not exist yet; may be created; writable)"
    assert rows["checkpoints"].startswith(f"Spark's in {tmp_path / 'state'}, the SDK's in")
    assert rows["delivery"].startswith(
        "exactly-once: source 'generator' replays, sink 'files' declares exactly_once"
    )
    assert "the SQL transform" in rows["not"]
    assert out.splitlines()[-1] == "laminar: pipeline.toml is valid"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipeline.toml"], "nothing created"


@pytest.mark.parametrize(
    ("edit", "key", "message"),
    [
        ({"rows_per_file": '"ten"'}, "sink.rows_per_file", "must be int, got 'ten'"),
        ({"rows_per_file": "10\nrow_per_file = 3"}, "sink.row_per_file", "did you mean"),
        (
            {"delivery": 'exactly-once"\ncheckpoint_store = "vault'},
            "pipeline.checkpoint_store",
            "no checkpoint store named 'vault'",
        ),
    ],
)
def test_run_check_fails_naming_the_key(tmp_path, capsys, edit, key, message):
    path = checked_pipeline(tmp_path, **edit)
    assert main(["run", "--check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"laminar: error: {path}: {key}: "), err
    assert message in err


@pytest.mark.parametrize(
    ("edit", "key", "blocked"),
    [
        (('"state"', '"blocker/state"'), "pipeline.checkpoint_location", "blocker/state"),
        (('"out"', '"blocker/out"'), "sink.path", "blocker/out"),
    ],
)
def test_run_check_refuses_a_location_that_cannot_be_written_and_leaves_nothing(
    tmp_path, capsys, edit, key, blocked
):
    path = checked_pipeline(tmp_path)
    path.write_text(path.read_text().replace(*edit))
    (tmp_path / "blocker").write_text("a file where a directory would go")
    assert main(["run", "--check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"laminar: error: {path}: {key}: {tmp_path / blocked} cannot be "), err
    assert f"{tmp_path / 'blocker'} is a file, not a directory" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker", "pipeline.toml"]


def test_run_check_refuses_a_location_the_system_will_not_let_it_write(tmp_path, capsys):
    path = checked_pipeline(tmp_path)
    # Nothing, root included, makes a directory in /proc: as a read-only disk would refuse.
    path.write_text(path.read_text().replace('"state"', '"/proc/laminar-check/state"'))
    assert main(["run", "--check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"laminar: error: {path}: pipeline.checkpoint_location: /proc/laminar-check/state "
        "cannot be written: "
    ), err
    assert err.rstrip().endswith("(/proc/laminar-check)"), err


def test_run_check_refuses_a_guarantee_the_connectors_cannot_keep(tmp_path, capsys):
    path = checked_pipeline(tmp_path)
    path.write_text(path.read_text().replace('connector = "files"', 'connector = "null"'))
    path.write_text(path.read_text().replace('path = "out"\nrows_per_file = 10\n', ""))
    assert main(["run", "--check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"laminar: error: {path}: pipeline.delivery: exactly-once delivery")
    assert "sink 'null' does not" in err


CONNECTED_PIPELINE = """
[source]
connector = "generator"
rows = 20

[sink]
connector = "memory"
path = "out"
schema = "{schema}"

[pipeline]
checkpoint_location = "state"
"""


def connected_pipeline(tmp_path, schema="ids"):
    path = tmp_path / "pipeline.toml"
    path.write_text(CONNECTED_PIPELINE.format(schema=schema))
    return path


def test_run_check_connect_opens_each_connector_and_compares_their_columns(tmp_path, capsys):
    path = connected_pipeline(tmp_path)
    assert main(["run", "--check", "--connect", str(path)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split(maxsplit=1)[1] for line in out.splitlines()[2:-1]}
    assert rows["source"] == "generator opened and closed: columns (id, partition, value)"
    assert rows["sink"] == "memory opened and closed: columns (id, partition, value)"
    assert rows["columns"] == "the sink takes the source's columns"
    assert rows["destination"] == "no epoch committed yet"
    assert "not" not in rows, "with nothing left that needs Spark, nothing goes unchecked"


def test_run_check_connect_refuses_a_sink_that_cannot_take_the_source_s_columns(tmp_path, capsys):
    path = connected_pipeline(tmp_path, schema="wide")
    assert main(["run", "--check", "--connect", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"laminar: error: {path}: sink 'memory' cannot take the source's stream: missing column"
    ), err
    assert "[transform]" in err


def test_run_check_connect_refuses_a_query_started_over_on_a_sink_that_has_epochs(tmp_path, capsys):
    # The checkpoint location is empty, but the sink's directory holds epoch 0 already.
    async def commit_epoch_0() -> None:
        sink = MemorySink()
        await sink.open(ConnectorConfig("memory", {"path": str(tmp_path / "out")}))
        await sink.begin_epoch(0)
        ids = pa.array([1, 2], pa.int64())
        batch = pa.record_batch(
            [ids, pa.array([0, 0], pa.int32()), ids.cast(pa.float64())], schema=IDS_SCHEMA
        )
        await sink.write_batch(batch)
        await sink.pre_commit(0)
        await sink.commit_epoch(0)
        await sink.close()

    asyncio.run(commit_epoch_0())
    path = connected_pipeline(tmp_path)
    assert main(["run", "--check", str(path)]) == 0, "without --connect nothing is opened"
    capsys.readouterr()
    assert main(["run", "--check", "--connect", str(path)]) == 2
    err = capsys.readouterr().err
    assert "holds no checkpoint, so this query numbers its epochs from 0" in err, err
    assert "sink 'memory' records epochs up to 0 as committed" in err


def test_run_connect_goes_with_check(tmp_path, capsys):
    assert main(["run", "--connect", str(connected_pipeline(tmp_path))]) == 2
    assert "--connect goes with --check" in capsys.readouterr().err


def test_run_check_never_imports_pyspark(tmp_path):
    program = (
        "import sys\n"
        "from laminar_sdk._cli.main import main\n"
        f"status = main(['run', '--check', {str(checked_pipeline(tmp_path))!r}])\n"
        "print(status, sorted(m for m in sys.modules if m.split('.')[0] == 'pyspark'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    )
    assert result.stdout.splitlines()[-1] == "0 []"


def test_run_help_and_the_docs_state_the_same_rule_for_relative_paths(capsys):
    rule = "Relative paths resolve against the pipeline file's directory"
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    docs = Path(__file__).parent.parent / "docs" / "pipelines.md"
    guide = " ".join(docs.read_text().split())
    for text in (help_text, guide):
        assert rule in text
        assert "declares as a path" in text
        assert "`laminar run --check PIPELINE.toml` checks the file without starting Spark" in text
