"""Kill -9 of a Spark pipeline at each step of an epoch's commit, then a restart: exactly once.

Each crash runs in a child process of its own (a Spark driver per crash point; the children
of every selected crash point start at once, to overlap their JVM start-up); the
``LAMINAR_SPARK_CRASH_AT`` hook SIGKILLs the driver JVM when the commit of micro-batch 1
reaches the step. The restart runs in the tests' shared session, from the same checkpoint
location.

The three steps with distinct recoveries run by default: ``write`` (an undecided epoch, rolled
back and rewritten), ``commit`` (a decided epoch, finished by recovery) and ``done`` (a
committed epoch Spark re-runs, skipped). The other three are marked ``slow``.
"""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession
from spark_pipelines import (
    MAX_RECORDS_PER_BATCH,
    CrashedRun,
    committed_epochs,
    crash_children,
    expected_ids,
    run_exactly_once,
)

from laminar_sdk import ProtocolStep
from laminar_sdk.reference import MemorySink

pytestmark = pytest.mark.spark

ROWS = 30  # 60 rows: micro-batches 0 and 1 hold 25 rows, micro-batch 2 holds 10
CRASH_EPOCH = 1
CHILD_TIMEOUT_S = 240

# Whether epoch 1 is committed in the sink when the process dies at each step.
COMMITTED_AT_CRASH = {
    ProtocolStep.WRITE: False,
    ProtocolStep.PRE_COMMIT: False,
    ProtocolStep.MANIFEST: False,
    ProtocolStep.COMMIT: False,
    ProtocolStep.COMMITTED_MANIFEST: True,
    ProtocolStep.DONE: True,
}
STEPS = [pytest.param(step, id=step.value) for step in COMMITTED_AT_CRASH]


@pytest.fixture(scope="module")
def crashed_runs(selected_params, tmp_path_factory: pytest.TempPathFactory):
    selected = selected_params("step")
    works = {
        f"{step.value}:{CRASH_EPOCH}": tmp_path_factory.mktemp(f"crash-{step.value}")
        for step in selected
    }
    runs = crash_children(works, ROWS, timeout_s=CHILD_TIMEOUT_S)
    return {step: runs[f"{step.value}:{CRASH_EPOCH}"] for step in selected}


# Nightly (`tox -e full`) at every step (and tests/spark/test_live_source_recovery.py at write,
# commit and done); CI kills a Spark pipeline in its commit and restarts it in the quick-start
# demo's test (tests/spark/test_laminar_run.py).
@pytest.mark.full
@pytest.mark.parametrize("step", STEPS)
def test_restart_after_kill_at_protocol_step_delivers_exactly_once(
    spark: SparkSession, crashed_runs: dict[ProtocolStep, CrashedRun], step: ProtocolStep
) -> None:
    run = crashed_runs[step]
    assert run.crashed, f"the child was not killed:\n{run.log}"
    assert run.returncode != 0
    committed = 2 if COMMITTED_AT_CRASH[step] else 1
    assert committed_epochs(run.work) == [f"epoch-{e}" for e in range(committed)], run.log
    assert len(MemorySink.committed_ids(run.work / "sink")) == committed * MAX_RECORDS_PER_BATCH
    # Spark's own commit log never recorded micro-batch 1: the restart re-runs it.
    assert not (run.work / "checkpoint" / "commits" / str(CRASH_EPOCH)).exists()

    run_exactly_once(spark, run.work, ROWS)

    assert sorted(MemorySink.committed_ids(run.work / "sink")) == expected_ids(ROWS)
