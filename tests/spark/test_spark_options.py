"""Splitting format("laminar") options into SDK settings and connector configuration."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import pyspark_laminar
from laminar_sdk import ConfigurationError, ConnectorRole, DeliveryGuarantee
from laminar_sdk._spark.options import connector_registry, registry_providing
from laminar_sdk.spark import LaminarDataSource, parse_options

pytestmark = pytest.mark.spark

SINK = ConnectorRole.SINK
SOURCE = ConnectorRole.SOURCE


def test_spark_finds_the_data_source_as_laminar() -> None:
    # What Spark's lookup_data_sources does with every top-level pyspark_* module.
    assert issubclass(pyspark_laminar.DefaultSource, LaminarDataSource)
    assert pyspark_laminar.DefaultSource.name() == "laminar"


def test_sdk_options_are_split_from_connector_config() -> None:
    # Spark lower-cases option names; the connector's own spelling comes back.
    options = parse_options(
        {
            "connector": "generator",
            "rows": "10",
            "batch_size": "5",
            "laminar.delivery": "exactly-once",
            "laminar.max.records.per.batch": "7",
        },
        SOURCE,
    )

    assert options.properties == {"rows": "10", "batch_size": "5"}
    assert options.delivery is DeliveryGuarantee.EXACTLY_ONCE
    assert options.max_records_per_batch == 7


def test_a_micro_batch_reads_everything_available_up_to_a_byte_budget_by_default() -> None:
    default = parse_options({"connector": "generator"}, SOURCE)
    assert default.max_records_per_batch is None, "no record cap unless asked for"
    assert default.max_bytes_per_batch == 256 * 2**20

    def budget(text: str) -> int:
        options = {"connector": "generator", "laminar.max.bytes.per.batch": text}
        return parse_options(options, SOURCE).max_bytes_per_batch

    assert budget("1048576") == 2**20
    assert budget("64m") == 64 * 2**20
    assert budget("2G") == 2 * 2**30
    assert budget(" 1 GiB ") == 2**30
    assert budget("100kb") == 100 * 1024
    no_cap = {"connector": "generator", "laminar.max.records.per.batch": "none"}
    assert parse_options(no_cap, SOURCE).max_records_per_batch is None


def test_the_sink_keeps_its_manifests_under_sparks_checkpoint_location() -> None:
    options = parse_options(
        {"connector": "memory", "path": "/data/sink", "checkpointlocation": "file:///ck/q1/"},
        SINK,
    )

    assert options.checkpoint_location == "/ck/q1/laminar"
    assert options.properties == {"path": "/data/sink"}
    assert options.delivery is DeliveryGuarantee.AT_LEAST_ONCE


def test_the_source_side_takes_the_same_checkpoint_location_or_none() -> None:
    # A polled source keeps its read log there; the data source asks for one only for those.
    given = parse_options({"connector": "generator", "checkpointLocation": "/ck/q1"}, SOURCE)
    explicit = parse_options(
        {"connector": "generator", "laminar.checkpoint.location": "s3://b/q1"}, SOURCE
    )
    absent = parse_options({"connector": "generator"}, SOURCE)

    assert given.checkpoint_location == "/ck/q1/laminar"
    assert explicit.checkpoint_location == "s3://b/q1"
    assert absent.checkpoint_location is None


@pytest.mark.parametrize(
    ("role", "options", "key", "message"),
    [
        (SOURCE, {}, "connector", r'add \.option\("connector", NAME\)'),
        (SOURCE, {"connector": "generator", "laminar.delivry": "x"}, "laminar.delivry", "known:"),
        (
            SOURCE,
            {"connector": "generator", "laminar.delivery": "twice"},
            "laminar.delivery",
            "exactly-once",
        ),
        (
            SOURCE,
            {"connector": "generator", "laminar.max.records.per.batch": "0"},
            "laminar.max.records.per.batch",
            "must be a positive integer, or none",
        ),
        *(
            (
                SOURCE,
                {"connector": "generator", "laminar.max.bytes.per.batch": size},
                "laminar.max.bytes.per.batch",
                "must be a positive number of bytes, or a size like",
            )
            for size in ("0", "lots", "-5", "1.5g", "3 parsecs")
        ),
        (
            SINK,
            {
                "connector": "null",
                "checkpointlocation": "/ck",
                "laminar.max.bytes.per.batch": "1g",
            },
            "laminar.max.bytes.per.batch",
            "source side only",
        ),
        (
            SINK,
            {
                "connector": "null",
                "checkpointlocation": "/ck",
                "laminar.max.records.per.batch": "5",
            },
            "laminar.max.records.per.batch",
            "source side only",
        ),
        (
            SOURCE,
            {"connector": "generator", "laminar.checkpoint.location": "memory://a"},
            "laminar.checkpoint.location",
            "lives in one process",
        ),
        (SOURCE, {"connector": "generator", "path": "/x"}, "path", "takes no path"),
        (SINK, {"connector": "memory", "path": "/x"}, "laminar.checkpoint.location", "neither"),
        (
            SINK,
            {"connector": "memory", "path": "/x", "laminar.checkpoint.location": "memory://a"},
            "laminar.checkpoint.location",
            "lives in one process",
        ),
        (SINK, {"connector": "memory", "checkpointlocation": "/ck"}, "path", "missing required"),
    ],
)
def test_bad_options_name_the_key(
    role: ConnectorRole, options: dict[str, str], key: str, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        parse_options(options, role)

    assert caught.value.key == key


WITNESS_PLUGIN = """
from laminar_sdk import hookimpl

