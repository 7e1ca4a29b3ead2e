"""Fixtures shared by the SDK's own tests."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
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


# The test files that take longest (pytest --durations in CI), longest first. pytest-xdist's
# `--dist loadfile` hands files to its workers in collection order, so these go first: a long
# file started last would leave one worker running it alone at the end.
LONGEST_FIRST = (
    "tests/conformance/test_broken_variants.py",
    "plugins/kafka/tests/test_kafka_conformance.py",
    "tests/spark/test_laminar_run.py",
    "tests/conformance/test_conformance_cli.py",
    "tests/conformance/test_spark_layer.py",
    "tests/spark/test_spark_bridge.py",
    "plugins/postgres/tests/test_postgres_conformance.py",
    "plugins/files/tests/test_files_conformance.py",
    "plugins/files/tests/test_files_crash.py",
    "tests/conformance/test_reference_conformance.py",
    "plugins/files/tests/test_files_source.py",
    "plugins/postgres/tests/test_postgres_broken_variants.py",
    "tests/checkpoint/test_checkpoint_object_store.py",
    "tests/services/test_kafka_service.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files of :data:`LONGEST_FIRST` first, in that order; each file's tests keep theirs."""
    rank = {config.rootpath / path: place for place, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path, len(rank)))  # stable


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
