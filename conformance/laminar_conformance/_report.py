"""The markdown report of ``laminar conformance run``, built from pytest's reports."""

from __future__ import annotations

import html
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from laminar_conformance._figures import (
    COUNTERS,
    CRASH_POINTS_PROPERTY,
    CUT_SHORT_PROPERTY,
    FIGURE_PREFIX,
    TIMELINE_PROPERTY,
)
from laminar_conformance._skips import CATEGORIES, CORE_CATEGORIES, Skip
from laminar_conformance._timeline import Timeline

_OUTCOME_ORDER = {"failed": 0, "passed": 1, "skipped": 2}

SPARK_CHECK_PREFIX = "test_spark_"
"""The names of the Spark layer's checks start with this: the report sums them up."""

PROBED_PROPERTY = "laminar.probed"
"""The user property in which the probe check reports what it found the connector does."""

SPARK_SCHEDULES_PROPERTY = "laminar.spark.schedules"
"""The user property in which a Spark check reports the crash schedules it ran."""


@dataclass(slots=True)
class CheckResult:
    """One check's outcome, the reason for a skip or a failure, its time and figures."""

    name: str
    outcome: str = "passed"
    reason: str = ""
    duration_s: float = 0.0
    figures: dict[str, int] = field(default_factory=dict)
    schedules: str = ""
    """The crash schedules a Spark check ran, ``;``-separated."""
    probed: str = ""
    """What the probe check found the connector does."""
    crash_points: str = ""
    """The crash points a check found inside the sink's calls, and those it crashed at."""
    cut_short: str = ""
    """How many of its planned cases the profile's time budget let the check run."""
    timeline: str = ""
    """The failing case's timeline, as JSON, when the check drew one."""
    diagnosis: str = ""
    """A failure's whole message: what went wrong, the minimal schedule, how to replay it."""
    stability: str = ""
    """A failure's label once run again: ``deterministic`` or ``flaky (k of n)``."""
    differed: str = ""
    """What the runs of a failed check showed: which passed, or how their failures differed."""

    def labelled_reason(self) -> str:
        """The reason, a failure's label first when it has one."""
        return f"{self.stability}: {self.reason}" if self.stability else self.reason

    def labelled_name(self) -> str:
        """The name, with a failure's label and what its runs showed when it has them."""
        return f"{self.name} [{self.stability}: {self.differed}]" if self.stability else self.name


@dataclass(frozen=True, slots=True)
class RunDescription:
    """What was run, for the report's heading."""

    connector: str
    role: str
    distribution: str
    capabilities: tuple[str, ...]
    profile: str
    seed: int
    replay_command: str
    spark: str
    """What the Spark layer was to do, or why it did not run (``not run (--no-spark)``)."""
    strict: bool = False
    """Whether a core check skipped without a stated reason fails the run (``--strict``)."""


