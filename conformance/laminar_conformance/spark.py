"""The conformance kit's Spark layer: a plugin in a real pipeline, killed and restarted.

Adopt the suites next to the in-process ones, one class per connector::

    from laminar_conformance.sink import SinkSuite
    from laminar_conformance.spark import SparkSinkSuite

    class TestMySink(SinkSuite, SparkSinkSuite):
        connector = "my-sink"

On Spark (``local[2]``), the plugin runs in a pipeline with the SDK's reference connectors on
the other side — a sink is fed by the ``generator`` source, a source feeds the ``memory`` sink
— driven through the same test context as the in-process checks. The pipeline's Spark driver
is SIGKILLed at crash points drawn from the ten listed in docs/epoch-protocol.md (``quick``:
one; ``full``: all ten, one after the other) and restarted from its checkpoint location each
time; then the ids a reader sees are counted: none lost, and none twice with exactly-once delivery.

Each case runs its pipeline in child Python processes of the kit's own,
so a plugin's own tests need nothing of the SDK's. The checks skip, saying why, without
``pyspark`` or with ``--laminar-no-spark`` (``laminar conformance run --no-spark``). Importing
this module does not import ``pyspark``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar

import pytest

from laminar_conformance._figures import Figures
from laminar_conformance._profiles import SPARK_CHECK
from laminar_conformance._spark_layer import EarlyDrivers, run_spark_layer
from laminar_conformance._spark_pipeline import (
    ChildRun,
    IdsTransform,
    RunningChild,
    SparkPipeline,
    run_in_child,
    run_pipeline_file,
    start_child,
)
from laminar_conformance._suite import ConnectorSuite, Target, check
from laminar_sdk import ConnectorRole

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "ChildRun",
    "IdsTransform",
    "RunningChild",
    "SparkPipeline",
    "SparkSinkSuite",
    "SparkSourceSuite",
    "run_in_child",
    "run_pipeline",
    "run_pipeline_file",
    "start_child",
]


class _SparkSuite(ConnectorSuite):
    """What the sink and source suites on Spark share: drivers started ahead of their check."""

    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def spark_drivers(
        cls, conformance: Target, request: pytest.FixtureRequest
    ) -> Iterator[EarlyDrivers | None]:
        """The Spark check's first drivers, started with the class's first check.

        They start up and warm up while the in-process checks run, the Spark check last;
        ``None`` when the check is not selected, will not run pipelines, or runs in a
        pytest-xdist worker (which may not be the one that gets the check).
        """
        selected = any(
            item.parent is request.node and getattr(item, "originalname", None) == SPARK_CHECK
            for item in request.session.items
        )
        early = EarlyDrivers.start(conformance, cls.plugins, request.config) if selected else None
        yield early
        if early is not None:
            early.close()


class SparkSinkSuite(_SparkSuite):
    """The sink on Spark: ``generator`` → sink, killed at crash points and restarted."""

    role: ClassVar[ConnectorRole] = ConnectorRole.SINK

    @check
    def test_spark_pipeline_killed_at_crash_points_restarts_without_loss(
        self,
        conformance: Target,
        figures: Figures,
        request: pytest.FixtureRequest,
        spark_drivers: EarlyDrivers | None,
    ) -> None:
        """Every id once (exactly-once sinks) or at least once, across kills and restarts."""
        run_spark_layer(conformance, figures, type(self).plugins, request, spark_drivers)


class SparkSourceSuite(_SparkSuite):
    """The source on Spark: source → ``memory`` sink, killed at crash points and restarted."""

    role: ClassVar[ConnectorRole] = ConnectorRole.SOURCE

    @check
    def test_spark_pipeline_killed_at_crash_points_restarts_without_loss(
        self,
        conformance: Target,
        figures: Figures,
        request: pytest.FixtureRequest,
        spark_drivers: EarlyDrivers | None,
    ) -> None:
        """Every id once (replayable sources) or at least once, across kills and restarts."""
        run_spark_layer(conformance, figures, type(self).plugins, request, spark_drivers)


def run_pipeline(spark: SparkSession, pipeline: SparkPipeline) -> None:
    """Run ``pipeline`` in ``spark``, in this process, until its source has nothing more.

    What :func:`run_in_child` runs in a child process, for a restart in a test's own session.

    :raises TimeoutError: when it runs longer than ``pipeline.timeout_s``.
    """
    from laminar_conformance._spark_child import run  # noqa: PLC0415 - imports pyspark

    run(spark, pipeline)
