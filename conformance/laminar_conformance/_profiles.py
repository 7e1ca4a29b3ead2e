"""Run profiles (``quick``, ``full``) and the Hypothesis settings and seed each test runs with."""

from __future__ import annotations

import importlib.util
import os
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from laminar_sdk import ConfigurationError
from laminar_sdk.faults import CrashPoint

if TYPE_CHECKING:
    from hypothesis import settings

PROFILE_OPTION = "laminar_profile"
"""The pytest option (``--laminar-profile``) that selects a profile."""

PROFILE_VARIABLE = "LAMINAR_CONFORMANCE_PROFILE"
"""The environment variable that selects a profile when the option is not given."""

NO_SPARK_OPTION = "laminar_no_spark"
"""The pytest option (``--laminar-no-spark``) that skips the Spark layer's checks."""

SPARK_CRASHES_OPTION = "laminar_spark_crashes"
"""The pytest option (``--laminar-spark-crashes=commit:1,done:3``) that sets the crash schedule
of the Spark layer's cases instead of drawing it: the replay of a failure's schedule."""

SPARK_CRASHES_FLAG = "--laminar-spark-crashes"
"""That option as it is written on pytest's command line, for errors."""

STRICT_OPTION = "laminar_strict"
"""The pytest option (``--laminar-strict``): a core check skipped without a stated reason fails."""

CI_VARIABLE = "CI"
"""Set in CI: Hypothesis runs derandomized unless a seed is given."""

_SEED_KEY = pytest.StashKey["int | None"]()


@dataclass(frozen=True, slots=True)
class Profile:
    """How much each check explores.

    :param name: ``quick`` (in process, under a minute per connector) or ``full`` (under ten
        minutes); the Spark layer adds its pipelines' time (see :data:`PROFILES`).
    :param machine_examples: schedules the epoch-protocol state machine runs.
    :param machine_steps: the most protocol calls in one schedule.
    :param recovery_examples: fault plans run through the epoch coordinator.
    :param replay_examples: poll / checkpoint / crash schedules run against a source.
    :param spark_cases: pipelines the Spark layer runs (each a Spark driver per crash, and
        one more to finish).
    :param spark_crashes: crash points each Spark case kills its pipeline at, one at a time.
    :param inside_crashes: crashes at points inside sink calls: every site found is crashed
        at once at least, and the other side of each (before or after it) up to this many.
    :param inside_kills: of those, how many are also run in a child process killed with
        SIGKILL there (one of each sink call first), besides the points reached in threads of
        the sink's own, which are always.
    :param case_budget_s: the time a check drawing cases with Hypothesis may take: once
        spent, it starts no new case (after 25 at least) and says so; ``None``: no limit
        (see :mod:`laminar_conformance._budget`).
    """

    name: str
    machine_examples: int
    machine_steps: int
    recovery_examples: int
    replay_examples: int
    spark_cases: int = 1
    spark_crashes: int = 1
    inside_crashes: int = 20
    inside_kills: int = 4
    case_budget_s: float | None = None

    def settings(self, examples: int, *, seeded: bool) -> settings:
        """Hypothesis settings for a check that runs ``examples`` cases.

        Derandomized in CI when no seed is given; without the example database when seeded,
        so that the seed alone decides what runs.
        """
        # Imported here: `laminar conformance run` reads the profiles before pytest starts,
        # and pytest cannot rewrite Hypothesis's modules once they are imported.
        from hypothesis import HealthCheck, Phase, settings  # noqa: PLC0415

        derandomize = not seeded and bool(os.environ.get(CI_VARIABLE))
        chosen = settings(
            max_examples=examples,
            stateful_step_count=self.machine_steps,
            deadline=None,
            derandomize=derandomize,
            print_blob=True,
            report_multiple_bugs=False,
            # No explain phase: it re-runs the failing case many times for little insight here.
            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
            suppress_health_check=[
                HealthCheck.too_slow,
                HealthCheck.data_too_large,
                HealthCheck.filter_too_much,
            ],
        )
        return settings(chosen, database=None) if seeded or derandomize else chosen


PROFILES = {
    "quick": Profile(
        "quick",
        machine_examples=100,
        machine_steps=30,
        recovery_examples=50,
        replay_examples=150,
        case_budget_s=8.0,
    ),
    "full": Profile(
        "full",
        machine_examples=1500,
        machine_steps=50,
        recovery_examples=600,
        replay_examples=2000,
        spark_crashes=10,
        inside_crashes=1000,
        inside_kills=1000,
    ),
}
"""The profiles by name.

On Spark, ``quick`` kills its pipeline once: two Spark drivers start, the one killed and the
one that finishes. A driver's start-up and first micro-batch dominate (about 20 s on an idle
two-core machine: the JVM, then a Python worker per kind of task); the restart's driver starts
and warms up while the first run goes on, so ``quick``'s Spark layer takes about 30 s there.
``full`` kills it at all ten crash points that docs/epoch-protocol.md lists, one after the
other, in one pipeline: eleven drivers."""


SPARK_CHECK = "test_spark_pipeline_killed_at_crash_points_restarts_without_loss"
"""The Spark layer's check; the kit's pytest plugin runs it after the other checks of its class."""


def selected_profile(config: pytest.Config, default: str = "quick") -> Profile:
    """The profile ``--laminar-profile``, else ``$LAMINAR_CONFORMANCE_PROFILE``, else ``default``.

    :raises pytest.UsageError: for an unknown profile name.
    """
    name = config.getoption(PROFILE_OPTION, None) or os.environ.get(PROFILE_VARIABLE) or default
    try:
        return PROFILES[name]
    except KeyError:
        raise pytest.UsageError(
            f"unknown conformance profile {name!r}: use one of {', '.join(PROFILES)}"
        ) from None


def session_seed(config: pytest.Config) -> int | None:
    """The Hypothesis seed of every conformance check in this pytest session.

    ``--hypothesis-seed`` when given; ``None`` in CI (derandomized); otherwise one chosen at
    random once per session, so that a failure can print the seed that replays it.
    """
    if _SEED_KEY not in config.stash:
        given = config.getoption("hypothesis_seed", None)
        if given is not None:
            try:
                seed: int | None = int(given)
            except ValueError:
                raise pytest.UsageError(
                    f"--hypothesis-seed={given}: the conformance kit needs an integer seed"
                ) from None
        elif os.environ.get(CI_VARIABLE):
            seed = None
        else:
            seed = random.randrange(2**32)  # noqa: S311 - a test seed, not a secret
        config.stash[_SEED_KEY] = seed
    return config.stash[_SEED_KEY]


def crash_schedule(text: str, flag: str) -> str:
    """``text``, a crash schedule given on the command line as ``flag``, checked.

    Checked before anything runs, so that a typo does not cost a whole run first.

    :raises ConfigurationError: naming ``flag`` — for a malformed crash point, or when
        ``pyspark`` (which the Spark layer needs) is not installed.
    """
    if importlib.util.find_spec("pyspark") is None:
        raise ConfigurationError(
            f"{flag} sets the Spark layer's crash schedule, and pyspark is not installed: "
            "pip install 'laminar-conformance[spark]'",
            key=flag,
        )
    return ",".join(map(str, CrashPoint.parse_schedule(text, flag)))