class ReportCollector:
    """A pytest plugin object that keeps every check's result for :func:`write_report`."""

    def __init__(self) -> None:
        self.results: dict[str, CheckResult] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Record the outcome of each phase of each check."""
        name = report.nodeid.split("::")[-1]
        result = self.results.setdefault(report.nodeid, CheckResult(name))
        result.duration_s += report.duration
        for key, value in report.user_properties:
            if key == SPARK_SCHEDULES_PROPERTY and isinstance(value, str):
                result.schedules = value
            elif key == PROBED_PROPERTY and isinstance(value, str):
                result.probed = value
            elif key == TIMELINE_PROPERTY and isinstance(value, str):
                result.timeline = value
            elif key == CRASH_POINTS_PROPERTY and isinstance(value, str):
                result.crash_points = value
            elif key == CUT_SHORT_PROPERTY and isinstance(value, str):
                result.cut_short = value
            elif key.startswith(FIGURE_PREFIX) and isinstance(value, int):
                result.figures[key.removeprefix(FIGURE_PREFIX)] = value
        if report.failed:
            result.outcome = "failed"
            crash = getattr(report.longrepr, "reprcrash", None)
            message = (getattr(crash, "message", None) or str(report.longrepr)).strip()
            result.reason = message.splitlines()[0] if message else ""
            result.diagnosis = message
        elif report.skipped and result.outcome != "failed":
            result.outcome = "skipped"
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            result.reason = reason.removeprefix("Skipped: ")

    def failures(self) -> list[CheckResult]:
        """The failed checks, those saying what a reader of the destination saw first.

        A check whose case drew a timeline (lost or duplicated ids, and the calls that led
        there) states the bug; then the kit's other verdicts; last, checks that failed because
        the connector raised (often a consequence of the bug a verdict states).
        """
        failed = [result for result in self.results.values() if result.outcome == "failed"]
        return sorted(failed, key=_failure_rank)

    def counts(self) -> Counter[str]:
        """How many checks passed, failed and were skipped."""
        return Counter(result.outcome for result in self.results.values())

    def probed(self) -> str:
        """What the probe check found the connector does (``""`` when it did not run)."""
        return next((r.probed for r in self.results.values() if r.probed), "")

    def crash_points(self) -> str:
        """The crash points found inside sink calls, and crashed at (``""``: none looked for)."""
        return next((r.crash_points for r in self.results.values() if r.crash_points), "")

    def skips(self) -> list[tuple[str, Skip]]:
        """Every skipped check's name and skip, in the order they ran."""
        return [
            (r.name, Skip.parse(r.reason)) for r in self.results.values() if r.outcome == "skipped"
        ]

    def hidden_core_skips(self) -> list[tuple[str, Skip]]:
        """The skipped core checks whose test context stated no reason: ``--strict`` fails."""
        return [(name, skip) for name, skip in self.skips() if skip.hides_a_core_check]

    def not_tested(self) -> list[str]:
        """What was not tested and why, by category, core categories first (markdown lines)."""
        by_category: dict[str, list[tuple[str, Skip]]] = {}
        for name, skip in self.skips():
            by_category.setdefault(skip.category, []).append((name, skip))
        lines: list[str] = []
        for category in [*CATEGORIES, ""]:
            skipped = by_category.get(category)
            if not skipped:
                continue
            core = " (core)" if category in CORE_CATEGORIES else ""
            title = f"{category}{core}: {CATEGORIES[category]}" if category else "other"
            lines.append(f"- **{title}**")
            lines += [f"  - `{name}`: {skip.reason}" for name, skip in skipped]
        return lines

    def totals(self, prefix: str = "") -> dict[str, int]:
        """Every figure summed over the checks (whose names start with ``prefix``)."""
        chosen = [r for r in self.results.values() if r.name.startswith(prefix)]
        return {name: sum(result.figures.get(name, 0) for result in chosen) for name in COUNTERS}

    def spark_summary(self, planned: str) -> str:
        """How the Spark layer's checks went, with their figures; ``planned`` if none ran."""
        spark = [r for r in self.results.values() if r.name.startswith(SPARK_CHECK_PREFIX)]
        if not spark:
            return planned
        if all(result.outcome == "skipped" for result in spark):
            return f"skipped: {Skip.parse(spark[0].reason).reason}"
        outcome = "FAILED" if any(r.outcome == "failed" for r in spark) else "passed"
        totals = self.totals(SPARK_CHECK_PREFIX)
        seconds = sum(result.duration_s for result in spark)
        schedules = "; ".join(result.schedules for result in spark if result.schedules)
        return (
            f"{outcome} — {totals['cases']} pipeline(s), {totals['faults']} crash(es) "
            f"injected (SIGKILL of the Spark driver), {totals['epochs']} epochs committed, "
            f"{totals['restarts']} restarts, {seconds:.1f} s"
            + (f"; crash schedule(s): {schedules}" if schedules else "")
        )


def _failure_rank(result: CheckResult) -> int:
    if result.timeline:
        return 0
    return 1 if result.reason.startswith("AssertionError") else 2


