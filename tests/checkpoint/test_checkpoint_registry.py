"""Finding checkpoint stores through the ``laminar_sdk.checkpointers`` entry points."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path

import pytest

from laminar_sdk import (
    CHECKPOINTER_ENTRY_POINT_GROUP,
    CheckpointError,
    FileCheckpointer,
    MemoryCheckpointer,
    PluginError,
    installed_checkpointers,
    open_checkpointer,
    store_for_location,
)


@pytest.mark.parametrize(
    ("location", "store"),
    [
        ("/var/lib/checkpoints", "file"),
        ("relative/dir", "file"),
        ("file:///var/lib/checkpoints", "file"),
        ("memory://test", "memory"),
        ("s3://bucket/prefix", "object"),
        ("S3://bucket/prefix", "object"),
        ("gs://bucket/prefix", "object"),
        ("az://account/container/prefix", "object"),
        ("abfss://container@account.dfs.core.windows.net/prefix", "object"),
    ],
)
def test_store_is_inferred_from_the_scheme(location: str, store: str) -> None:
    assert store_for_location(location) == store


def test_unknown_scheme_says_how_to_name_a_store() -> None:
    with pytest.raises(CheckpointError, match=r"hdfs:// .*--store NAME"):
        open_checkpointer("hdfs://namenode/checkpoints")


def test_unknown_scheme_hides_credentials() -> None:
    with pytest.raises(CheckpointError) as failure:
        open_checkpointer("ftp://user:hunter2@host/dir?token=abc")
    assert "hunter2" not in str(failure.value)
    assert "abc" not in str(failure.value)


def test_built_in_stores_are_entry_points() -> None:
    assert list(installed_checkpointers()) == ["file", "memory", "object"]
    assert isinstance(open_checkpointer("memory://registry"), MemoryCheckpointer)


def test_unknown_store_lists_installed_ones(tmp_path: Path) -> None:
    with pytest.raises(
        CheckpointError, match=r"no checkpoint store named 'nope'.*file, memory, object"
    ):
        open_checkpointer(str(tmp_path), store="nope")


def test_store_name_overrides_the_scheme() -> None:
    with pytest.raises(CheckpointError, match="memory://NAME"):
        open_checkpointer("/tmp/x", store="memory")


# A third-party store, installed the way pip installs one: a module and a dist-info with an
# entry point, on sys.path.
_PLUGIN = textwrap.dedent(
    """
    from laminar_sdk import MemoryCheckpointer

    class DemoCheckpointer(MemoryCheckpointer):
        def __init__(self, location, options):
            self.options = dict(options)
            super().__init__("memory://" + location.removeprefix("demo://"))

    def not_a_store(location, options):
        return object()
    """
)


InstallStore = Callable[..., Path]


@pytest.fixture
def install_store(install_distribution: Callable[..., Path]) -> Callable[..., Path]:
    def install(distribution: str, entry_points: Mapping[str, str]) -> Path:
        return install_distribution(
            distribution,
            modules={"laminar_store_demo": _PLUGIN},
            plugins=entry_points,
            group=CHECKPOINTER_ENTRY_POINT_GROUP,
        )

    return install


def test_a_third_party_store_is_found_like_the_built_ins(
    install_store: Callable[..., Path],
) -> None:
    install_store("laminar-store-demo", {"demo": "laminar_store_demo:DemoCheckpointer"})
    assert "demo" in installed_checkpointers()
    store = open_checkpointer("demo://x", store="demo", options={"a": "1"})
    assert type(store).__name__ == "DemoCheckpointer"
    assert store.options == {"a": "1"}  # type: ignore[attr-defined]


def test_two_distributions_with_one_name_are_an_error(install_store: InstallStore) -> None:
    install_store("laminar-store-one", {"twin": "laminar_store_demo:DemoCheckpointer"})
    install_store("laminar-store-two", {"twin": "laminar_store_demo:not_a_store"})
    with pytest.raises(PluginError, match="laminar-store-one and laminar-store-two") as failure:
        open_checkpointer("memory://x")
    assert failure.value.distribution == "laminar-store-two"


def test_a_store_that_fails_to_import_is_named(install_store: InstallStore) -> None:
    install_store("laminar-store-broken", {"broken": "laminar_store_missing:Store"})
    with pytest.raises(PluginError, match=r"'broken' from distribution laminar-store-broken"):
        open_checkpointer("x", store="broken")


def test_a_factory_must_return_a_checkpointer(install_store: InstallStore) -> None:
    install_store("laminar-store-bad", {"bad": "laminar_store_demo:not_a_store"})
    with pytest.raises(PluginError, match="returned object, not a Checkpointer"):
        open_checkpointer("x", store="bad")


def test_entry_points_can_be_given() -> None:
    entry_point = metadata.EntryPoint(
        "mem", "laminar_sdk._checkpointing.memory_store:MemoryCheckpointer", "x"
    )
    assert isinstance(
        open_checkpointer("memory://given", store="mem", entry_points=[entry_point]),
        MemoryCheckpointer,
    )


def test_nothing_is_loaded_at_import() -> None:
    probe = (
        "import sys, laminar_sdk; "
        "print(sorted(m for m in sys.modules if m.startswith('obstore') "
        "or m.endswith('object_store')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    ).stdout
    assert out == "[]\n"


def test_opening_a_file_store_does_not_import_obstore(tmp_path: Path) -> None:
    probe = (
        "import sys; from laminar_sdk._checkpointing.registry import open_checkpointer; "
        f"open_checkpointer({str(tmp_path)!r}); print('obstore' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    ).stdout
    assert out == "False\n"
    assert isinstance(open_checkpointer(str(tmp_path)), FileCheckpointer)
