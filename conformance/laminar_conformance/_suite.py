"""What every suite shares: the connector under test, its contexts, seeds and figures."""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, ParamSpec, TypeVar

import pytest
from hypothesis import seed as hypothesis_seed
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test

from laminar_conformance._budget import CaseBudget
from laminar_conformance._faults import collecting_only_what_it_makes
from laminar_conformance._figures import (
    COUNTERS,
    CRASH_POINTS_PROPERTY,
    CUT_SHORT_PROPERTY,
    FIGURE_PREFIX,
    TIMELINE_PROPERTY,
    Figures,
)
from laminar_conformance._profiles import (
    PROFILE_VARIABLE,
    Profile,
    selected_profile,
    session_seed,
)
from laminar_conformance._secrets import secret_values
from laminar_conformance._stores import state_store
from laminar_conformance.contexts import ConformancePlugins, SinkTestContext, SourceTestContext
from laminar_sdk import ConnectorRole, ConnectorSpec, StateStore

P = ParamSpec("P")
F = TypeVar("F", bound=Callable[..., object])


@dataclass(frozen=True, slots=True)
class Target:
    """The connector a suite checks, and how to get fresh contexts and settings for it.

    Suites receive it as the ``conformance`` fixture.

    :param spec: the connector's registration (name, role, declared config keys).
    :param plugins: the plugins, for contexts and the registry.
    :param profile: how much each check explores.
    :param seed: the Hypothesis seed of every check, ``None`` when derandomized.
    :param directory: where the directories of the contexts are made.
    :param extra_plugins: names of the suite's extra plugins, for the replay command.
    :param probed: what probes of the connector found, by probe, kept for the whole suite.
    """

    spec: ConnectorSpec
    plugins: ConformancePlugins
    profile: Profile
    seed: int | None
    directory: Path
    extra_plugins: tuple[str, ...]
    probed: dict[str, object] = field(default_factory=dict, compare=False, repr=False)

    @property
    def connector(self) -> str:
        """The connector's registered name."""
        return self.spec.name

    @property
    def role(self) -> ConnectorRole:
        """Source or sink."""
        return self.spec.role

    def secret_values(self) -> dict[str, str]:
        """The secret values of the test context's configuration, by key (read once).

        See :mod:`~laminar_conformance._secrets`.
        """
        if "secrets" not in self.probed:
            context = (
                self.sink_context() if self.role is ConnectorRole.SINK else self.source_context()
            )
            try:
                self.probed["secrets"] = secret_values(self.spec, context.config().properties)
            finally:
                context.close()
        found = self.probed["secrets"]
        assert isinstance(found, dict)
        return found

    def sink_context(self) -> SinkTestContext:
        """A new sink test context, in a new directory."""
        context = self.plugins.context(self.connector, ConnectorRole.SINK, self._workdir())
        assert isinstance(context, SinkTestContext)
        return context

    def source_context(self) -> SourceTestContext:
        """A new source test context, in a new directory."""
        context = self.plugins.context(self.connector, ConnectorRole.SOURCE, self._workdir())
        assert isinstance(context, SourceTestContext)
        return context

    def new_state_store(self, directory: Path | None = None) -> StateStore:
        """A :class:`StateStore` for one destination or source system, new unless given.

        The Spark bridge gives every sink one (and every source with a laminar checkpoint
        location), shared by the instances of a query: so does the kit.

        :param directory: where it is kept (default: a new directory).
        """
        return state_store(directory or self.new_state_directory(), str(self.role), self.connector)

    def new_state_directory(self) -> Path:
        """A new directory for a state store (one a child process the kit kills opens too)."""
        return Path(tempfile.mkdtemp(prefix="state-", dir=self.directory))

    def new_checkpoint_directory(self) -> Path:
        """A new directory for a checkpoint store: a new query's checkpoint location."""
        return Path(tempfile.mkdtemp(prefix="checkpoints-", dir=self.directory))

    def _workdir(self) -> Path:
        # mkdtemp, not TempPathFactory.mktemp: that lists every sibling to number the new
        # directory, which makes thousands of Hypothesis cases quadratic.
        return Path(tempfile.mkdtemp(prefix=f"{self.connector}-{self.role}-", dir=self.directory))

    def settings(self, examples: int) -> settings:
        """Hypothesis settings for a check of ``examples`` cases in this profile."""
        return self.profile.settings(examples, seeded=self.seed is not None)

    def explore(self, test: Callable[[], None], examples: int, figures: Figures) -> None:
        """Run the Hypothesis test ``test`` for ``examples`` cases, seeded, within the budget.

        The profile's time budget per check may end it sooner (see
        :mod:`laminar_conformance._budget`); ``figures`` then says how many cases ran.
        """
        self._within_budget(self.seeded(self.settings(examples)(test)), examples, figures)

    def explore_machine(
        self, machine: type[RuleBasedStateMachine], examples: int, figures: Figures
    ) -> None:
        """Run the state machine ``machine`` for ``examples`` schedules, as :meth:`explore`."""
        test = get_state_machine_test(self.seeded(machine), settings=self.settings(examples))
        self._within_budget(test, examples, figures)

    def _within_budget(self, test: Callable[[], None], examples: int, figures: Figures) -> None:
        budget = CaseBudget(self.profile.case_budget_s, examples)
        budget.explore(test)
        figures.cut_short = budget.cut_short(self.profile.name)

    def seeded(self, test: F) -> F:
        """``test`` (a Hypothesis test or state machine factory) with this run's seed."""
        return test if self.seed is None else hypothesis_seed(self.seed)(test)

    def replay_command(self) -> str:
        """The ``laminar conformance run`` command that runs these checks again, same seed."""
        parts = ["laminar conformance run", self.connector, "--role", str(self.role)]
        if self.seed is not None:
            parts += ["--seed", str(self.seed)]
        if self.profile.name != "quick":
            parts += ["--profile", self.profile.name]
        for plugin in self.extra_plugins:
            parts += ["--plugin", plugin]
        return " ".join(parts)

    def reproduction(self, check: str) -> str:
        """What to run to see a failure of ``check`` again."""
        if self.seed is None:
            how = "derandomized (CI): the same command runs the same cases again"
            pytest_seed = ""
        else:
            how = f"seed {self.seed}"
            pytest_seed = f" --hypothesis-seed={self.seed}"
        return (
            f"conformance check {check} of {self.role} {self.connector!r} failed ({how}).\n"
            "Any falsifying example above is the minimal schedule of calls that fails.\n"
            f"Replay: {self.replay_command()} --check {check}\n"
            f"    or: {PROFILE_VARIABLE}={self.profile.name} pytest -k {check}{pytest_seed}"
        )


