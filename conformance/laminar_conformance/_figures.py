"""The figures each check reports: cases run, faults injected, epochs, restarts."""

from __future__ import annotations

from dataclasses import dataclass

FIGURE_PREFIX = "laminar."
"""Prefix of the ``user_properties`` in which each check reports its figures."""

COUNTERS = ("cases", "faults", "epochs", "restarts")
"""The figures that are counts, summed over checks."""

CRASH_POINTS_PROPERTY = "laminar.crash_points"
"""The user property in which a check reports the crash points it found inside sink calls."""

CUT_SHORT_PROPERTY = "laminar.cut_short"
"""The user property in which a check says how many of its planned cases its time budget ran."""

TIMELINE_PROPERTY = "laminar.timeline"
"""The user property in which a failing check reports its failing case's timeline (JSON)."""


@dataclass(slots=True)
class Figures:
    """What one check did, reported in its ``user_properties`` (and the run's report)."""

    cases: int = 0
    """Cases run: Hypothesis examples, or 1 for a check without Hypothesis."""
    faults: int = 0
    """Faults injected: errors and simulated crashes."""
    epochs: int = 0
    """Epochs committed (sinks) or checkpoints restored (sources)."""
    restarts: int = 0
    """New connector instances opened after a crash or a close."""
    crash_points: str = ""
    """The crash points found inside each sink call of a clean run, and those crashed at."""
    cut_short: str = ""
    """What the profile's time budget left out of the check (``""``: every case ran)."""
    timeline: str = ""
    """The timeline of the failing case, as JSON (see :func:`laminar_conformance._timeline`)."""
