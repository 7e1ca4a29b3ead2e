"""The documentation promises what the code does: hooks, public names, the plugin guide."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import laminar_sdk
from laminar_sdk._plugins import hookspecs as _hookspecs
from laminar_sdk.faults import CrashStep

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GUIDE = DOCS / "writing-a-plugin.md"
FILE_BLOCK = re.compile(r"<!-- file: (?P<path>\S+) -->\n```[a-z]*\n(?P<body>.*?)```", re.DOTALL)


def test_every_hook_is_documented_with_its_exact_signature():
    text = GUIDE.read_text()
    hooks = [name for name in vars(_hookspecs) if name.startswith("laminar_")]
    assert hooks, "no hook specifications found"
    for name in hooks:
        parameters = inspect.signature(getattr(_hookspecs, name)).parameters
        signature = f"{name}({', '.join(parameters)})"
        assert f"`{signature}`" in text, f"docs/writing-a-plugin.md lacks the hook {signature}"


def test_public_api_is_sorted_and_importable():
    # isort-style order, as ruff's RUF022 keeps it: CONSTANTS, then Classes, then functions.
    def kind(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert laminar_sdk.__all__ == sorted(laminar_sdk.__all__, key=kind)
    for name in laminar_sdk.__all__:
        assert hasattr(laminar_sdk, name), name


def test_the_kit_and_first_party_plugins_use_only_public_names():
    # They are written as a third-party author would write them: what they need from the SDK
    # is public API, so a plugin author can copy from them.
    private = re.compile(r"\blaminar_sdk(\.\w+)*\._")
    sources = [
        *(ROOT / "conformance" / "laminar_conformance").rglob("*.py"),
        *(ROOT / "plugins").glob("*/laminar_plugin_*/**/*.py"),
    ]
    assert len(sources) > 20, "the kit's and plugins' sources were not found"
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sources
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if private.search(line)
    ]
    assert offenders == [], "import these from laminar_sdk, or make them public there"


def guide_files() -> dict[str, str]:
    return {m["path"]: m["body"] for m in FILE_BLOCK.finditer(GUIDE.read_text())}


def test_guide_has_the_plugin_files():
    assert set(guide_files()) == {
        "pyproject.toml",
        "laminar_plugin_example/__init__.py",
        "laminar_plugin_example/py.typed",
    }


@pytest.mark.slow
@pytest.mark.full  # nightly: CI installs and checks the plugin `laminar new-plugin` makes
def test_plugin_written_from_the_guide_installs_with_pip_and_works(tmp_path):
    project = tmp_path / "laminar-plugin-example"
    for relative, body in guide_files().items():
        target = project / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body)
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(site),
            str(project),
        ],
        check=True,
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    listing = subprocess.run(
        [sys.executable, "-m", "laminar_sdk", "plugins", "list"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = {line.split()[0]: line.split() for line in listing.splitlines()[1:]}
    assert rows["example-counter"][1:4] == ["source", "laminar-plugin-example", "0.1.0"]
    assert rows["example-jsonl"][1:4] == ["sink", "laminar-plugin-example", "0.1.0"]

    out_file = tmp_path / "out" / "rows.jsonl"
    script = f"""
import asyncio, json
from laminar_sdk import load_connector_registry, SourceCheckpoint

async def main():
    registry = load_connector_registry()
    source, _ = await registry.open_source("example-counter", {{"limit": "5"}})
    sink, _ = await registry.open_sink("example-jsonl", {{"path": {str(out_file)!r}}})
    first = await source.poll_batch(3)
    await sink.write_batch(first.records)
    resumed = registry.create_source("example-counter")
    await resumed.open(_)
    await resumed.restore(source.checkpoint())
    rest = await source.poll_batch(10)
    await sink.write_batch(rest.records)
    await source.close(); await sink.close()

asyncio.run(main())
"""
    subprocess.run([sys.executable, "-c", script], env=env, check=True)
    written = [
        int(__import__("json").loads(line)["id"]) for line in out_file.read_text().splitlines()
    ]
    assert written == [0, 1, 2, 3, 4]

    # The plugin passes the conformance kit as written, its contexts saying what cannot apply.
    for connector in ("example-counter", "example-jsonl"):
        kit = subprocess.run(
            [sys.executable, "-m", "laminar_conformance", "run", connector, "--no-spark"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )
        assert kit.returncode == 0, kit.stdout[-4000:] + kit.stderr[-2000:]
        assert "turned off by the test context: " in kit.stdout


def test_the_api_reference_is_what_the_docstrings_say():
    # Every public name has a docstring, and docs/api/ was written from the current ones.
    result = subprocess.run(
        [sys.executable, str(DOCS / "api.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_every_crash_step_is_documented_with_its_number():
    text = (DOCS / "epoch-protocol.md").read_text()
    for step in CrashStep:
        assert f"| {step.number} | `{step.value}` |" in text, f"crash step {step.value} is missing"
    assert "`WHEN`" in text, "the STEP:EPOCH[:WHEN] syntax is not explained"
    assert "Nms" in text, "a kill N milliseconds into a call is not explained"


def user_docs() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted(DOCS.rglob("*.md"))]


RELATIVE_PATH = re.compile(r"(?:\.\./)+[\w.-]*")


def test_the_docs_never_send_a_reader_where_they_cannot_follow():
    # Third-party authors have the repository's docs and the installed packages: no path out
    # of the repository, no private module to read.
    private = re.compile(r"\blaminar_(sdk|conformance)(\.\w+)*\._\w")
    for path in user_docs():
        text = path.read_text()
        where = path.relative_to(ROOT)
        for relative in RELATIVE_PATH.findall(text):
            resolved = (path.parent / relative).resolve()
            assert resolved.is_relative_to(ROOT), f"{where} leads out of the repository: {relative}"
        found = private.search(text)
        assert found is None, f"{where} names the private module {found and found.group(0)}"


LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def test_every_link_between_the_docs_resolves():
    for path in user_docs():
        for match in LINK.finditer(path.read_text()):
            target = match["target"]
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            where = f"{path.relative_to(ROOT)} links to {target}"
            assert resolved.exists(), f"{where}, which does not exist"
            if anchor and resolved.suffix == ".md":
                assert anchor in anchors(resolved), f"{where}: no such heading"


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of the headings of a markdown file."""
    found = set()
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
            found.add(slug)
    return found
