"""The kit's pytest plugin: its options (``--laminar-profile``, ...) and a header line.

Installed with the kit through the ``pytest11`` entry point. The suites work without it (the
profile then comes from ``$LAMINAR_CONFORMANCE_PROFILE``, default ``quick``).
"""

from __future__ import annotations

import pytest

from laminar_conformance._profiles import (
    NO_SPARK_OPTION,
    PROFILE_OPTION,
    PROFILE_VARIABLE,
    PROFILES,
    SPARK_CRASHES_OPTION,
    selected_profile,
    session_seed,
)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--laminar-profile``, ``--laminar-no-spark`` and ``--laminar-spark-crashes``."""
    group = parser.getgroup("laminar-conformance", "Laminar conformance kit")
    group.addoption(
        "--laminar-profile",
        dest=PROFILE_OPTION,
        choices=sorted(PROFILES),
        default=None,
        help=(
            "how much the conformance checks explore: quick (in process under a minute per "
            "connector; on Spark one crash) or full (under ten minutes in process; on Spark "
            f"all ten crash points); default ${PROFILE_VARIABLE}, else quick"
        ),
    )
    group.addoption(
        "--laminar-no-spark",
        dest=NO_SPARK_OPTION,
        action="store_true",
        default=False,
        help="skip the conformance checks that run pipelines on Spark (the in-process ones run)",
    )
    group.addoption(
        "--laminar-spark-crashes",
        dest=SPARK_CRASHES_OPTION,
        default=None,
        metavar="STEP:EPOCH[:WHEN],...",
        help=(
            "kill each Spark case's pipeline at these crash points, in order, instead of "
            "drawing them: the replay of a failure's crash schedule"
        ),
    )


def pytest_report_header(config: pytest.Config) -> str:
    """The profile and the seed every conformance check runs with."""
    seed = session_seed(config)
    shown = (
        "derandomized (CI)" if seed is None else f"{seed} (replay with --hypothesis-seed={seed})"
    )
    return f"laminar-conformance: profile {selected_profile(config).name}, seed {shown}"
