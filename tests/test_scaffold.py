"""``laminar new-plugin``: the project it generates installs, passes the conformance kit, lints."""

from __future__ import annotations

import configparser
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from xml.etree import ElementTree

import pytest

from laminar_sdk._cli.main import main
from laminar_sdk._scaffold import PluginNames
from laminar_sdk._spark.class_archive import ARCHIVE_VARIABLE

NAME = "acme"
PACKAGE = "laminar_plugin_acme"
PROJECT_FILES = {
    ".github/workflows/ci.yml",
    ".gitignore",
    "README.md",
    "pyproject.toml",
    "tox.ini",
    f"{PACKAGE}/__init__.py",
    f"{PACKAGE}/testing.py",
    f"{PACKAGE}/_records.py",
    f"{PACKAGE}/_sink.py",
    f"{PACKAGE}/_source.py",
    f"{PACKAGE}/py.typed",
    "tests/test_records.py",
    "wheelhouse/README.md",
}
LONGEST_NAME = "long-" + "n" * 27
ROOT = Path(__file__).resolve().parent.parent
STAGING_RENAME = "            staged.rename(committed)\n"
SEED = "7"


def files_in(directory: Path) -> set[str]:
    return {
        path.relative_to(directory).as_posix() for path in directory.rglob("*") if path.is_file()
    }


def new_plugin(*arguments: str) -> int:
    return main(["new-plugin", *arguments])


# The command, and the files it writes ----------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["", "Acme", "acme db", "1acme", "-acme", "acme-", "acme--db", "acme.db", "ácme", "a" * 33],
)
def test_an_invalid_name_is_refused_saying_what_a_name_may_be(tmp_path, capsys, name):
    target = tmp_path / "project"
    assert new_plugin("--directory", str(target), "--", name) == 2
    err = capsys.readouterr().err
    assert f"laminar: error: {name!r} cannot name a plugin: use lowercase letters and digits" in err
    assert "at most 32 characters" in err
    assert not target.exists()


def test_a_name_with_the_distribution_prefix_is_refused_with_the_name_to_give(tmp_path, capsys):
    assert new_plugin("laminar-plugin-acme", "--directory", str(tmp_path / "p")) == 2
    assert "without the 'laminar-plugin-' prefix: `laminar new-plugin acme`" in (
        capsys.readouterr().err
    )


def test_a_name_an_installed_plugin_registers_is_refused(tmp_path, capsys):
    # `memory` is the SDK's reference connector: a plugin of the same name could not be
    # installed next to it.
    assert new_plugin("memory", "--directory", str(tmp_path / "p")) == 2
    err = capsys.readouterr().err
    assert "a connector named 'memory' is already installed (from laminar-sdk)" in err
    assert not (tmp_path / "p").exists()


ACME_PLUGIN = """
import pyarrow as pa
from laminar_sdk import SinkConnector, WriteResult, hookimpl


class Sink(SinkConnector):
    async def open(self, config):
        pass

    async def write_batch(self, batch):
        return WriteResult(batch.num_rows)

    def schema(self):
        return pa.schema([("id", pa.int64())])

    async def close(self):
        pass


@hookimpl
def laminar_register_connectors(registry):
    registry.add_sink("acme", Sink)
"""


def test_a_name_another_installed_distribution_registers_is_refused(
    install_distribution, tmp_path, capsys
):
    install_distribution(
        "laminar-plugin-elsewhere", modules={"elsewhere": ACME_PLUGIN}, plugins={"x": "elsewhere"}
    )
    assert new_plugin(NAME, "--directory", str(tmp_path / "p")) == 2
    err = capsys.readouterr().err
    assert "a connector named 'acme' is already installed (from laminar-plugin-elsewhere)" in err


def test_the_project_s_own_installed_plugin_does_not_block_regenerating_it(
    install_distribution, tmp_path
):
    install_distribution(
        "laminar-plugin-acme",
        modules={"acme_installed": ACME_PLUGIN},
        plugins={NAME: "acme_installed"},
    )
    target = tmp_path / "p"
    assert new_plugin(NAME, "--directory", str(target)) == 0
    assert new_plugin(NAME, "--directory", str(target), "--force") == 0
    assert files_in(target) == PROJECT_FILES


def test_the_names_derive_from_the_plugin_name():
    names = PluginNames.parse("acme_db-2")
    assert names == PluginNames(
        name="acme_db-2",
        distribution="laminar-plugin-acme-db-2",
        package="laminar_plugin_acme_db_2",
        title="AcmeDb2",
    )


