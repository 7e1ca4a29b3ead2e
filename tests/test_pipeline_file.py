"""Pipeline files for `laminar run`: parsing, defaults, paths, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from laminar_sdk import (
    ConfigKeySpec,
    ConfigurationError,
    ConnectorRegistry,
    ConnectorRole,
    DeliveryGuarantee,
    PathKind,
)
from laminar_sdk._pipeline_files.check import check_pipeline
from laminar_sdk._pipeline_files.file import load_pipeline_file
from laminar_sdk._spark.options import (
    DELIVERY,
    MAX_BYTES_PER_BATCH,
    MAX_RECORDS_PER_BATCH,
    parse_options,
)
from laminar_sdk.reference import GeneratorSource, NullSink

GOOD = """
[source]
connector = "generator"
rows = 100
partitions = 2

[transform]
sql = "SELECT * FROM source WHERE id % 2 = 0"

[sink]
connector = "memory"
path = "out"

[pipeline]
delivery = "exactly-once"
checkpoint_location = "state"
max_records_per_batch = 30
max_bytes_per_batch = "64m"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pipeline.toml"
    path.write_text(text)
    return path


def test_a_complete_file(tmp_path):
    pipeline = load_pipeline_file(write(tmp_path, GOOD))
    assert (pipeline.source, pipeline.sink) == ("generator", "memory")
    assert pipeline.source_options == {"rows": "100", "partitions": "2"}, "values become text"
    assert pipeline.sink_options == {"path": str(tmp_path / "out")}, "paths resolve to the file"
    assert pipeline.checkpoint_location == str(tmp_path / "state")
    assert pipeline.transform_sql == "SELECT * FROM source WHERE id % 2 = 0"
    assert pipeline.delivery is DeliveryGuarantee.EXACTLY_ONCE
    assert (pipeline.master, pipeline.trigger, pipeline.max_records_per_batch) == (
        "local[2]",
        "available-now",
        30,
    )
    assert pipeline.max_bytes_per_batch == 64 * 2**20


def test_defaults(tmp_path):
    pipeline = load_pipeline_file(
        write(
            tmp_path,
            '[source]\nconnector = "generator"\n[sink]\nconnector = "null"\n'
            '[pipeline]\ncheckpoint_location = "/abs/state"\n',
        )
    )
    assert pipeline.delivery is DeliveryGuarantee.AT_LEAST_ONCE
    assert pipeline.checkpoint_location == "/abs/state"
    assert pipeline.transform_sql is None
    assert pipeline.checkpoint_store is None
    assert (pipeline.max_records_per_batch, pipeline.max_bytes_per_batch) == (None, None), (
        "the SDK's defaults apply"
    )


@pytest.mark.parametrize(
    ("edit", "key", "message"),
    [
        (lambda t: t.replace('connector = "memory"', ""), "sink.connector", "missing"),
        (lambda t: t + "[sinks]\n", "sinks", "unknown section"),
        (lambda t: t + "colour = 1\n", "pipeline.colour", "unknown"),
        (lambda t: t.replace('"exactly-once"', '"at-most-once"'), "pipeline.delivery", "use one"),
        (
            lambda t: t.replace('checkpoint_location = "state"', ""),
            "pipeline.checkpoint_location",
            "missing",
        ),
        (lambda t: t.replace("= 30", "= 0"), "pipeline.max_records_per_batch", "positive"),
        *(
            (
                lambda t, size=size: t.replace('"64m"', size),
                "pipeline.max_bytes_per_batch",
                'size like "64m"',
            )
            for size in ("0", '"big"', "true", "1.5")
        ),
        (lambda t: t.replace("rows = 100", "rows = [1]"), "source.rows", "string, number"),
        (lambda t: t.replace("[transform]", "[transform]\nengine = 'x'"), "transform", "one key"),
        (lambda t: t + "trigger = 'sometimes'\n", "pipeline.trigger", "available-now"),
    ],
)
def test_errors_name_the_file_and_key(tmp_path, edit, key, message):
    path = write(tmp_path, edit(GOOD))
    with pytest.raises(ConfigurationError, match=message) as info:
        load_pipeline_file(path)
    assert info.value.key == key
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("setting", "option", "bad"),
    [
        ('max_bytes_per_batch = "64m"', MAX_BYTES_PER_BATCH, "3 parsecs"),
        ("max_records_per_batch = 30", MAX_RECORDS_PER_BATCH, "0"),
        ('delivery = "exactly-once"', DELIVERY, "at-most-once"),
    ],
)
def test_a_pipeline_setting_is_decoded_by_the_code_that_decodes_its_spark_option(
    tmp_path, setting, option, bad
):
    key = setting.split(" = ")[0]
    path = write(tmp_path, GOOD.replace(setting, f'{key} = "{bad}"'))
    with pytest.raises(ConfigurationError) as in_file:
        load_pipeline_file(path)
    with pytest.raises(ConfigurationError) as as_option:
        parse_options({"connector": "generator", option: bad}, ConnectorRole.SOURCE)
    assert in_file.value.key == f"pipeline.{key}"
    said_in_file = str(in_file.value).removeprefix(f"{path}: pipeline.{key}: ")
    assert said_in_file == str(as_option.value).removeprefix(f"option {option!r}: ")


