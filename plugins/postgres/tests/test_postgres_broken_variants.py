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

VARIANTS = [
    pytest.param(
        "broken-postgres-marker-apart",
        "sink",
        "test_delivery_survives_a_crash_at_each_point_inside_a_call",
        "duplicated ids",
        id="marker-row-in-a-separate-transaction",
    ),
    pytest.param(
        "broken-postgres-commit-prepared-blindly",
        "sink",
        "test_commit_aggregated_again_after_a_restart_adds_nothing",
        "does not exist",
        id="commit-prepared-not-idempotent-after-a-restart",
    ),
    pytest.param(
        "broken-postgres-slot-advanced-at-read",
        "source",
        "test_restoring_any_checkpoint_returns_exactly_the_records_after_it",
        "cannot be read again",
        id="cdc-slot-advanced-at-read-time",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("connector", "role", "check", "symptom"), VARIANTS)
def test_the_quick_profile_catches_the_broken_variant(tmp_path, connector, role, check, symptom):
    module, suite = ("sink", "SinkSuite") if role == "sink" else ("source", "SourceSuite")
    test_file = tmp_path / "test_broken.py"
    test_file.write_text(MODULE.format(module=module, suite=suite, connector=connector))
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path]),
        "LAMINAR_CONFORMANCE_PROFILE": "quick",
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(test_file),
            "-k",
            check,
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            "--hypothesis-seed=1",
            "-W",
            "ignore::DeprecationWarning",
        ],
        capture_output=True,
        text=True,
        env=environment,
        cwd=tmp_path,
        check=False,
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-4000:]
    assert f"FAILED test_broken.py::TestBroken::{check}" in output, output[-4000:]
    assert symptom in output, output[-4000:]
