"""The markdown report of ``laminar conformance run``, built from pytest's reports."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from laminar_conformance._figures import FIGURE_PREFIX, Figures

_OUTCOME_ORDER = {"failed": 0, "passed": 1, "skipped": 2}

SPARK_CHECK_PREFIX = "test_spark_"
"""The names of the Spark layer's checks start with this: the report sums them up."""

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
            elif key.startswith(FIGURE_PREFIX) and isinstance(value, int):
                result.figures[key.removeprefix(FIGURE_PREFIX)] = value
        if report.failed:
            result.outcome = "failed"
            crash = getattr(report.longrepr, "reprcrash", None)
            message = getattr(crash, "message", None) or str(report.longrepr)
            result.reason = message.strip().splitlines()[0] if message.strip() else ""
        elif report.skipped and result.outcome != "failed":
            result.outcome = "skipped"
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            result.reason = reason.removeprefix("Skipped: ")

    def counts(self) -> Counter[str]:
        """How many checks passed, failed and were skipped."""
        return Counter(result.outcome for result in self.results.values())

    def totals(self, prefix: str = "") -> dict[str, int]:
        """Every figure summed over the checks (whose names start with ``prefix``)."""
        chosen = [r for r in self.results.values() if r.name.startswith(prefix)]
        return {
            name: sum(result.figures.get(name, 0) for result in chosen)
            for name in Figures.__dataclass_fields__
        }

    def spark_summary(self, planned: str) -> str:
        """How the Spark layer's checks went, with their figures; ``planned`` if none ran."""
        spark = [r for r in self.results.values() if r.name.startswith(SPARK_CHECK_PREFIX)]
        if not spark:
            return planned
        if all(result.outcome == "skipped" for result in spark):
            return f"skipped: {spark[0].reason}"
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


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def write_report(
    path: Path, run: RunDescription, collector: ReportCollector, elapsed_s: float
) -> None:
    """Write the markdown report of a run to ``path``."""
    counts = collector.counts()
    totals = collector.totals()
    verdict = "FAILED" if counts["failed"] else "PASSED"
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
        figures = [str(result.figures.get(name, 0)) for name in Figures.__dataclass_fields__]
        lines.append(
            f"| {_cell(result.name)} | {result.outcome} | {' | '.join(figures)} | "
            f"{result.duration_s:.2f} | {_cell(result.reason)} |"
        )
    skipped = [r for r in ordered if r.outcome == "skipped"]
    if skipped:
        lines += ["", "## Skipped, with reasons", ""]
        lines += [f"- `{r.name}`: {r.reason}" for r in skipped]
    failed = [r for r in ordered if r.outcome == "failed"]
    if failed:
        lines += ["", "## Failures", "", f"Replay with `{run.replay_command}`.", ""]
        lines += [f"- `{r.name}`: {r.reason}" for r in failed]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
