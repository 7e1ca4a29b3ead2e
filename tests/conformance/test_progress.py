"""What ``laminar conformance run`` says while it runs and in what order it reports failures."""

from __future__ import annotations

import pytest
from laminar_conformance._call_times import CALL_TIMES, CallTimes
from laminar_conformance._cli import SLOW_CHECK_S, CheckProgress
from laminar_conformance._report import CheckResult, ReportCollector


def test_call_times_are_summed_by_call_with_their_median_and_forgotten_once_taken():
    times = CallTimes()
    for _ in range(3):
        with times.timing("the sink's open()"):
            pass
    with times.timing("commit_epoch"):
        pass
    taken = {time.call: time for time in times.take()}
    assert taken["the sink's open()"].count == 3
    assert taken["commit_epoch"].count == 1
    assert taken["commit_epoch"].median_s >= 0
    assert times.take() == []


def call_report(duration: float) -> pytest.TestReport:
    return pytest.TestReport(
        "test_x.py::TestSink::test_epoch_protocol_state_machine",
        ("test_x.py", 1, "test"),
        {},
        "passed",
        None,
        "call",
        duration=duration,
    )


def test_a_slow_check_names_the_connector_call_that_took_most_of_it(capsys):
    progress = CheckProgress()
    progress.pytest_runtest_logstart()
    for _ in range(200):
        CALL_TIMES.record("the sink's open()", 0.07)  # 14 s of opens
    progress.pytest_runtest_logreport(call_report(SLOW_CHECK_S + 20))
    said = capsys.readouterr().err
    assert "test_epoch_protocol_state_machine took 30.0 s" in said
    assert "the sink's open() was called 200 times, median 70 ms (14.0 s in all)" in said


def test_a_quick_check_says_nothing_more(capsys):
    progress = CheckProgress()
    progress.pytest_runtest_logstart()
    for _ in range(20):
        CALL_TIMES.record("the sink's open()", 0.07)
    progress.pytest_runtest_logreport(call_report(2.0))
    assert capsys.readouterr().err == ""


def test_the_failure_saying_what_a_reader_saw_comes_first():
    collector = ReportCollector()
    raised = CheckResult("test_a", "failed", "TransactionError: was it rolled back?")
    verdict = CheckResult("test_b", "failed", "AssertionError: schema differs")
    seen = CheckResult(
        "test_c", "failed", "AssertionError: not delivered exactly once", timeline="{}"
    )
    for result in (raised, verdict, seen):
        collector.results[result.name] = result
    assert [result.name for result in collector.failures()] == ["test_c", "test_b", "test_a"]
