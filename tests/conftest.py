"""Fixtures shared by the SDK's own tests."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
import sys
import textwrap
from collections.abc import Callable, Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from laminar_conformance.services import S3Endpoint, moto_s3_server

from laminar_sdk import PLUGIN_ENTRY_POINT_GROUP

# `dev` explores; `ci` is derandomized so a CI failure reproduces on any machine. Neither
# times examples: these tests check outcomes, and on a loaded machine an example can take over
# Hypothesis's 200 ms deadline, failing the test (as "flaky" when its re-run is quick).
settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile(
    "ci",
    derandomize=True,
    print_blob=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))

T = TypeVar("T")

Run = Callable[[Coroutine[Any, Any, T]], T]


DURATIONS_FILE = Path(__file__).with_name("durations.json")
"""Each test file's time in seconds, as a whole run recorded it (``--record-durations``)."""

RECORD_DURATIONS = "--record-durations"


def recorded_durations() -> dict[str, float]:
    """:data:`DURATIONS_FILE`: test file (relative to the repository) to seconds."""
    if not DURATIONS_FILE.exists():
        return {}
    recorded: dict[str, float] = json.loads(DURATIONS_FILE.read_text(encoding="utf-8"))
    return recorded


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--record-durations``: write each test file's time to :data:`DURATIONS_FILE`."""
    parser.addoption(
        RECORD_DURATIONS,
        action="store_true",
        help=f"write each test file's total time to {DURATIONS_FILE.name} when the run ends "
        "(run the whole suite: the order of the next runs comes from it)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The test files that took longest when recorded first; each file's tests keep their order.

    pytest-xdist's ``--dist loadfile`` hands files to its workers in collection order: a long
    file started last would leave one worker running it alone at the end.
    """
    recorded = recorded_durations()
    root = config.rootpath

    def took(item: pytest.Item) -> float:
        return recorded.get(item.path.relative_to(root).as_posix(), 0.0)

    items.sort(key=lambda item: -took(item))  # stable


class _FileTimes:
    """A pytest plugin: each test file's total time, written to :data:`DURATIONS_FILE`."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Add each phase's time to its file's (xdist's workers' reports arrive here too)."""
        path = report.nodeid.split("::")[0]
        self.times[path] = self.times.get(path, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        """Write the times, longest first."""
        ordered = sorted(self.times.items(), key=lambda item: -item[1])
        recorded = {path: round(seconds, 1) for path, seconds in ordered}
        DURATIONS_FILE.write_text(json.dumps(recorded, indent=1) + "\n", encoding="utf-8")


def pytest_configure(config: pytest.Config) -> None:
    """Record each file's time when ``--record-durations`` asks (in the main process)."""
    if config.getoption(RECORD_DURATIONS) and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_FileTimes(), "laminar-file-times")


SelectedParams = Callable[..., set[Any]]


@pytest.fixture(scope="module")
def selected_params(request: pytest.FixtureRequest) -> SelectedParams:
    """``selected_params(name)``: the values of parameter ``name`` in the module's selected tests.

    With several names, ``selected_params(a, b)``, the tuples of their values that the selected
    tests were given together. A module fixture that starts one child per value prepares only
    what the run selected: ``-m "not full"`` (CI) leaves out the values marked ``full``.
    """

    def values(*names: str) -> set[Any]:
        selected = set()
        for item in request.session.items:
            callspec = getattr(item, "callspec", None)  # None: a test without parameters
            if item.path != request.path or callspec is None:
                continue
            if all(name in callspec.params for name in names):
                given = tuple(callspec.params[name] for name in names)
                selected.add(given if len(names) > 1 else given[0])
        return selected

    return values


@pytest.fixture
def run() -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """Run a coroutine to completion: ``run(connector.open(config))``."""
    return asyncio.run


InstallDistribution = Callable[..., Path]


@pytest.fixture
def install_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[InstallDistribution]:
    """Install a tiny distribution the way pip would lay it out on ``sys.path``.

    ``install_distribution("laminar-plugin-x", modules={"x_plugin": "..."},
    plugins={"x": "x_plugin"})`` writes ``x_plugin.py`` and a ``.dist-info`` directory with the
    entry points (of ``group``, by default ``laminar_sdk.plugins``), then puts the directory on
    ``sys.path``:
    ``importlib.metadata`` finds it exactly as it finds a pip-installed plugin.
    """
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    written: list[str] = []

    def install(
        name: str,
        *,
        modules: Mapping[str, str],
        plugins: Mapping[str, str],
        group: str = PLUGIN_ENTRY_POINT_GROUP,
        version: str = "1.0.0",
    ) -> Path:
        for module, source in modules.items():
            (site / f"{module}.py").write_text(textwrap.dedent(source))
            written.append(module)
        dist_info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )
        lines = [f"{plugin} = {target}" for plugin, target in plugins.items()]
        (dist_info / "entry_points.txt").write_text(f"[{group}]\n" + "\n".join(lines) + "\n")
        importlib.invalidate_caches()
        return site

    yield install
    for module in written:
        sys.modules.pop(module, None)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[S3Endpoint]:
    """moto's S3 server on loopback, with one bucket; stopped at the end, pass or fail."""
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("obstore") is None:
        pytest.skip("needs moto and obstore: pip install 'laminar-conformance[s3]'")
    with moto_s3_server() as endpoint:
        yield endpoint