def check(test: Callable[P, None]) -> Callable[P, None]:
    """Mark a suite method as a conformance check: a failure says how to replay it."""

    @functools.wraps(test)
    def run_check(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            with collecting_only_what_it_makes():
                test(*args, **kwargs)
        except Exception as error:
            target = kwargs.get("conformance")
            if isinstance(target, Target):
                error.add_note(target.reproduction(test.__name__))
            raise

    return run_check


class ConnectorSuite:
    """Base of the sink and source suites: set :attr:`connector` in the adopting class."""

    connector: ClassVar[str]
    """The registered name of the connector to check (required)."""

    plugins: ClassVar[Sequence[object]] = ()
    """Pluggy plugins to use as if installed, e.g. a plugin module not packaged yet."""

    role: ClassVar[ConnectorRole]
    """Sink or source: set by the sink and source suites."""

    @pytest.fixture(scope="class")
    @classmethod
    def conformance(
        cls, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> Target:
        """The connector under test (see :class:`Target`)."""
        name = getattr(cls, "connector", None)
        if not isinstance(name, str):
            raise pytest.UsageError(
                f'{cls.__name__}: set `connector = "NAME"` to the registered name of the '
                "connector the suite checks"
            )
        plugins = ConformancePlugins.load(cls.plugins)
        return Target(
            spec=plugins.registry.get(name, cls.role),
            plugins=plugins,
            profile=selected_profile(request.config),
            seed=session_seed(request.config),
            directory=tmp_path_factory.mktemp(f"{name}-{cls.role}"),
            extra_plugins=tuple(getattr(p, "__name__", repr(p)) for p in cls.plugins),
        )

    @pytest.fixture
    def figures(self, request: pytest.FixtureRequest) -> Iterator[Figures]:
        """Counters a check fills in; reported as ``laminar.*`` user properties."""
        figures = Figures()
        yield figures
        for name in COUNTERS:
            request.node.user_properties.append((FIGURE_PREFIX + name, getattr(figures, name)))
        if figures.timeline:
            request.node.user_properties.append((TIMELINE_PROPERTY, figures.timeline))
        if figures.crash_points:
            request.node.user_properties.append((CRASH_POINTS_PROPERTY, figures.crash_points))
        if figures.cut_short:
            request.node.user_properties.append((CUT_SHORT_PROPERTY, figures.cut_short))
