"""Build every distribution of this repository, wheel and sdist, into one wheelhouse.

``python3 -m tox -e wheelhouse`` runs this (into ``dist/wheelhouse/``) in an environment that has
``build`` and ``twine``; from the wheelhouse, pip installs any of them without PyPI knowing them::

    pip install --find-links dist/wheelhouse 'laminar-conformance[spark]' laminar-plugin-files

Each distribution is built with ``python -m build`` (an sdist, then the wheel from that sdist, so
a file missing from the sdist fails here), and every file is checked with ``twine check
--strict``, as PyPI would check it. Earlier builds of these distributions in the wheelhouse are
removed first, so it holds one version of each. Third-party dependencies (pyspark, pyarrow, ...)
are not put in it: pip takes them from PyPI or its cache.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

DISTRIBUTIONS = {
    "laminar-sdk": ".",
    "laminar-conformance": "conformance",
    "laminar-plugin-files": "plugins/files",
    "laminar-plugin-kafka": "plugins/kafka",
    "laminar-plugin-postgres": "plugins/postgres",
    "laminar-plugin-delta": "plugins/delta",
}
"""Every distribution this repository publishes, and its directory: one line each."""


def _builds(wheelhouse: Path) -> list[Path]:
    """The wheels and sdists of these distributions in ``wheelhouse``, of any version."""
    # Wheel and sdist names start with the normalized name: laminar_sdk-0.1.0...
    prefixes = tuple(distribution.replace("-", "_") + "-" for distribution in DISTRIBUTIONS)
    return sorted(
        path
        for path in wheelhouse.iterdir()
        if path.name.startswith(prefixes) and path.name.endswith((".whl", ".tar.gz"))
    )


def _run(command: list[str], what: str) -> None:
    """Run ``command``; on failure, show its output and stop, saying what failed."""
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        sys.exit(f"build_wheelhouse: {what} failed (exit status {done.returncode}); see above")


def build(wheelhouse: Path) -> list[Path]:
    """Build every distribution into ``wheelhouse`` and check them; the files written."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    for earlier in _builds(wheelhouse):
        earlier.unlink()
    for number, (distribution, directory) in enumerate(DISTRIBUTIONS.items(), start=1):
        started = time.monotonic()
        print(f"[{number}/{len(DISTRIBUTIONS)}] {distribution} ({directory})", end="", flush=True)
        _run(
            [sys.executable, "-m", "build", "--outdir", str(wheelhouse), str(ROOT / directory)],
            f"building {distribution} from {directory}",
        )
        print(f": built in {time.monotonic() - started:.1f}s", flush=True)
    built = _builds(wheelhouse)
    _run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, built)],
        "twine check --strict (the metadata PyPI would refuse)",
    )
    return built


def main() -> None:
    """Build the wheelhouse named on the command line (default: ``dist/wheelhouse``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--outdir",
        type=Path,
        default=ROOT / "dist" / "wheelhouse",
        help="the wheelhouse directory (default: dist/wheelhouse in the repository)",
    )
    wheelhouse = parser.parse_args().outdir.resolve()
    built = build(wheelhouse)
    print(f"twine check --strict: {len(built)} files passed")
    print("\n".join(f"  {path.name}" for path in built))
    print(f"install from it: pip install --find-links {wheelhouse} 'laminar-conformance[spark]'")


if __name__ == "__main__":
    main()
