"""A check's time budget: the quick profile starts no new case once a check's time is spent.

A connector whose calls are slow (an ``open`` of 70 ms, a topic made per case) would make the
quick profile run for many minutes. Each Hypothesis check of a profile with a budget
(:attr:`~laminar_conformance._profiles.Profile.case_budget_s`) runs its cases as usual until
its time is spent and at least :data:`BUDGET_FLOOR` cases ran; then it starts no new case, and
the report and the terminal say how many of the planned cases ran. A failure turns the budget
off for the rest of the check, so Hypothesis shrinks it whole. A correct connector passes
whatever the budget cut; ``--profile full`` has no budget and runs every case.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable

from hypothesis.errors import HypothesisException

BUDGET_FLOOR = 25
"""The cases a check runs whatever its time: the ones that find most bugs."""


class _Spent(BaseException):
    """Ends a Hypothesis run after a case (not an ``Exception``: not a failure)."""


class CaseBudget:
    """The time one check may take, and the cases it ran.

    :param seconds: the check's time; ``None``: every case runs.
    :param planned: the cases the profile plans for the check.
    """

    def __init__(self, seconds: float | None, planned: int) -> None:
        self._seconds = seconds
        self.planned = planned
        self.ran = 0
        self._started = time.monotonic()
        self._failed = False

    def explore(self, test: Callable[[], None]) -> None:
        """Run ``test``, a Hypothesis test, until its cases ran or the budget is spent."""
        inner = test.hypothesis.inner_test  # type: ignore[attr-defined]

        @functools.wraps(inner)
        def case(*args: object, **kwargs: object) -> None:
            self._case(inner, *args, **kwargs)

        test.hypothesis.inner_test = case  # type: ignore[attr-defined]
        with contextlib.suppress(_Spent):
            test()

    def _case(self, inner: Callable[..., None], *args: object, **kwargs: object) -> None:
        self.ran += 1
        try:
            inner(*args, **kwargs)
        except HypothesisException:
            raise  # an assumption not met, a case too large: not the connector's failure
        except Exception:
            self._failed = True
            raise
        # At the end of a case that drew all it draws: stopped before drawing, a case would
        # contradict what Hypothesis recorded of the cases before it (a state machine's
        # steps are all drawn inside the case).
        if self._spent():
            raise _Spent

    def _spent(self) -> bool:
        return (
            self._seconds is not None
            and not self._failed
            and self.ran >= BUDGET_FLOOR
            and time.monotonic() - self._started > self._seconds
        )

    def cut_short(self, profile: str) -> str:
        """What the budget left out (``""`` when every planned case ran)."""
        if self.ran >= self.planned or self._seconds is None:
            return ""
        return (
            f"ran {self.ran} of {self.planned} cases: the {profile} profile gives a check "
            f"{self._seconds:.0f} s (--profile full runs them all)"
        )
