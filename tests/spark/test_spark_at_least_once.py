"""At-least-once through Spark with a source that cannot replay: killed, restarted, nothing lost.

The source is the ``memory`` source claiming ``supports_replay() is False`` (and not
range-readable), installed as a plugin. With ``laminar.delivery=at-least-once`` a pipeline
killed while committing a micro-batch (whose offsets Spark had logged) and restarted loses no
id; duplicates are allowed. Asking for exactly-once with it fails before any data moves.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from laminar_conformance.spark import SparkPipeline, run_in_child, start_child

from laminar_sdk.reference import MemorySink, MemorySource

# Nightly: CI checks the refusal and the warning without Spark (tests/test_delivery.py).
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.full]

NO_REPLAY_PLUGIN = """
from laminar_sdk import hookimpl
from laminar_sdk.reference import MemorySource


class NoReplaySource(MemorySource):
    def supports_replay(self):
        return False

    def as_range_readable(self):
        return None


@hookimpl
def laminar_register_connectors(registry):
    registry.add_source("no-replay-memory", NoReplaySource, config_keys=MemorySource.CONFIG_KEYS)
"""

IDS = list(range(60))
MAX_RECORDS_PER_BATCH = 10


def pipeline(work: Path, delivery: str) -> SparkPipeline:
    return SparkPipeline(
        source="no-replay-memory",
        source_options={"path": str(work / "source")},
        sink="memory",
        sink_options={"path": str(work / "sink")},
        checkpoint_location=str(work / "checkpoint"),
        delivery=delivery,
        max_records_per_batch=MAX_RECORDS_PER_BATCH,
        timeout_s=180,
    )


@pytest.fixture
def site(install_distribution) -> str:
    return str(
        install_distribution(
            "laminar-plugin-no-replay",
            modules={"no_replay_plugin": NO_REPLAY_PLUGIN},
            plugins={"no-replay": "no_replay_plugin"},
        )
    )


def test_a_non_replayable_source_loses_nothing_at_least_once_and_is_refused_exactly_once(
    tmp_path, site
):
    killed_work, refused_work = tmp_path / "killed", tmp_path / "refused"
    for work in (killed_work, refused_work):
        MemorySource.append(work / "source", IDS)

    at_least_once = pipeline(killed_work, "at-least-once")
    # Micro-batch 1's offsets are in Spark's log; it is killed before its commit decision.
    killing = start_child(
        at_least_once, killed_work, "killed", crash="write:1", python_path=(site,)
    )
    refusing = start_child(
        pipeline(refused_work, "exactly-once"), refused_work, "refused", python_path=(site,)
    )
    killed = killing.wait()
    restarted = run_in_child(at_least_once, killed_work, "restarted", python_path=(site,))
    refusal = refusing.wait()

    assert killed.crashed, killed.tail()
    assert restarted.returncode == 0, restarted.tail()
    seen = Counter(MemorySink.committed_ids(killed_work / "sink"))
    lost = sorted(set(IDS) - set(seen))
    assert not lost, f"at-least-once lost ids {lost} across the kill and restart"
    assert set(seen) == set(IDS), "ids nobody appended"

    assert refusal.returncode != 0
    assert not refusal.crashed
    log = refusal.tail(20_000)
    assert "exactly-once delivery requires every source to support replay" in log, log
    assert "no-replay-memory" in log
    assert list(refused_work.glob("sink/**/*.arrow")) == [], "data moved before the refusal"
