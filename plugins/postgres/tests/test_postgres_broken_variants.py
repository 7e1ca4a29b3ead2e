"""The conformance kit's quick profile catches deliberately broken PostgreSQL connectors.

Each variant in ``postgres_broken.py`` has one bug the issue names; a test module adopting the
kit's suite for it runs in a child pytest, limited to the check that must catch the bug (the
whole quick profile of a connector takes minutes), with a fixed seed: it must fail there. The
correct connectors pass the same checks in ``test_postgres_conformance.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

HERE = Path(__file__).parent

MODULE = """\
import postgres_broken
from laminar_conformance.{module} import {suite}


class TestBroken({suite}):
    connector = {connector!r}
    plugins = (postgres_broken,)
"""

# Variant, role, the check that must catch it, and what its failure says.
VARIANTS = {
    "marker-row-in-a-separate-transaction": (
        "broken-postgres-marker-apart",
        "sink",
        "test_delivery_survives_a_crash_at_each_point_inside_a_call",
        "duplicated ids",
    ),
    "commit-prepared-not-idempotent-after-a-restart": (
        "broken-postgres-commit-prepared-blindly",
        "sink",
        "test_commit_aggregated_again_after_a_restart_adds_nothing",
        "does not exist",
    ),
    "cdc-slot-advanced-at-read-time": (
        "broken-postgres-slot-advanced-at-read",
        "source",
        "test_restoring_any_checkpoint_returns_exactly_the_records_after_it",
        "cannot be read again",
    ),
}


def run_check(directory: Path, connector: str, role: str, check: str) -> str:
    """Run ``check`` of the kit's suite for ``connector`` in a child pytest; its output."""
    module, suite = ("sink", "SinkSuite") if role == "sink" else ("source", "SourceSuite")
    directory.mkdir()
    test_file = directory / "test_broken.py"
    test_file.write_text(MODULE.format(module=module, suite=suite, connector=connector))
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path]),
        "LAMINAR_CONFORMANCE_PROFILE": "quick",
    }
    command = [sys.executable, "-m", "pytest", str(test_file), "-k", check, "-q", "-x"]
    command += ["-p", "no:cacheprovider", "--hypothesis-seed=1"]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=environment,
        cwd=directory,
        check=False,
        timeout=600,
    )
    return f"exit {result.returncode}\n{result.stdout}{result.stderr}"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Every variant's run, at once (each is one process)."""
    directory = tmp_path_factory.mktemp("broken")
    with ThreadPoolExecutor(max_workers=len(VARIANTS)) as pool:
        started = {
            name: pool.submit(run_check, directory / name, connector, role, check)
            for name, (connector, role, check, _) in VARIANTS.items()
        }
        return {name: future.result() for name, future in started.items()}


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_quick_profile_catches_the_broken_variant(outputs, variant):
    _, _, check, symptom = VARIANTS[variant]
    output = outputs[variant]
    assert output.startswith("exit 1\n"), output[-4000:]
    assert f"FAILED test_broken.py::TestBroken::{check}" in output, output[-4000:]
    assert symptom in output, output[-4000:]
