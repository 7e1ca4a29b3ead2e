"""``laminar conformance run`` on a delta sink, in a child process, for the tests of the kit."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

HERE = Path(__file__).parent


def run_kit(
    directory: Path, connector: str, *arguments: str, environment: Mapping[str, str] = {}
) -> str:
    """Run the kit on sink ``connector`` (seed 1, no Spark layer) in ``directory``.

    This directory is on the child's ``PYTHONPATH``, so ``--plugin delta_broken`` finds the
    broken variants.

    :param environment: added to this process's environment.
    :returns: ``exit <status>`` on the first line, then the run's output.
    """
    command = [sys.executable, "-m", "laminar_conformance", "run", connector, "--role", "sink"]
    command += ["--seed", "1", "--no-spark", *arguments]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path]),
            **environment,
        },
        cwd=directory,
        check=False,
        timeout=1200,
    )
    return f"exit {result.returncode}\n{result.stdout}{result.stderr}"
