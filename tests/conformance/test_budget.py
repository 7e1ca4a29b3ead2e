"""The quick profile's time budget per check: cut short, said so, and never hiding a failure."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test, rule
from laminar_conformance._budget import BUDGET_FLOOR, CaseBudget


def counting_test(seen: list[int], fails_at: int | None = None):
    @settings(max_examples=100, database=None, derandomize=True)
    @given(st.integers(0, 10**6))
    def test(number: int) -> None:
        seen.append(number)
        assert fails_at is None or number < fails_at, f"{number} is too large"

    return test


def test_a_spent_budget_stops_the_check_after_its_floor_and_says_so():
    seen: list[int] = []
    budget = CaseBudget(0.0, planned=100)
    budget.explore(counting_test(seen))
    assert len(seen) == budget.ran == BUDGET_FLOOR
    assert budget.cut_short("quick") == (
        f"ran {BUDGET_FLOOR} of 100 cases: the quick profile gives a check 0 s "
        "(--profile full runs them all)"
    )


def test_without_a_budget_every_planned_case_runs():
    seen: list[int] = []
    budget = CaseBudget(None, planned=100)
    budget.explore(counting_test(seen))
    assert len(seen) == budget.ran == 100
    assert budget.cut_short("full") == ""


def test_a_failure_is_still_shrunk_and_raised_once_the_budget_is_spent():
    seen: list[int] = []
    budget = CaseBudget(0.0, planned=100)
    with pytest.raises(AssertionError, match="1000 is too large"):
        budget.explore(counting_test(seen, fails_at=1000))
    assert len(seen) > BUDGET_FLOOR, "the shrinking ran past the floor: the budget was off"


class Counter(RuleBasedStateMachine):
    """Draws every step inside the case, as the kit's sink state machines do."""

    cases = 0

    def __init__(self) -> None:
        super().__init__()
        Counter.cases += 1
        self.total = 0

    @rule(amount=st.integers(0, 5))
    def add(self, amount: int) -> None:
        self.total += amount


def test_a_state_machine_is_cut_short_between_cases_without_confusing_hypothesis():
    Counter.cases = 0
    test = get_state_machine_test(
        Counter, settings=settings(max_examples=100, database=None, derandomize=True)
    )
    budget = CaseBudget(0.0, planned=100)
    budget.explore(test)  # a case stopped before its draws made Hypothesis raise Flaky*
    assert Counter.cases == budget.ran == BUDGET_FLOOR