def _shown_reason(result: CheckResult) -> str:
    """A failure's reason, a skip's as ``category: reason``, or what the time budget cut."""
    if result.outcome == "passed":
        return result.cut_short
    if result.outcome != "skipped":
        return result.labelled_reason()
    skip = Skip.parse(result.reason)
    return f"{skip.category}: {skip.reason}" if skip.category else skip.reason


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def write_report(
    path: Path, run: RunDescription, collector: ReportCollector, elapsed_s: float
) -> None:
    """Write the markdown report of a run to ``path``."""
    path.write_text(markdown_report(run, collector, elapsed_s), encoding="utf-8")


def markdown_report(run: RunDescription, collector: ReportCollector, elapsed_s: float) -> str:
    """The markdown report of a run."""
    counts = collector.counts()
    totals = collector.totals()
    hidden = collector.hidden_core_skips() if run.strict else []
    verdict = "FAILED" if counts["failed"] or hidden else "PASSED"
    lines = [
        f"# Conformance report: {run.role} `{run.connector}`",
        "",
        f"- **Result: {verdict}** — {counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['skipped']} skipped, in {elapsed_s:.1f} s",
        f"- Distribution: {run.distribution}",
        f"- Capabilities: {', '.join(run.capabilities) or 'none declared'}",
        f"- Profile: {run.profile}; seed: {run.seed}",
        f"- Replay: `{run.replay_command}`",
        f"- Figures: {totals['cases']} cases run, {totals['faults']} faults injected, "
        f"{totals['epochs']} epochs committed or checkpoints restored, "
        f"{totals['restarts']} restarts",
        f"- Spark layer: {collector.spark_summary(run.spark)}",
        f"- Probed: {collector.probed() or 'no probe ran'}",
        *(
            [f"- Crash points inside calls: {collector.crash_points()}"]
            if collector.crash_points()
            else []
        ),
        "",
        "## Checks",
        "",
        "| check | outcome | cases | faults | epochs | restarts | time (s) | reason |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    ordered = sorted(
        collector.results.values(), key=lambda r: (_OUTCOME_ORDER.get(r.outcome, 3), r.name)
    )
    for result in ordered:
        figures = [str(result.figures.get(name, 0)) for name in COUNTERS]
        lines.append(
            f"| {_cell(result.name)} | {result.outcome} | {' | '.join(figures)} | "
            f"{result.duration_s:.2f} | {_cell(_shown_reason(result))} |"
        )
    not_tested = collector.not_tested()
    if not_tested:
        lines += ["", "## Not tested, by category", "", *not_tested]
    if hidden:
        lines += ["", "## Strict: core checks skipped without a stated reason", ""]
        lines += [f"- `{name}` ({skip.category})" for name, skip in hidden]
    failed = collector.failures()
    if failed:
        lines += ["", "## Failures", "", f"Replay with `{run.replay_command}`.", ""]
        for result in failed:
            lines.append(f"- `{result.name}`: {result.labelled_reason()}")
            if result.differed:
                lines.append(f"  - runs: {result.differed}")
    return "\n".join(lines) + "\n"


def write_html_report(
    path: Path, run: RunDescription, collector: ReportCollector, elapsed_s: float
) -> None:
    """Write the report of a run to ``path`` as one HTML page, each failing case drawn.

    The page holds what the markdown report holds; under each failed check that recorded a
    timeline, the picture of its (minimal) failing case: one row per sink instance, one box
    per protocol call, the injected fault or kill in colour, and the ids a reader then saw
    lost or duplicated.
    """
    summary = markdown_report(run, collector, elapsed_s)
    failed = collector.failures()
    sections = []
    for result in failed:
        picture = Timeline.from_json(result.timeline).svg() if result.timeline else ""
        sections.append(
            f"<h2>{html.escape(result.name)}</h2><p>{html.escape(result.labelled_reason())}</p>"
            + (f"<p>Runs: {html.escape(result.differed)}</p>" if result.differed else "")
            + (picture or "<p>(this check draws no timeline)</p>")
        )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>Conformance report: {html.escape(run.role)} {html.escape(run.connector)}</title>"
        "</head><body><h1>Failing cases</h1>"
        + ("".join(sections) or "<p>None: every check that ran passed.</p>")
        + f"<h1>Report</h1><pre>{html.escape(summary)}</pre></body></html>\n"
    )
    path.write_text(page, encoding="utf-8")
