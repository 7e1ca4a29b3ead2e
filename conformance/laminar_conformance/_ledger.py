"""The reference model of a destination: which ids were written when, and what they became."""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from laminar_sdk import SinkConnectorCapabilities


class AttemptStatus(enum.Enum):
    """Where one attempt at an epoch stands."""

    WRITING = "writing"
    PRE_COMMITTED = "pre-committed"
    DECIDED = "decided"
    """Pre-committed, and the runtime's record of the epoch is durable: it must be committed."""
    COMMITTED = "committed"
    ROLLED_BACK = "rolled back"
    ABANDONED = "abandoned"
    """Given up without a rollback: a failed task attempt, or the staging of a crashed run."""


@dataclass(slots=True)
class Attempt:
    """One attempt at writing an epoch, or a write task's share of it.

    A rolled-back epoch is attempted again; a failed task is retried as a new attempt.
    """

    epoch: int
    number: int
    ids: list[int] = field(default_factory=list)
    status: AttemptStatus = AttemptStatus.WRITING
    task: str | None = None

    def __str__(self) -> str:
        task = "" if self.task is None else f", task {self.task!r}"
        return f"epoch {self.epoch} (attempt {self.number}{task}, {self.status.value})"


_GIVEN_UP = {
    AttemptStatus.ROLLED_BACK: "a rolled-back epoch",
    AttemptStatus.ABANDONED: "an abandoned attempt",
}


class Ledger:
    """Every id the kit wrote, the attempt it was written in, and the epochs committed.

    Ids are unique across attempts, so an id seen by a reader tells which attempt leaked or
    was duplicated.

    :param commit_call: the call that publishes an epoch, for messages.
    """

    def __init__(self, commit_call: str = "commit_epoch") -> None:
        self._commit_call = commit_call
        self._attempts: list[Attempt] = []
        self._origin: dict[int, Attempt] = {}
        self.committed: dict[int, list[int]] = {}

    @property
    def next_epoch(self) -> int:
        """The epoch after the newest committed one: the next to begin."""
        return max(self.committed, default=-1) + 1

    def begin(self, epoch: int, task: str | None = None) -> Attempt:
        """Start a new attempt at ``epoch`` (as write task ``task``, if given)."""
        number = 1 + sum(attempt.epoch == epoch for attempt in self._attempts)
        attempt = Attempt(epoch, number, task=task)
        self._attempts.append(attempt)
        return attempt

    def fresh_ids(self, attempt: Attempt, count: int) -> list[int]:
        """``count`` ids never used before, written in ``attempt``."""
        start = len(self._origin)
        ids = list(range(start, start + count))
        for record in ids:
            self._origin[record] = attempt
        attempt.ids += ids
        return ids

    def commit(self, epoch: int, attempts: Iterable[Attempt]) -> None:
        """Record that ``epoch`` was committed, made of ``attempts`` (one, or the tasks')."""
        self.committed[epoch] = []
        for attempt in attempts:
            attempt.status = AttemptStatus.COMMITTED
            self.committed[epoch] += attempt.ids

    @staticmethod
    def roll_back(attempt: Attempt) -> None:
        """Record that ``attempt`` was rolled back (or abandoned undecided)."""
        attempt.status = AttemptStatus.ROLLED_BACK

    def expected(self) -> Counter[int]:
        """Every id of every committed epoch, once."""
        return Counter(record for ids in self.committed.values() for record in ids)

    def problems(
        self, visible: Iterable[int], capabilities: SinkConnectorCapabilities
    ) -> list[str]:
        """How ``visible`` (what a reader sees) breaks what the sink's capabilities promise.

        Every sink: no id of a committed epoch is missing. ``exactly_once``: none is visible
        twice, and nothing of a rolled-back or abandoned attempt is visible.
        ``two_phase_commit``: nothing of an epoch not committed yet is visible either.
        """
        seen = Counter(visible)
        expected = self.expected()
        problems = [
            f"lost: {self._describe(ids)} committed, but not visible"
            for ids in self._by_attempt(expected - seen)
        ]
        extra = seen - expected
        if capabilities.exactly_once:
            problems += [
                f"duplicated: {self._describe(ids)} visible more than once"
                for ids in self._by_attempt(record for record in extra if record in expected)
            ]
        for ids in self._by_attempt(record for record in extra if record not in expected):
            attempt = self._origin.get(ids[0])
            if attempt is None:
                problems.append(f"ids the kit never wrote are visible: {ids}")
            elif attempt.status in _GIVEN_UP:
                if capabilities.exactly_once or capabilities.two_phase_commit:
                    problems.append(
                        f"{_GIVEN_UP[attempt.status]} left a trace: {self._describe(ids)}"
                    )
            elif capabilities.two_phase_commit:
                problems.append(f"visible before {self._commit_call}: {self._describe(ids)}")
        return problems

    def _by_attempt(self, ids: Iterable[int]) -> list[list[int]]:
        groups: dict[int, list[int]] = {}
        for record in sorted(set(ids)):
            attempt = self._origin.get(record)
            groups.setdefault(-1 if attempt is None else id(attempt), []).append(record)
        return list(groups.values())

    def _describe(self, ids: list[int]) -> str:
        shown = ids if len(ids) <= 8 else [*ids[:8], "..."]
        return f"ids {shown} of {self._origin[ids[0]]}"
