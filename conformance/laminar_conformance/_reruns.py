"""Flaky or deterministic: each failed check run again with the same seed, and labelled.

A red run is either a bug to fix — the check fails every time with the same seed — or a
failure that comes and goes (a race, a timeout, a service that answers late). After a run,
``laminar conformance run`` runs each failed check again, alone, with the run's seed and
profile (:data:`DEFAULT_RERUNS` times unless ``--reruns`` says otherwise, within
:data:`RERUN_BUDGET_S`), and labels it ``deterministic`` or ``flaky (k of n)`` with what
differed. The label is in the terminal, the markdown, HTML and JUnit reports; a flaky
failure still fails the run.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

import pytest

from laminar_conformance._report import CheckResult, ReportCollector

DEFAULT_RERUNS = 2
"""How many times a failed check runs again by default."""

RERUN_BUDGET_S = 300.0
"""The most time the re-runs of one run may take; checks left over are labelled so."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One run of a check: whether it failed, and the first line of why."""

    failed: bool
    reason: str


def stability(attempts: Sequence[Attempt]) -> tuple[str, str]:
    """The label of a check from its runs (the first one failed), and what differed.

    ``deterministic`` when every run failed the same way; ``flaky (k of n)`` otherwise.
    """
    runs = len(attempts)
    failed = sum(attempt.failed for attempt in attempts)
    if runs == 1:
        return "not re-run", "the re-runs' time budget was spent before this check"
    if failed < runs:
        passed = [str(number) for number, attempt in enumerate(attempts) if not attempt.failed]
        return (
            f"flaky ({failed} of {runs})",
            f"re-run{'s' if len(passed) > 1 else ''} {', '.join(passed)} passed with the same seed",
        )
    first = attempts[0].reason
    others = [
        f"re-run {number} failed with: {attempt.reason}"
        for number, attempt in enumerate(attempts)
        if number and attempt.reason != first
    ]
    if others:
        return f"flaky ({failed} of {runs})", "; ".join(others)
    return "deterministic", f"failed the same way in all {runs} runs with the same seed"


def rerun_failures(
    collector: ReportCollector, root: Path, argv: Sequence[str], reruns: int
) -> None:
    """Run each failed check of ``collector`` ``reruns`` times more and label it there.

    :param root: pytest's root directory of the run (its node ids are relative to it).
    :param argv: pytest's arguments for one check, ``{check}`` standing for its node id.
    """
    started = time.monotonic()
    for nodeid, result in collector.results.items():
        if result.outcome != "failed":
            continue
        attempts = [Attempt(failed=True, reason=result.reason)]
        for _ in range(reruns):
            if time.monotonic() - started > RERUN_BUDGET_S:
                break
            attempts.append(_attempt(root, nodeid, argv))
        result.stability, result.differed = stability(attempts)


def _attempt(root: Path, nodeid: str, argv: Sequence[str]) -> Attempt:
    again = ReportCollector()
    check = f"{root}/{nodeid}"
    arguments = [check if argument == "{check}" else argument for argument in argv]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        pytest.main(arguments, plugins=[again])
    result = again.results.get(nodeid)
    if result is None:
        return Attempt(failed=True, reason="the re-run did not run the check")
    return Attempt(failed=result.outcome == "failed", reason=result.reason)


def label_junit(path: Path, results: Sequence[CheckResult]) -> None:
    """Add each failed check's label to the JUnit file at ``path``.

    Its ``<failure>`` message starts with ``[label]``, and the test case gets the property
    ``laminar.stability`` (the label) and ``laminar.differed``.
    """
    labelled = {result.name: result for result in results if result.stability}
    if not labelled:
        return
    tree = ElementTree.parse(path)  # noqa: S314 - the JUnit file pytest wrote just before
    for case in tree.iter("testcase"):
        result = labelled.get(case.get("name", ""))
        failure = case.find("failure")
        if result is None or failure is None:
            continue
        failure.set("message", f"[{result.stability}] {failure.get('message', '')}")
        properties = case.find("properties")
        if properties is None:
            properties = ElementTree.SubElement(case, "properties")
        for name, value in (
            ("laminar.stability", result.stability),
            ("laminar.differed", result.differed),
        ):
            ElementTree.SubElement(properties, "property", name=name, value=value)
    tree.write(path, encoding="utf-8", xml_declaration=True)
