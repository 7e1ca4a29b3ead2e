"""The kit's pytest plugin: options, a header line, and what was not tested, by category.

Installed with the kit through the ``pytest11`` entry point. The suites work without it (the
profile then comes from ``$LAMINAR_CONFORMANCE_PROFILE``, default ``quick``).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from laminar_conformance._profiles import (
    NO_SPARK_OPTION,
    PROFILE_OPTION,
    PROFILE_VARIABLE,
    PROFILES,
    SPARK_CHECK,
    SPARK_CRASHES_FLAG,
    SPARK_CRASHES_OPTION,
    STRICT_OPTION,
    crash_schedule,
    selected_profile,
    session_seed,
)
from laminar_conformance._report import ReportCollector
from laminar_sdk import ConfigurationError

_RESULTS = pytest.StashKey[ReportCollector]()


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
    group.addoption(
        "--laminar-strict",
        dest=STRICT_OPTION,
        action="store_true",
        default=False,
        help=(
            "fail the run when a core conformance check (replay, multi-partition, rollback, "
            "live appends, the Spark layer) was skipped and its test context stated no reason "
            "in skip_checks"
        ),
    )


def pytest_configure(config: pytest.Config) -> None:
    """Check ``--laminar-spark-crashes``; collect every check's outcome for the summary.

    ``laminar conformance run`` passes its own collector (for its report): that one is used.

    :raises pytest.UsageError: for a malformed crash schedule, before any check runs.
    """
    schedule = config.getoption(SPARK_CRASHES_OPTION, None)
    if schedule:
        try:
            crash_schedule(schedule, SPARK_CRASHES_FLAG)
        except ConfigurationError as error:
            raise pytest.UsageError(str(error)) from None
    plugins = config.pluginmanager.get_plugins()
    results = next((p for p in plugins if isinstance(p, ReportCollector)), None)
    if results is None:
        results = ReportCollector()
        config.pluginmanager.register(results, "laminar-conformance-results")
    config.stash[_RESULTS] = results


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each Spark-layer check after the other checks of its class.

    Its first drivers start with the class's first check (``spark_drivers``), and start up
    while the in-process checks run.
    """
    for item in [item for item in items if getattr(item, "originalname", None) == SPARK_CHECK]:
        siblings = [index for index, other in enumerate(items) if other.parent is item.parent]
        if siblings[-1] != items.index(item):
            items.remove(item)
            items.insert(siblings[-1], item)


def pytest_report_header(config: pytest.Config) -> str:
    """The profile and the seed every conformance check runs with."""
    seed = session_seed(config)
    shown = (
        "derandomized (CI)" if seed is None else f"{seed} (replay with --hypothesis-seed={seed})"
    )
    return f"laminar-conformance: profile {selected_profile(config).name}, seed {shown}"


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    """What the conformance checks did not test, by category, and the strict verdict."""
    results = config.stash.get(_RESULTS, None)
    if results is None:
        return
    probed = results.probed()
    lines = results.not_tested()
    if not (probed or lines):
        return
    terminalreporter.section("laminar conformance: what was not tested")
    if probed:
        terminalreporter.write_line(f"probed: {probed}")
    for line in lines or ["- every check ran"]:
        terminalreporter.write_line(line.replace("**", ""))
    hidden = results.hidden_core_skips()
    if hidden and config.getoption(STRICT_OPTION, False):
        names = ", ".join(f"{name} ({skip.category})" for name, skip in hidden)
        terminalreporter.write_line(
            f"STRICT: core checks skipped without a reason stated in the test context's "
            f"skip_checks: {names}",
            red=True,
            bold=True,
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Generator[None, Any, None]:
    """A failed check's report shows no secret of the connector's configuration.

    Its traceback's arguments and captured log records would print them wherever the report
    goes (the terminal, JUnit, HTML, markdown): they are replaced by ``***``.
    """
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.passed or "conformance" not in getattr(item, "funcargs", {}):
        return
    # Not at the top: the plugin is loaded in every pytest session of an environment with the
    # kit, and the suites' imports are for sessions that run checks.
    from laminar_conformance._secrets import hide_secrets  # noqa: PLC0415
    from laminar_conformance._suite import Target  # noqa: PLC0415

    target = item.funcargs["conformance"]  # type: ignore[attr-defined]
    if not isinstance(target, Target):
        return
    try:
        secrets = target.secret_values()
    except Exception:  # noqa: BLE001 - the context failed: the report says how, as it is
        return
    if secrets:
        hide_secrets(report, list(secrets.values()))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """With ``--laminar-strict``, a core check skipped without a stated reason fails the run."""
    results = session.config.stash.get(_RESULTS, None)
    strict = session.config.getoption(STRICT_OPTION, False)
    hidden = results is not None and bool(results.hidden_core_skips())
    if strict and hidden and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
