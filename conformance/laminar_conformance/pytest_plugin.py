"""The kit's pytest plugin: the ``--laminar-profile`` option and a header line.

Installed with the kit through the ``pytest11`` entry point. The suites work without it (the
profile then comes from ``$LAMINAR_CONFORMANCE_PROFILE``, default ``quick``).
"""

from __future__ import annotations

import pytest

from laminar_conformance._profiles import (
    PROFILE_OPTION,
    PROFILE_VARIABLE,
    PROFILES,
    selected_profile,
    session_seed,
)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--laminar-profile``."""
    group = parser.getgroup("laminar-conformance", "Laminar conformance kit")
    group.addoption(
        "--laminar-profile",
        dest=PROFILE_OPTION,
        choices=sorted(PROFILES),
        default=None,
        help=(
            "how much the conformance checks explore: quick (under a minute per connector) or "
            f"full (under ten minutes); default ${PROFILE_VARIABLE}, else quick"
        ),
    )


def pytest_report_header(config: pytest.Config) -> str:
    """The profile and the seed every conformance check runs with."""
    seed = session_seed(config)
    shown = (
        "derandomized (CI)" if seed is None else f"{seed} (replay with --hypothesis-seed={seed})"
    )
    return f"laminar-conformance: profile {selected_profile(config).name}, seed {shown}"
