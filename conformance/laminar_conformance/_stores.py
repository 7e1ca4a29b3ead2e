"""The checkpoint store and connector state stores the kit's in-process runs use.

The kit keeps what the runtime would keep in a laminar checkpoint location in the SDK's
embedded ``file`` store, found like any installed store, in directories of the check's own.
"""

from __future__ import annotations

import functools
from importlib import metadata
from pathlib import Path
from typing import Any

from laminar_sdk import StateStore

CHECKPOINT_STORE = "file"
"""The checkpoint store the kit's runs through the coordinator use."""


@functools.cache
def _checkpoint_store_factory() -> Any:  # noqa: ANN401 - the SDK does not export Checkpointer
    """The store's factory, found like any installed store.

    Found once: every Hypothesis case opens a store, and a lookup reads the entry points of
    every installed distribution (20 ms).
    """
    (entry_point,) = metadata.entry_points(group="laminar_sdk.checkpointers", name=CHECKPOINT_STORE)
    return entry_point.load()


def checkpoint_store(directory: Path) -> Any:  # noqa: ANN401 - the SDK does not export Checkpointer
    """A checkpoint store in ``directory``, found like any installed store."""
    return _checkpoint_store_factory()(str(directory), {})


def state_store(directory: Path, role: str, connector: str) -> StateStore:
    """The state store the Spark bridge gives ``connector`` in ``role``, kept in ``directory``.

    On Spark every sink, and every source with a laminar checkpoint location, gets one in
    its ``ConnectorConfig.state_store``; instances of one destination share it.
    """
    store: StateStore = checkpoint_store(directory).state_store(f"{role}.{connector}")
    return store
