"""Which crash points inside calls a check crashes at, and the coverage its report shows.

A clean run (:class:`~laminar_conformance._faults.FaultPlan` with ``discovering``) finds the
points inside a connector's calls; the checks of both roles choose from them here, with the
same rules: every site once, a seeded sample of the rest, some by a real kill.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable, Iterable, Mapping

from laminar_conformance._faults import INSIDE, Fault, FaultPlan, FaultPoint, KillNotReached
from laminar_conformance._figures import Figures
from laminar_conformance._profiles import Profile

CRASHES_PER_RUN = 3
"""Crashes inside calls one run of the check takes, each in an epoch of its own (1, 2, 3)."""


def runs_of(
    points: Iterable[FaultPoint], reached: Mapping[tuple[str, Fault], set[int]]
) -> list[list[FaultPoint]]:
    """``points`` in groups of up to :data:`CRASHES_PER_RUN`, each at an epoch of its own.

    A point goes to the first group with a free epoch among ``1 .. CRASHES_PER_RUN`` that the
    clean run reached it in (``reached``), at that epoch; a point reached in none of them
    (the first epoch's own work, the last epoch's) runs alone, at its own.
    """
    groups: list[list[FaultPoint]] = []
    for point in points:
        epochs = reached[str(point.where), point.fault] & set(range(1, CRASHES_PER_RUN + 1))
        for group in groups if epochs else ():
            free = sorted(epochs - {member.epoch for member in group})
            if free and len(group) < CRASHES_PER_RUN and 1 <= group[0].epoch <= CRASHES_PER_RUN:
                group.append(dataclasses.replace(point, epoch=free[0]))
                break
        else:
            groups.append([point])
    return groups


_RUN = re.compile(r" \(run \d+\)$")


def site_of(where: str) -> str:
    """The call site of the point at ``where``: ``where`` without its ``(run N)``.

    A statement in a loop is one site; each of its runs in a call is a point of its own.
    """
    return _RUN.sub("", where)


def chosen_points(
    found: FaultPlan, profile: Profile, seed: int | None
) -> list[tuple[FaultPoint, bool]]:
    """The crash points inside calls to crash at, each with whether by a real kill.

    Every site is crashed at once at least, before or after its first run in the call (drawn
    with ``seed``), and the other side, and its other runs (a statement in a loop), up to the
    profile's ``inside_crashes`` cases in all. A connector that runs code in threads of its own
    is only killed: a simulated crash stops the calling thread, and its threads would go on
    (holding their transactions and locks) where a killed process takes them along; so is a
    point in an asyncio task the connector started (a crash there would end the task, and
    leave the call waiting for it). Otherwise, up to the profile's ``inside_kills``, points
    are crashed both ways: one point of each call first, then the others.
    """
    draw = random.Random(seed or 0)  # noqa: S311 - a test selection, not a secret
    by_site: dict[str, list[Fault]] = {}
    for where, fault in sorted(found.reached_inside, key=lambda point: (point[0], point[1].value)):
        by_site.setdefault(where, []).append(fault)
    first_runs: dict[str, str] = {}  # sorted, a site's first run comes first (no "(run N)")
    for where in by_site:
        first_runs.setdefault(site_of(where), where)
    first = [(where, draw.choice(by_site[where])) for where in first_runs.values()]
    rest = [(w, f) for w, faults in by_site.items() for f in faults if (w, f) not in first]
    draw.shuffle(rest)
    points = first + rest[: max(0, profile.inside_crashes - len(first))]
    threaded = bool(found.in_own_threads)
    by_call = {where.removeprefix(INSIDE).partition(":")[0]: (where, f) for where, f in points}
    to_kill = [*by_call.values(), *(point for point in points if point not in by_call.values())]
    killed = set(points if threaded else to_kill[: profile.inside_kills])
    killed |= found.in_own_tasks.intersection(points)
    chosen = []
    for where, fault in points:
        epochs = found.reached_inside[where, fault]
        point = FaultPoint(where, fault, 1 if 1 in epochs else min(epochs))
        if not threaded and (where, fault) not in found.in_own_tasks:
            chosen.append((point, False))
        if (where, fault) in killed:
            chosen.append((point, True))
    return chosen


def coverage(found: FaultPlan, crashed: list[tuple[FaultPoint, bool]]) -> str:
    """Per protocol call of a clean run: the crash points found inside it, and those crashed at."""
    calls = dict.fromkeys(event.what for event in found.trace if not event.what.startswith("step"))
    parts = []
    for call in calls:
        prefix = f"{INSIDE}{call}: "
        points = [point for point in found.reached_inside if point[0].startswith(prefix)]
        sites = {site_of(where) for where, _ in points}
        if not points:
            parts.append(f"{call}: no point (nothing it ran left Python)")
            continue
        hit = [kill for point, kill in crashed if str(point.where).startswith(prefix)]
        parts.append(
            f"{call}: {len(sites)} site(s), {len(points)} point(s), crashed at "
            f"{hit.count(False)} in process and {hit.count(True)} killed"
        )
    return "; ".join(parts)


CheckRun = Callable[[list[FaultPoint], FaultPoint | None], list[FaultPoint]]
"""One run of a check: crashing in process at the points given (one an epoch), after a kill
in a child process at the point given (or none); it returns the points that fired, and fails
with an :class:`AssertionError` saying what a reader saw."""


def crash_at_chosen_points(
    found: FaultPlan, profile: Profile, seed: int | None, figures: Figures, check_run: CheckRun
) -> None:
    """Run ``check_run`` crashing at each point :func:`chosen_points` chooses from ``found``.

    The kills first, one a run; then the points crashed in process, up to
    :data:`CRASHES_PER_RUN` a run (:func:`runs_of`). The report's coverage is kept up to date
    (``figures.crash_points``), so that a failing check says how far it got. A kill at a point
    the clean run reached in a task or thread the connector started itself is left out of the
    coverage when the child's run did not reach it: when such code runs is the scheduler's
    choice, and the verdict must not depend on it (at a point the calling thread reaches, a
    miss is the kit's error, and fails the check).
    """
    crashed: list[tuple[FaultPoint, bool]] = []
    chosen = chosen_points(found, profile, seed)
    scheduled = found.in_own_tasks | found.in_own_threads
    for point in (point for point, kill in chosen if kill):
        crashed.append((point, True))
        figures.crash_points = coverage(found, crashed)
        try:
            check_run([], point)
        except AssertionError as error:
            if isinstance(error, KillNotReached) and (str(point.where), point.fault) in scheduled:
                # Reached in the clean run in a task or thread of the connector's own, when
                # the scheduler ran it there: another run may reach it sooner or later.
                crashed.pop()
                continue
            raise AssertionError(f"killed with SIGKILL in a child process: {error}") from None
    figures.crash_points = coverage(found, crashed)
    in_process = (point for point, kill in chosen if not kill)
    for group in runs_of(in_process, found.reached_inside):
        crashed += [(point, False) for point in group]
        figures.crash_points = coverage(found, crashed)
        _crash_in_one_run(check_run, group)


def _crash_in_one_run(check_run: CheckRun, group: list[FaultPoint]) -> None:
    """One run crashing at each point of ``group`` (one an epoch); a failure is narrowed.

    A failing run is run again for each of its points alone, so that the failure reported
    is one crash's, with its timeline; a point the run did not reach (the crash before it
    changed what the connector did) is run alone too.
    """
    try:
        fired = check_run(group, None)
    except AssertionError as together:
        for point in group:
            check_run([point], None)
        raise AssertionError(
            f"crashing at {'; '.join(map(str, group))} in one run failed, and each alone "
            f"passed: {together}"
        ) from together
    for point in group:
        if point not in fired:
            check_run([point], None)
