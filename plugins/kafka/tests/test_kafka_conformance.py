"""The ``kafka`` connectors adopt the conformance kit's suites, as any plugin would."""

from __future__ import annotations

import pickle

import pyarrow as pa
from laminar_conformance.sink import SinkSuite
from laminar_conformance.source import SourceSuite
from pyspark import cloudpickle

from laminar_plugin_kafka.testing import KafkaSourceContext


class TestKafkaSink(SinkSuite):
    connector = "kafka"


class TestKafkaSource(SourceSuite):
    connector = "kafka"


def test_the_source_context_can_ship_its_ids_to_spark_executors():
    # The kit's Spark layer pickles ids() for the executors; a bound method would drag the
    # context's Kafka clients along, and the layer would be skipped.
    context = KafkaSourceContext()
    try:
        shipped = pickle.loads(cloudpickle.dumps(context.ids))
        assert shipped(pa.RecordBatch.from_pydict({"value": [b"3", b"5"]})) == [3, 5]
    finally:
        context.close()
