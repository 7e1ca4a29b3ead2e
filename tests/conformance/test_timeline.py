"""The timeline of a failing case: text in the failure, JSON in the report, SVG in the page."""

from __future__ import annotations

import asyncio

import pytest
from broken import StagingSink, _ids_batch
from laminar_conformance._faults import (
    Fault,
    FaultPlan,
    FaultPoint,
    FaultySink,
    InjectedFault,
    TraceEvent,
)
from laminar_conformance._timeline import Timeline

from laminar_sdk import ConnectorConfig

EVENTS = (
    TraceEvent(0, "begin_epoch", 1, "ok"),
    TraceEvent(0, "write_batch", 1, "error-after"),
    TraceEvent(0, "commit_epoch", 1, "crash inside commit_epoch: rows-published"),
    TraceEvent(1, "commit_epoch", 1, "ok"),
)
TIMELINE = Timeline(EVENTS, ("duplicated ids [3] (epochs [1])",))


def test_a_timeline_survives_its_json():
    assert Timeline.from_json(TIMELINE.to_json()) == TIMELINE


def test_the_text_has_one_line_per_instance_and_what_the_reader_saw():
    assert TIMELINE.text().splitlines()[1:] == [
        "  instance 0: begin_epoch(1) -> write_batch(1) [error-after] -> commit_epoch(1) "
        "[crash inside commit_epoch: rows-published]",
        "  instance 1: commit_epoch(1)",
        "  then a reader saw: duplicated ids [3] (epochs [1])",
    ]


def test_the_picture_has_a_box_per_call_coloured_by_outcome_and_the_problems():
    svg = TIMELINE.svg()
    assert svg.count("<rect") == len(EVENTS)
    assert svg.count('fill="#f4b6b6"') == 1, "one crash"
    assert svg.count('fill="#fde3b5"') == 1, "one injected error"
    assert svg.count('fill="#d8ead3"') == 2, "two calls that went through"
    assert ">instance 1</text>" in svg
    assert 'fill="#a00">duplicated ids [3] (epochs [1])</text>' in svg


def test_a_distributed_commit_s_calls_are_on_the_timeline(tmp_path):
    """The staged path draws its ``stage`` and ``commit_aggregated`` calls, faults included."""

    async def batches():
        yield _ids_batch([1, 2])

    async def scenario(plan: FaultPlan) -> None:
        sink = StagingSink()
        await sink.open(ConnectorConfig("staging-sink", {"path": str(tmp_path)}))
        staging = FaultySink(sink, plan).as_distributed_commit()
        with pytest.raises(InjectedFault):
            await staging.stage(0, "task-0", batches())
        descriptor = await staging.stage(0, "task-0.attempt-1", batches())
        await staging.commit_aggregated(0, [descriptor])

    plan = FaultPlan([FaultPoint("stage", Fault.ERROR_BEFORE, 0)])
    asyncio.run(scenario(plan))
    assert plan.trace == [
        TraceEvent(0, "stage", 0, "error-before"),
        TraceEvent(0, "stage", 0, "ok"),
        TraceEvent(0, "commit_aggregated", 0, "ok"),
    ]
