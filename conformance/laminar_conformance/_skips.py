"""Why a check did not run, by category: so that no skip hides in a green run.

Every skip the kit makes names its category (``[live-appends] ...``). A test context turns a
check off only by stating why, in its ``skip_checks`` mapping of category to reason; the
report prints the reason, and ``--strict`` accepts a skipped *core* check only when its
context stated one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn

import pytest

CORE_CATEGORIES: Mapping[str, str] = {
    "replay": "restoring checkpoints on new instances (sources)",
    "multi-partition": "several partitions, each restored on its own (sources)",
    "live-appends": "records appended while a source runs (sources)",
    "rollback": "rolling an epoch back, and crashes around commit (sinks)",
    "crash-points": (
        "crashes inside an exactly-once sink's calls, wherever they leave Python (sinks)"
    ),
    "spark": "the Spark layer: pipelines killed and restarted on real Spark",
}
"""The checks ``--strict`` requires, by category, with what they cover."""

OTHER_CATEGORIES: Mapping[str, str] = {
    "range-reads": "as_range_readable(): range reads against polling (sources)",
    "partition-removal": "a partition removed while a source runs (sources whose context can)",
    "read-back": "comparing what a sink's destination holds (sinks)",
    "capability": "a capability the connector does not declare or the kit cannot exercise",
    "configuration": "configuration errors for declared keys",
    "network": "network faults through a proxy (contexts that name their connector's endpoint)",
}
"""Categories a run may skip without ``--strict`` failing."""

CATEGORIES = {**CORE_CATEGORIES, **OTHER_CATEGORIES}

STATED = "turned off by the test context: "
"""How the reason of a check its context turned off starts."""

_PREFIX = re.compile(r"\[(?P<category>[a-z-]+)\] (?P<reason>.*)", re.DOTALL)


def skip(category: str, reason: str) -> NoReturn:
    """Skip the running check, filing the skip under ``category``."""
    assert category in CATEGORIES, f"unknown skip category {category!r}"
    pytest.skip(f"[{category}] {reason}")


def stated_reasons(context: object) -> dict[str, str]:
    """The checks ``context`` turns off (its ``skip_checks``), by category, with reasons.

    :raises AssertionError: when ``skip_checks`` is not a mapping of known categories to
        non-empty reasons (a check then fails, naming what is wrong).
    """
    stated = getattr(context, "skip_checks", None)
    if stated is None:
        return {}
    assert isinstance(stated, Mapping), (
        f"the test context's skip_checks is {type(stated).__name__}, not a mapping of "
        f"category to reason (categories: {', '.join(CATEGORIES)})"
    )
    unknown = sorted(set(stated) - set(CATEGORIES))
    assert not unknown, (
        f"the test context's skip_checks names unknown categories {unknown}; the categories "
        f"are {', '.join(CATEGORIES)}"
    )
    for category, reason in stated.items():
        assert isinstance(reason, str), f"skip_checks[{category!r}] is not a string"
        assert reason.strip(), (
            f"the test context turns {category!r} off without a reason: give skip_checks"
            f"[{category!r}] a sentence saying why the check cannot apply"
        )
    return {category: reason.strip() for category, reason in stated.items()}


@dataclass(frozen=True, slots=True)
class Skip:
    """A skip's category (``""`` when the skip named none), reason, and whether it was stated."""

    category: str
    reason: str

    @classmethod
    def parse(cls, text: str) -> Skip:
        """The skip whose pytest reason is ``text``."""
        found = _PREFIX.fullmatch(text.strip())
        if found is None or found["category"] not in CATEGORIES:
            return cls("", text.strip())
        return cls(found["category"], found["reason"])

    @property
    def stated(self) -> bool:
        """Whether the test context turned the check off, saying why."""
        return self.reason.startswith(STATED)

    @property
    def hides_a_core_check(self) -> bool:
        """Whether ``--strict`` fails on this skip: a core check, no reason stated."""
        return self.category in CORE_CATEGORIES and not self.stated
