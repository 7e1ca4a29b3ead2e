"""The timeline of a failing case: text in the failure, JSON in the report, SVG in the page."""

from __future__ import annotations

from laminar_conformance._faults import TraceEvent
from laminar_conformance._timeline import Timeline

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
