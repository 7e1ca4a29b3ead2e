"""Polled sources appended to while a pipeline runs, and the exactly-once count of their ids.

Shared by the recovery tests in ``local`` mode, on a standalone cluster and with the laminar
checkpoint location on an object store. The fixtures that install the plugins and start an
:class:`Appender` are in this directory's ``conftest.py``.
"""

from __future__ import annotations

import itertools
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from laminar_conformance.spark import SparkPipeline, start_child
from spool_plugin import append

SPOOL_PLUGIN = Path(__file__).with_name("spool_plugin.py")
TICKET_PLUGIN = Path(__file__).with_name("ticket_plugin.py")
PARTITIONS = 3
MAX_RECORDS_PER_BATCH = 10_000
"""Far above what arrives between two micro-batches: each reads everything available now, as
Spark's own sources do, so a re-run that polled again would find more."""
APPEND_INTERVAL_S = 0.02
"""Every partition receives a record this often: a micro-batch never finds the source empty,
so the query (``availableNow``) runs until it is killed."""


class Appender(threading.Thread):
    """Appends one record to every partition each :data:`APPEND_INTERVAL_S`, until stopped."""

    def __init__(self, directory: Path, partitions: int) -> None:
        super().__init__(daemon=True)
        self._directory = directory
        self._partitions = partitions
        self._stopped = threading.Event()
        self._next = itertools.count()
        self.appended: list[int] = []

    def add_partition(self) -> None:
        """From now on, append to one partition more (partitions added upstream)."""
        self._partitions += 1

    def add(self, per_partition: int) -> None:
        """Append ``per_partition`` records to every partition now."""
        for partition in range(self._partitions):
            ids = [next(self._next) for _ in range(per_partition)]
            append(self._directory, partition, ids)
            self.appended.extend(ids)

    def run(self) -> None:
        while not self._stopped.wait(APPEND_INTERVAL_S):
            self.add(1)

    def stop(self) -> list[int]:
        """Stop appending; every id appended."""
        self._stopped.set()
        self.join()
        return self.appended


def spool_pipeline(
    work: Path, *, master: str = "local[2]", laminar: Mapping[str, str] | None = None
) -> SparkPipeline:
    """``spool`` at ``work/spool`` -> memory sink at ``work/sink``, exactly-once.

    :param laminar: ``laminar.*`` options for both sides (a checkpoint location elsewhere).
    """
    return SparkPipeline(
        source="spool",
        source_options={"path": str(work / "spool"), **(laminar or {})},
        sink="memory",
        sink_options={"path": str(work / "sink"), **(laminar or {})},
        checkpoint_location=str(work / "checkpoint"),
        delivery="exactly-once",
        max_records_per_batch=MAX_RECORDS_PER_BATCH,
        master=master,
        timeout_s=120,
    )


def committed_epochs(work: Path) -> int:
    """How many epochs the memory sink at ``work/sink`` has committed."""
    committed = work / "sink" / "committed"
    return len(os.listdir(committed)) if committed.is_dir() else 0


def kill_at_random(pipeline: SparkPipeline, work: Path, name: str, site: str, seed: int) -> None:
    """Run ``pipeline`` and SIGKILL it at a random moment after it committed a micro-batch."""
    before = committed_epochs(work)
    child = start_child(pipeline, work, name, python_path=(site,))
    deadline = time.monotonic() + pipeline.timeout_s
    while committed_epochs(work) <= before and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(random.Random(seed).uniform(0.0, 1.5))
    child.kill()
    run = child.wait()
    assert run.returncode != 0, f"the run ended before its kill:\n{run.tail()}"


def assert_exactly_once(appended: list[int], delivered: list[int], context: str) -> None:
    """Every appended id delivered once: none lost, none twice, none unknown."""
    counts = Counter(delivered)
    lost = sorted(set(appended) - set(counts))
    doubled = sorted(i for i, n in counts.items() if n > 1)
    unknown = sorted(set(counts) - set(appended))
    summary = (
        f"{len(lost)} lost (first {lost[:10]}), {len(doubled)} delivered twice (first "
        f"{doubled[:10]}), {len(unknown)} never appended; {context}"
    )
    assert lost == [], summary
    assert doubled == [], summary
    assert unknown == [], summary
