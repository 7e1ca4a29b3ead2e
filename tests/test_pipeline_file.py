"""Pipeline files for `laminar run`: parsing, defaults, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from laminar_sdk import ConfigurationError, DeliveryGuarantee
from laminar_sdk._pipeline_file import load_pipeline_file

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
    assert pipeline.checkpoint_location == tmp_path / "state"
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
    assert pipeline.checkpoint_location == Path("/abs/state")
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


def test_not_toml_and_missing_file(tmp_path):
    with pytest.raises(ConfigurationError, match="not valid TOML"):
        load_pipeline_file(write(tmp_path, "[source\n"))
    with pytest.raises(ConfigurationError, match="no such pipeline file"):
        load_pipeline_file(tmp_path / "absent.toml")