def test_a_project_is_created_with_its_entry_point_tox_ci_and_next_steps(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    assert new_plugin(NAME) == 0
    project = tmp_path / "laminar-plugin-acme"
    assert files_in(project) == PROJECT_FILES
    out = capsys.readouterr().out
    assert out.startswith(
        "laminar: created plugin 'acme' (laminar-plugin-acme, package laminar_plugin_acme) in "
        "laminar-plugin-acme\n"
    )
    for path in PROJECT_FILES:
        assert f"  created   {path}\n" in out
    steps = out.split("next steps:\n")[1]
    assert steps.startswith("  cd laminar-plugin-acme\n  git init\n")
    for command in (
        "python -m pip install -e .",
        "laminar plugins list",
        "laminar conformance run acme --strict",
        "tox",
    ):
        assert f"\n  {command} " in steps

    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == "laminar-plugin-acme"
    assert pyproject["project"]["entry-points"] == {"laminar_sdk.plugins": {NAME: PACKAGE}}
    assert pyproject["tool"]["mypy"]["strict"] is True

    tox = configparser.ConfigParser(interpolation=None)
    tox.read(project / "tox.ini")
    assert tox["tox"]["env_list"] == "conformance, conformance-lowest, lint, type"
    lowest = tox["testenv:conformance-lowest"]
    assert lowest["deps"].split() == [
        "{[testenv:conformance]deps}",
        "pyspark==4.2",
        "pyarrow==18",
    ], "the floors of laminar-sdk's own requirements (pyproject.toml)"
    # The kit with its Spark layer, found in a wheelhouse until it is on PyPI.
    assert tox["testenv:conformance"]["deps"].split() == ["laminar-conformance[spark]"]
    assert (
        "--find-links {env:LAMINAR_WHEELHOUSE:{toxinidir}{/}wheelhouse}"
        in (tox["testenv"]["install_command"])
    )
    # The plugin's own tests, then each of the kit's checks once, strictly.
    commands = [c for c in tox["testenv:conformance"]["commands"].split("\n") if c]
    assert commands[0] == "pytest"
    assert " ".join(commands[1:]).replace("\\ ", "").split() == [
        "laminar", "conformance", "run", "acme", "--strict", "--profile", "quick",
        "--report", "{toxinidir}{/}conformance.md",
        "--junitxml", "{toxinidir}{/}conformance.xml", "{posargs}",
    ]  # fmt: skip
    assert not (project / "tests/test_conformance.py").exists(), "the kit would run twice"
    assert tox["testenv:lint"]["commands"].split("\n")[1:] == [
        "ruff check .",
        "ruff format --check .",
    ]
    assert tox["testenv:type"]["commands"].strip() == "mypy"

    workflow = (project / ".github/workflows/ci.yml").read_text()
    steps_in_order = [
        "actions/checkout@",
        "actions/setup-python@",
        'python-version: "3.11"',
        "actions/setup-java@",
        'java-version: "17"',
        "run: python -m pip install tox",
        "run: tox",
        "LAMINAR_WHEELHOUSE: ${{ vars.LAMINAR_WHEELHOUSE || format('{0}/wheelhouse', "
        "github.workspace) }}",
        "actions/upload-artifact@",
        "path: conformance*.*",
    ]
    positions = [workflow.index(step) for step in steps_in_order]
    assert positions == sorted(positions)


def test_an_empty_directory_is_used(tmp_path):
    target = tmp_path / "empty"
    target.mkdir()
    assert new_plugin(NAME, "--directory", str(target)) == 0
    assert files_in(target) == PROJECT_FILES


def test_a_non_empty_directory_is_refused_without_force(tmp_path, capsys):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    assert new_plugin(NAME, "--directory", str(target)) == 2
    err = capsys.readouterr().err
    assert f"{target} exists and is not empty" in err
    assert "--force" in err
    assert files_in(target) == {"notes.txt"}


def test_force_replaces_the_generated_files_and_keeps_the_others(tmp_path, capsys):
    target = tmp_path / "mine"
    assert new_plugin(NAME, "--directory", str(target)) == 0
    generated = (target / "README.md").read_text()
    (target / "README.md").write_text("edited")
    (target / "notes.txt").write_text("keep me")
    capsys.readouterr()
    assert new_plugin(NAME, "--directory", str(target), "--force") == 0
    out = capsys.readouterr().out
    assert "  replaced  README.md\n" in out
    assert "  created " not in out
    assert (target / "README.md").read_text() == generated
    assert (target / "notes.txt").read_text() == "keep me"
    assert files_in(target) == PROJECT_FILES | {"notes.txt"}


def test_a_file_in_place_of_the_directory_is_refused(tmp_path, capsys):
    target = tmp_path / "taken"
    target.write_text("a file")
    assert new_plugin(NAME, "--directory", str(target), "--force") == 2
    assert f"{target} is a file, not a directory" in capsys.readouterr().err
    assert target.read_text() == "a file"


# The generated code: lint and types ----------------------------------------------------------


def generated(tmp_path: Path, name: str) -> Path:
    project = tmp_path / name
    assert new_plugin(name, "--directory", str(project)) == 0
    return project


def tool(
    module: str, *arguments: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec(module) is None:
        pytest.skip(
            f"{module} is not installed in this environment (tox's `tests` env installs it), so "
            "this check of the generated project cannot run here"
        )
    return subprocess.run(
        [sys.executable, "-m", module, *arguments],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", [NAME, LONGEST_NAME])
def test_the_generated_code_is_ruff_clean_with_its_own_config(tmp_path, name):
    project = generated(tmp_path, name)
    lint = tool("ruff", "check", "--no-cache", ".", cwd=project)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    layout = tool("ruff", "format", "--no-cache", "--check", ".", cwd=project)
    assert layout.returncode == 0, layout.stdout + layout.stderr


# The generated plugin, installed with pip ------------------------------------------------------


def pip_install(project: Path, target: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--target", str(target), str(project)],
        check=True,
    )  # fmt: skip


def environment(site: Path) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def laminar(site: Path, *arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "laminar_sdk", *arguments],
        env=environment(site),
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """The generated ``acme`` project, and the directory pip installed it into."""
    root = tmp_path_factory.mktemp("scaffold")
    project = generated(root, NAME)
    site = root / "site"
    pip_install(project, site)
    return project, site


@pytest.mark.slow
def test_the_installed_plugin_is_listed_with_its_distribution(installed, tmp_path):
    _, site = installed
    listing = laminar(site, "plugins", "list", cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    rows = [line.split() for line in listing.stdout.splitlines() if line.startswith(f"{NAME} ")]
    assert rows == [
        [NAME, "sink", "laminar-plugin-acme", "0.1.0", "exactly_once,two_phase_commit"],
        [NAME, "source", "laminar-plugin-acme", "0.1.0", "replay"],
    ]


@pytest.mark.slow
def test_the_installed_plugin_does_not_import_the_conformance_kit(installed, tmp_path):
    _, site = installed
    script = (
        "import sys\n"
        "from laminar_sdk import load_connector_registry\n"
        "registry = load_connector_registry()\n"
        f"assert registry.create_sink({NAME!r}).capabilities().exactly_once\n"
        "print(sorted(name for name in sys.modules if name.startswith('laminar_')))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        env=environment(site),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert PACKAGE in run.stdout, "the plugin was not loaded through its entry point"
    assert "laminar_conformance" not in run.stdout


@pytest.mark.slow
def test_the_kit_fails_the_generated_sink_without_its_staging_rename(installed, tmp_path):
    _, site = installed
    broken = tmp_path / "site"
    shutil.copytree(site, broken)
    sink = broken / PACKAGE / "_sink.py"
    source = sink.read_text()
    assert source.count(STAGING_RENAME) == 1, "the sink's commit is no longer one staging rename"
    sink.write_text(source.replace(STAGING_RENAME, ""))
    run = laminar(
        broken, "conformance", "run", NAME, "--role", "sink", "--no-spark", "--seed", SEED,
        "--check", "test_delivery_survives_a_fault_at_each_point", "--reruns", "0",
        cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout[-4000:] + run.stderr
    assert "not delivered exactly once: lost ids" in run.stderr, run.stderr[-4000:]
    assert "check(s) failed" in run.stderr


# The generated project's own tox, as its CI runs it, against this checkout's wheels ------------

SPARK_CHECK = "test_spark_pipeline_killed_at_crash_points_restarts_without_loss"
# What a clean shell hands on: no virtual environment, no PYTHONPATH, no pip or laminar settings.
# HOME keeps pip's cache, from which pyspark and the other third-party wheels come.
KEPT_VARIABLES = ("PATH", "HOME", "LANG", "TMPDIR", "JAVA_HOME")


@pytest.fixture(scope="session")
def laminar_wheelhouse(tmp_path_factory) -> Path:
    """The wheels of laminar-sdk and laminar-conformance, built from this checkout once.

    Only the two a plugin project needs; `python3 -m tox -e wheelhouse` builds every
    distribution, with its sdist, as tests/test_distributions.py checks.
    """
    wheelhouse = tmp_path_factory.mktemp("wheelhouse")
    for directory in (ROOT, ROOT / "conformance"):
        built = tool("build", "--wheel", "--outdir", str(wheelhouse), str(directory), cwd=ROOT)
        assert built.returncode == 0, built.stdout[-4000:] + built.stderr
    return wheelhouse


def not_installed_as_built(site_packages: Path, wheel: Path) -> set[str]:
    """The files of ``wheel`` (``path,hash,size``) that are not installed as the wheel holds them.

    pip's RECORD of an installed distribution lists every file of the wheel it installed, with
    the same hash, plus files pip adds (INSTALLER, REQUESTED).
    """
    distribution, version = wheel.name.split("-")[:2]
    record = f"{distribution}-{version}.dist-info/RECORD"
    with zipfile.ZipFile(wheel) as archive:
        built = {line for line in archive.read(record).decode().splitlines() if ",sha256=" in line}
    return built - set((site_packages / record).read_text().splitlines())


# Builds both wheels and a tox environment with PySpark, then runs the plugin's tests, the kit with
# its Spark layer, ruff and mypy: about six minutes of CI's twelve, so `tox -e full` runs it. CI
# still runs the generated plugin through the kit (the staging-rename test above).
@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.full
def test_the_generated_tox_runs_the_spark_layer_with_the_sdk_from_a_wheelhouse(
    laminar_wheelhouse, tmp_path
):
    project = generated(tmp_path, NAME)
    clean = {name: os.environ[name] for name in KEPT_VARIABLES if name in os.environ}
    # The sink's role only: both roles' Spark layers would double the time for the same proof
    # (the kit's source-side Spark layer: tests/conformance/test_spark_layer.py). No class
    # archive: it would be trained for this throw-away environment's Spark, and removed with it
    # (the archive's own tests: tests/spark/test_class_archive.py).
    environment = {**clean, "LAMINAR_WHEELHOUSE": str(laminar_wheelhouse)}
    run = tool(
        "tox", "--", "--seed", SEED, "--role", "sink",
        cwd=project, env={**environment, ARCHIVE_VARIABLE: "off"},
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    for environment in ("conformance", "conformance-lowest", "lint", "type"):
        assert re.search(rf"^  {environment}: OK \(", out, re.MULTILINE), out[-6000:]

    # The laminar distributions came from the wheelhouse: pip installed exactly those wheels.
    (site_packages,) = (project / ".tox/conformance/lib").glob("python3*/site-packages")
    wheels = sorted(laminar_wheelhouse.glob("*.whl"))
    assert [wheel.name.split("-")[0] for wheel in wheels] == ["laminar_conformance", "laminar_sdk"]
    for wheel in wheels:
        assert not_installed_as_built(site_packages, wheel) == set(), f"not {wheel.name}"

    # The plugin's own tests ran, then the kit, strictly, with its Spark layer: the JUnit file
    # has the Spark check passed, the report says the driver was killed.
    assert re.search(r"^=+ 3 passed in ", out, re.MULTILINE), out[-6000:]
    assert "laminar conformance: sink 'acme' from laminar-plugin-acme 0.1.0;" in out
    (suite,) = ElementTree.parse(project / "conformance.xml").getroot().iter("testsuite")
    assert (suite.get("failures"), suite.get("errors")) == ("0", "0")
    (spark,) = [case for case in suite.iter("testcase") if case.get("name") == SPARK_CHECK]
    outcome = [child.tag for child in spark if child.tag in {"skipped", "failure", "error"}]
    assert outcome == [], f"the Spark layer did not pass: {outcome}"
    report = (project / "conformance.md").read_text()
    assert "- **Result: PASSED**" in report
    assert f"--role sink --seed {SEED} --strict`" in report
    assert re.search(
        r"^- Spark layer: passed — 1 pipeline\(s\), 1 crash\(es\) injected \(SIGKILL",
        report,
        re.MULTILINE,
    ), report

    # ruff and mypy ran on the generated code.
    assert "All checks passed!" in out
    assert "Success: no issues found in 6 source files" in out