@hookimpl
def laminar_register_connectors(registry):
    registry.add_source("witness", lambda: None)
"""

READ_IN_A_NEW_PROCESS = """
import json, pickle, sys
from importlib import metadata
scans = []
scan = metadata.distributions
metadata.distributions = lambda **kwargs: scans.append(kwargs) or scan(**kwargs)
data_source, schema = pickle.loads(sys.stdin.buffer.read())
reader = data_source.streamReader(schema)
from laminar_sdk._plugins.registry import ConnectorRole
from laminar_sdk._spark.options import checkpointer_of
checkpointer_of(data_source._options(ConnectorRole.SOURCE))
scoped = "laminar_witness" in sys.modules
scanned = len(scans)
from laminar_sdk import load_connector_registry
load_connector_registry()
print(json.dumps({
    "scoped": scoped,
    "scanned": scanned,
    "everything": "laminar_witness" in sys.modules,
    "scanned after": len(scans) > scanned,
}))
"""


def test_the_source_planning_process_imports_the_connectors_plugin_alone_without_a_scan(
    install_distribution, tmp_path: Path
) -> None:
    # Spark pickles the data source after asking for its schema and unpickles it in a new
    # planning process for every query; importing every installed plugin there cost a
    # quarter of a second per query, and finding it and the checkpoint store among the
    # installed distributions a tenth. The witness stands for any other installed plugin.
    site = install_distribution(
        "laminar-plugin-witness",
        modules={"laminar_witness": WITNESS_PLUGIN},
        plugins={"witness": "laminar_witness"},
    )
    data_source = LaminarDataSource(
        {"connector": "generator", "rows": "3", "checkpointLocation": str(tmp_path / "c")}
    )
    schema = data_source.schema()
    assert parse_options({"connector": "generator"}, SOURCE).plugin == "reference"
    sink = parse_options(
        {"connector": "memory", "path": str(tmp_path), "checkpointlocation": "/c"}, SINK
    )
    assert sink.plugin == "reference"

    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    child = subprocess.run(
        [sys.executable, "-c", READ_IN_A_NEW_PROCESS],
        input=pickle.dumps((data_source, schema)),
        capture_output=True,
        env=environment,
        check=True,
    )

    imported = json.loads(child.stdout)
    assert imported == {"scoped": False, "scanned": 0, "everything": True, "scanned after": True}, (
        "the planning process imported other plugins than the connector's, or looked for the "
        "plugin or the checkpoint store among the installed distributions (or the witness is "
        f"not installed, or the scan is not seen): {imported}"
    )


def test_options_parsed_again_in_a_process_are_not_looked_up_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Spark's commit runner parses a sink's options anew for each micro-batch it commits.
    options = {"connector": "memory", "path": str(tmp_path), "checkpointlocation": str(tmp_path)}
    first = parse_options(options, SINK)
    scans: list[object] = []
    scan = metadata.distributions
    monkeypatch.setattr(metadata, "distributions", lambda **kw: scans.append(kw) or scan(**kw))

    again = parse_options(options, SINK)

    assert again.entry_points == first.entry_points
    assert {(ep.group, ep.name) for ep in again.entry_points} == {
        ("laminar_sdk.plugins", "reference"),
        ("laminar_sdk.checkpointers", "file"),
    }
    assert not scans, "parsing the same options again scanned the installed distributions"


def test_a_plugin_that_no_longer_provides_the_connector_falls_back_to_every_plugin(
    install_distribution,
) -> None:
    # Options parsed where another plugin provided the connector (or by another version).
    install_distribution(
        "laminar-plugin-witness",
        modules={"laminar_witness": WITNESS_PLUGIN},
        plugins={"witness": "laminar_witness"},
    )
    connector_registry.cache_clear()  # this process's registries, loaded before the witness
    try:
        assert registry_providing("generator", SOURCE, "reference").get("generator", SOURCE)
        found = registry_providing("witness", SOURCE, "reference").get("witness", SOURCE)
        assert found.plugin == "witness", "found among every installed plugin"
        with pytest.raises(ConfigurationError, match="installed: .*witness"):
            registry_providing("gone", SOURCE, "reference").get("gone", SOURCE)
    finally:
        connector_registry.cache_clear()
