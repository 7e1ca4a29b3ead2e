"""The distributions move in step: one version, pinned between them, with a changelog entry.

And the versions of PySpark and pyarrow the SDK claims to support are the ones a tox
environment tests, and the ones the docs state.
"""

from __future__ import annotations

import configparser
import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
NOT_SOURCES = {"build", "dist", "__pycache__"}


def wheelhouse_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "build_wheelhouse", ROOT / "tools" / "build_wheelhouse.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DISTRIBUTIONS: dict[str, str] = wheelhouse_script().DISTRIBUTIONS


def project(directory: str) -> dict:
    return tomllib.loads((ROOT / directory / "pyproject.toml").read_text())["project"]


def requirements(metadata: dict) -> list[Requirement]:
    listed = [*metadata.get("dependencies", [])]
    for extra in metadata.get("optional-dependencies", {}).values():
        listed += extra
    return [Requirement(text) for text in listed]


def sdk_version() -> str:
    return project(DISTRIBUTIONS["laminar-sdk"])["version"]


def floor(requirement: str, name: str) -> Version:
    """The lowest version ``requirement`` (``name>=X``) allows."""
    parsed = Requirement(requirement)
    assert parsed.name == name
    (lowest,) = [spec.version for spec in parsed.specifier if spec.operator == ">="]
    return Version(lowest)


def test_every_distribution_in_the_repository_is_built_into_the_wheelhouse():
    found = {}
    for directory, subdirectories, files in os.walk(ROOT):
        # Hidden directories (.venv, .tox, .git) and build outputs hold no distribution of ours.
        subdirectories[:] = [
            name for name in subdirectories if not name.startswith(".") and name not in NOT_SOURCES
        ]
        if "pyproject.toml" in files:
            pyproject = Path(directory) / "pyproject.toml"
            name = tomllib.loads(pyproject.read_text())["project"]["name"]
            found[pyproject.parent.relative_to(ROOT).as_posix()] = name
    assert {directory: name for name, directory in DISTRIBUTIONS.items()} == found, (
        "add the distribution to DISTRIBUTIONS in tools/build_wheelhouse.py (one line)"
    )


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_every_distribution_has_the_sdk_s_version(name):
    metadata = project(DISTRIBUTIONS[name])
    assert metadata["name"] == name
    assert metadata["version"] == sdk_version(), (
        f"{name} is at {metadata['version']}, laminar-sdk at {sdk_version()}: "
        "release every distribution with one version"
    )


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_dependencies_between_distributions_pin_that_version(name):
    version = sdk_version()
    ours = [r for r in requirements(project(DISTRIBUTIONS[name])) if r.name in DISTRIBUTIONS]
    if name != "laminar-sdk":
        assert any(r.name == "laminar-sdk" for r in ours), f"{name} does not require laminar-sdk"
    for requirement in ours:
        assert str(requirement.specifier) == f"=={version}", (
            f"{name} requires {requirement}: pin the first-party distributions it needs to "
            f"=={version}, the version they are released and tested with"
        )


def test_the_changelog_s_latest_entry_is_this_version():
    headings = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert headings, "CHANGELOG.md has no version entry (## [X.Y.Z] - date)"
    assert headings[0] == sdk_version(), (
        f"CHANGELOG.md's latest entry is {headings[0]}; add one for {sdk_version()}"
    )


def lowest_tested() -> dict[str, Version]:
    """The versions ``tox -e spark-lowest`` pins: name -> version."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    pins = [
        Requirement(line.removeprefix("lowest:").strip())
        for line in tox["testenv:spark-{lowest,highest}"]["deps"].splitlines()
        if line.startswith("lowest:")
    ]
    return {pin.name: Version(next(iter(pin.specifier)).version) for pin in pins}


def claimed_floors() -> dict[str, Version]:
    """The lowest PySpark and pyarrow laminar-sdk's requirements allow."""
    sdk = project(DISTRIBUTIONS["laminar-sdk"])
    (pyarrow,) = [r for r in sdk["dependencies"] if r.startswith("pyarrow")]
    (pyspark,) = sdk["optional-dependencies"]["spark"]
    return {"pyspark": floor(pyspark, "pyspark"), "pyarrow": floor(pyarrow, "pyarrow")}


def test_the_lowest_tox_environment_tests_the_floors_laminar_sdk_claims():
    assert lowest_tested() == claimed_floors(), (
        "tox -e spark-lowest must pin exactly the lowest pyspark and pyarrow laminar-sdk allows"
    )


def test_the_docs_state_the_tested_floors():
    install = (ROOT / "docs" / "install.md").read_text()
    for name, version in claimed_floors().items():
        row = next((line for line in install.splitlines() if line.startswith(f"| {name} ")), None)
        assert row is not None, f"docs/install.md's compatibility table has no row for {name}"
        lowest = row.split("|")[2].strip()
        assert Version(lowest) == version, (
            f"docs/install.md gives {name} {lowest}, pyproject {version}"
        )


@pytest.mark.full
def test_the_wheelhouse_command_builds_every_distribution_and_twine_accepts_them(tmp_path):
    for tool in ("build", "twine"):
        if importlib.util.find_spec(tool) is None:
            pytest.skip(f"{tool} is not installed here (tox -e full installs it)")
    wheelhouse = tmp_path / "wheelhouse"
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "build_wheelhouse.py"), "--outdir", str(wheelhouse)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    files = {path.name for path in wheelhouse.iterdir()}
    version = sdk_version()
    for name in DISTRIBUTIONS:
        stem = f"{name.replace('-', '_')}-{version}"
        assert {f"{stem}-py3-none-any.whl", f"{stem}.tar.gz"} <= files, sorted(files)
    assert f"twine check --strict: {2 * len(DISTRIBUTIONS)} files passed" in done.stdout