def test_not_toml_and_missing_file(tmp_path):
    with pytest.raises(ConfigurationError, match="not valid TOML"):
        load_pipeline_file(write(tmp_path, "[source\n"))
    with pytest.raises(ConfigurationError, match="no such pipeline file"):
        load_pipeline_file(tmp_path / "absent.toml")


def dotted_registry() -> ConnectorRegistry:
    """A sink whose keys have dots in their names, as the first-party plugins' do."""
    registry = ConnectorRegistry()
    registry.add_source("generator", GeneratorSource, config_keys=[ConfigKeySpec("rows")])
    keys = ["table", "table.create", "sink.id", "bootstrap.servers"]
    registry.add_sink("dotted", NullSink, config_keys=[ConfigKeySpec(key) for key in keys])
    return registry


def test_dotted_keys_reach_the_connector_as_spelt_however_toml_nests_them(tmp_path):
    path = write(
        tmp_path,
        '[source]\nconnector = "generator"\n\n'
        '[sink]\nconnector = "dotted"\nsink.id = "run1"\n"bootstrap.servers" = "b:9092"\n\n'
        "[sink.table]\ncreate = true\n\n"
        '[pipeline]\ncheckpoint_location = "state"\n',
    )
    pipeline = load_pipeline_file(path, registry=dotted_registry())
    assert pipeline.sink_options == {
        "sink.id": "run1",
        "bootstrap.servers": "b:9092",
        "table.create": "true",
    }


def test_a_key_and_a_dotted_key_it_starts_say_to_quote_the_dotted_one(tmp_path):
    path = write(
        tmp_path,
        '[source]\nconnector = "generator"\n\n'
        '[sink]\nconnector = "dotted"\ntable = "t"\ntable.create = true\n\n'
        '[pipeline]\ncheckpoint_location = "state"\n',
    )
    with pytest.raises(ConfigurationError) as caught:
        load_pipeline_file(path, registry=dotted_registry())
    assert "Cannot overwrite a value (at line 7" in str(caught.value)
    assert 'must be quoted: "table.create" = ...' in str(caught.value)
    quoted = path.read_text().replace("table.create", '"table.create"')
    path.write_text(quoted)
    options = load_pipeline_file(path, registry=dotted_registry()).sink_options
    assert options == {"table": "t", "table.create": "true"}


def test_an_unknown_connector_names_the_section_and_the_installed_ones(tmp_path):
    path = write(tmp_path, GOOD.replace('"generator"', '"genrator"'))
    with pytest.raises(ConfigurationError, match="no source connector named 'genrator'") as info:
        load_pipeline_file(path)
    assert info.value.key == "source.connector"
    assert "generator" in str(info.value)


def sqlite_registry() -> ConnectorRegistry:
    """A source and a sink whose `database` must exist; the sink's `journal` may be created."""
    registry = ConnectorRegistry()
    database = ConfigKeySpec("database", required=True, path=PathKind.MUST_EXIST)
    registry.add_source("sqlite", GeneratorSource, config_keys=[database, ConfigKeySpec("table")])
    registry.add_sink(
        "sqlite",
        NullSink,
        config_keys=[database, ConfigKeySpec("journal", path=PathKind.MAY_CREATE)],
    )
    return registry


SQLITE = """
[source]
connector = "sqlite"
database = "{source}"
table = "events.db"

[sink]
connector = "sqlite"
DATABASE = "{sink}"
journal = "{journal}"

[pipeline]
checkpoint_location = "{checkpoints}"
"""


