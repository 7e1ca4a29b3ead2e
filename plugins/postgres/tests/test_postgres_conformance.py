"""The ``postgres`` connectors adopt the conformance kit's suites, as any plugin would.

Every check of the kit's ``quick`` profile runs, but not all in the default suite, which must
stay short: there, the ``postgres`` sink and both sources run
every check but the long property-based ones (the epoch-protocol state machine, random fault
plans, random replay schedules: a minute or two each on a server; the CDC source's replay
schedules stay in), which run under ``full`` with the ``postgres-2pc`` and
``postgres-upsert`` sinks, the Spark layer (two Spark drivers per connector), and three whole
``laminar conformance run``s in a row of each connector, seeds 1 to 3. ``tox -e full`` also
runs each connector with ``--profile full``.
"""

from __future__ import annotations

import functools
import pickle
import subprocess
import sys
from collections.abc import Callable

import pyarrow as pa
import pytest
from laminar_conformance.sink import SinkSuite
from laminar_conformance.source import SourceSuite
from laminar_conformance.spark import SparkSinkSuite, SparkSourceSuite
from pyspark import cloudpickle

from laminar_plugin_postgres.testing import PostgresCdcContext, PostgresSourceContext

LONG_SINK_CHECKS = (
    "test_epoch_protocol_state_machine",
    "test_delivery_survives_any_faults",
    "test_distributed_commit_state_machine",
    "test_staged_delivery_survives_any_faults",
)
LONG_SOURCE_CHECKS = (
    "test_restoring_any_checkpoint_returns_exactly_the_records_after_it",
    "test_records_appended_while_reading_are_returned_once_across_restores",
    "test_range_reads_return_exactly_what_polling_returned",
)


def long_checks_in_full(*names: str) -> Callable[[type], type]:
    """Mark the inherited checks ``names`` of the decorated suite class ``full``.

    Each is wrapped first: marking the kit's own function would mark it for every adopter.
    """

    def decorate(suite: type) -> type:
        for name in names:
            inherited = getattr(suite, name)

            @functools.wraps(inherited)
            def deferred(self, *args, _check=inherited, **kwargs):
                return _check(self, *args, **kwargs)

            setattr(suite, name, pytest.mark.full(deferred))
        return suite

    return decorate


@long_checks_in_full(*LONG_SINK_CHECKS)
class TestPostgresSink(SinkSuite):
    connector = "postgres"


@long_checks_in_full(*LONG_SOURCE_CHECKS)
class TestPostgresSource(SourceSuite):
    connector = "postgres"


# Replaying any checkpoint is what a slot advanced too early breaks: checked on every push.
@long_checks_in_full(
    "test_records_appended_while_reading_are_returned_once_across_restores",
    "test_range_reads_return_exactly_what_polling_returned",
)
class TestPostgresCdcSource(SourceSuite):
    connector = "postgres-cdc"


@pytest.mark.full
class TestPostgresTwoPhaseSink(SinkSuite):
    connector = "postgres-2pc"


@pytest.mark.full
class TestPostgresUpsertSink(SinkSuite):
    connector = "postgres-upsert"


@pytest.mark.spark
@pytest.mark.full
class TestPostgresSinkOnSpark(SparkSinkSuite):
    connector = "postgres"


@pytest.mark.spark
@pytest.mark.full
class TestPostgresTwoPhaseSinkOnSpark(SparkSinkSuite):
    connector = "postgres-2pc"


@pytest.mark.spark
@pytest.mark.full
class TestPostgresSourceOnSpark(SparkSourceSuite):
    connector = "postgres"


@pytest.mark.spark
@pytest.mark.full
class TestPostgresCdcSourceOnSpark(SparkSourceSuite):
    connector = "postgres-cdc"


@pytest.mark.parametrize("context_type", [PostgresSourceContext, PostgresCdcContext])
def test_the_source_contexts_can_ship_their_ids_to_spark_executors(context_type):
    # The kit's Spark layer pickles ids() for the executors; a bound method would drag the
    # context's connection along, and the layer would be skipped.
    context = context_type()
    try:
        shipped = pickle.loads(cloudpickle.dumps(context.ids))
        if context_type is PostgresCdcContext:
            rows = pa.RecordBatch.from_pydict({"after": [{"id": 3}, {"id": 5}]})
        else:
            rows = pa.RecordBatch.from_pydict({"id": [3, 5]})
        assert shipped(rows) == [3, 5]
    finally:
        context.close()


@pytest.mark.slow
@pytest.mark.full
@pytest.mark.parametrize("seed", ["1", "2", "3"])
@pytest.mark.parametrize(
    ("connector", "role"),
    [
        ("postgres", "sink"),
        ("postgres-2pc", "sink"),
        ("postgres-upsert", "sink"),
        ("postgres", "source"),
        ("postgres-cdc", "source"),
    ],
)
def test_three_runs_in_a_row_pass(tmp_path, connector, role, seed):
    # The whole quick profile through the command a plugin's CI runs, three seeds in a row: a
    # check that passes only by luck fails one of them.
    command = [sys.executable, "-m", "laminar_conformance", "run", connector, "--role", role]
    command += ["--seed", seed, "--report", str(tmp_path / "report.md")]
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=tmp_path, check=False, timeout=3600
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "**Result: PASSED**" in (tmp_path / "report.md").read_text()
