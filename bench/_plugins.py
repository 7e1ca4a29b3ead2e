"""Installing a benchmark's plugin the way a third-party plugin is installed: an entry point."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

BENCH_DIRECTORY = Path(__file__).resolve().parent


def install_plugin(site: Path, distribution: str, module: str) -> None:
    """Install ``module`` as a laminar plugin named ``distribution``, for Spark's workers too.

    ``site`` (a new directory) gets the distribution's metadata with its
    ``laminar_sdk.plugins`` entry point; ``module`` is found in ``site`` or in this directory.
    Both go first on ``sys.path`` and on ``PYTHONPATH``, which Spark's Python workers inherit:
    call this before the Spark session starts.
    """
    dist_info = site / f"{distribution.replace('-', '_')}-1.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n"
    )
    (dist_info / "entry_points.txt").write_text(
        f"[laminar_sdk.plugins]\n{distribution} = {module}\n"
    )
    paths = [str(site), str(BENCH_DIRECTORY)]
    sys.path[:0] = paths
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, os.environ.get("PYTHONPATH")]))
    importlib.invalidate_caches()