def sqlite_pipeline(tmp_path, **values: str) -> Path:
    chosen = {"source": "in.db", "sink": "out.db", "journal": "j", "checkpoints": "state"}
    chosen.update(values)
    (tmp_path / "pipelines").mkdir(exist_ok=True)
    path = tmp_path / "pipelines" / "pipeline.toml"
    path.write_text(SQLITE.format(**chosen))
    return path


def test_path_keys_resolve_against_the_file_from_any_working_directory(tmp_path, monkeypatch):
    path = sqlite_pipeline(tmp_path, source="../data/in.db", sink="~/out.db")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "in.db").write_bytes(b"")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "out.db").write_bytes(b"")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path / "home")  # the working directory plays no part
    relative = Path("..") / path.relative_to(tmp_path)
    pipeline = load_pipeline_file(relative, registry=sqlite_registry())
    assert pipeline.source_options == {
        "database": str(tmp_path / "data" / "in.db"),
        "table": "events.db",  # not a path key: passed as written
    }
    assert pipeline.sink_options == {
        "DATABASE": str(tmp_path / "home" / "out.db"),  # keys match in any case, as in Spark
        "journal": str(tmp_path / "pipelines" / "j"),  # may be created: need not exist
    }
    assert pipeline.checkpoint_location == str(tmp_path / "pipelines" / "state")


@pytest.mark.parametrize(
    ("values", "key", "missing"),
    [
        ({}, "source.database", "pipelines/in.db"),
        (
            {"source": "{tmp}/in.db", "sink": "gone/out.db"},
            "sink.DATABASE",
            "pipelines/gone/out.db",
        ),
        ({"source": "file://{tmp}/nothing.db"}, "source.database", "nothing.db"),
    ],
)
def test_a_path_that_must_exist_and_does_not_names_section_key_and_path(
    tmp_path, values, key, missing
):
    (tmp_path / "in.db").write_bytes(b"")
    values = {name: value.format(tmp=tmp_path) for name, value in values.items()}
    path = sqlite_pipeline(tmp_path, **values)
    with pytest.raises(ConfigurationError, match="does not exist") as info:
        load_pipeline_file(path, registry=sqlite_registry())
    assert info.value.key == key
    message = str(info.value)
    assert message.startswith(f"{path}: {key}: {tmp_path}/{missing} does not exist")
    assert f"relative paths resolve against the pipeline file's directory, {path.parent}" in (
        message
    )


def test_uris_are_passed_unchanged(tmp_path):
    path = sqlite_pipeline(
        tmp_path, source="s3://bucket/in.db", sink="s3://bucket/out.db", checkpoints="s3://b/c"
    )
    pipeline = load_pipeline_file(path, registry=sqlite_registry())
    assert pipeline.source_options["database"] == "s3://bucket/in.db"
    assert pipeline.sink_options["DATABASE"] == "s3://bucket/out.db"
    assert pipeline.checkpoint_location == "s3://b/c"


def test_a_path_key_holds_text():
    with pytest.raises(TypeError, match="value_type str"):
        ConfigKeySpec("port", value_type=int, path=PathKind.MAY_CREATE)
    with pytest.raises(TypeError, match="PathKind.MUST_EXIST"):
        ConfigKeySpec("database", path=True)  # type: ignore[arg-type]


class ForgetfulSource(GeneratorSource):
    """A source that cannot replay what it returned."""

    def supports_replay(self) -> bool:
        return False


def test_check_warns_of_at_least_once_with_a_source_that_cannot_replay(tmp_path):
    registry = sqlite_registry()
    registry.add_source("forgetful", ForgetfulSource)
    text = '[source]\nconnector = "forgetful"\n[sink]\nconnector = "sqlite"\ndatabase = "."\n'
    path = write(tmp_path, text + '[pipeline]\ncheckpoint_location = "state"\n')
    checked = check_pipeline(load_pipeline_file(path, registry=registry), registry)
    found = {item.what: item.finding for item in checked}
    assert found["delivery"].startswith("at-least-once: source 'forgetful' cannot replay")
    assert found["warning"].startswith("source 'forgetful' cannot replay: with at-least-once")

    path.write_text(path.read_text() + 'delivery = "exactly-once"\n')
    with pytest.raises(ConfigurationError, match="source 'forgetful' does not") as info:
        check_pipeline(load_pipeline_file(path, registry=registry), registry)
    assert info.value.key == "pipeline.delivery"
