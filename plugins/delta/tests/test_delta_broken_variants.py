"""The conformance kit catches deliberately broken Delta Lake sinks, in a run of one check.

Each variant in ``delta_broken.py`` has one bug an author could write: trusting delta-rs to
skip an epoch the table holds, or recording the epoch in a commit of its own after the data.
Neither marks a crash point: the kit finds where they touch the table by itself. Each runs
through ``laminar conformance run`` in a child process, with a fixed seed, limited to the check
that must catch it; the correct sink passes the same checks in ``test_delta_conformance.py``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from delta_kit import run_kit

# Variant, the check that must catch it, and what its failure says.
VARIANTS = {
    "broken-delta-epoch-not-checked": (
        "test_commit_aggregated_again_after_a_restart_adds_nothing",
        "each committed again after a restart: a reader sees [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4]",
    ),
    "broken-delta-version-recorded-apart": (
        "test_delivery_survives_a_crash_at_each_point_inside_a_call",
        "not delivered exactly once: duplicated ids",
    ),
}


def run_check(directory: Path, connector: str, check: str) -> str:
    """Run the kit's ``check`` on ``connector`` (a sink of delta_broken); its exit and output."""
    directory.mkdir()
    return run_kit(directory, connector, "--plugin", "delta_broken", "--check", check)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Every variant's run, at once (each is one process)."""
    directory = tmp_path_factory.mktemp("broken")
    with ThreadPoolExecutor(max_workers=len(VARIANTS)) as pool:
        started = {
            name: pool.submit(run_check, directory / name, name, check)
            for name, (check, _) in VARIANTS.items()
        }
        return {name: future.result() for name, future in started.items()}


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_quick_profile_catches_the_broken_variant(outputs, variant):
    check, symptom = VARIANTS[variant]
    output = outputs[variant]
    assert output.startswith("exit 1\n"), output[-4000:]
    assert check in output, output[-4000:]
    assert symptom in output, output[-4000:]
