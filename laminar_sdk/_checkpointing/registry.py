"""Finding checkpoint stores through the ``laminar_sdk.checkpointers`` entry-point group."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from importlib import metadata
from typing import Protocol

from laminar_sdk._checkpointing.checkpointer import Checkpointer, display_location
from laminar_sdk._contract.errors import CheckpointError, PluginError
from laminar_sdk._plugins.loading import FoundEntryPoint, distribution_of

CHECKPOINTER_ENTRY_POINT_GROUP = "laminar_sdk.checkpointers"
"""The entry-point group checkpoint stores register under (name = factory)."""

OBJECT_STORE_SCHEMES = frozenset({"s3", "s3a", "gs", "az", "azure", "abfs", "abfss", "adl"})
"""URL schemes that select the ``object`` store."""

_SCHEME_STORES = {"file": "file", "memory": "memory"} | dict.fromkeys(
    OBJECT_STORE_SCHEMES, "object"
)


class CheckpointerFactory(Protocol):
    """What a ``laminar_sdk.checkpointers`` entry point names.

    A class or function that opens a store at a location with options, both as the user
    gave them.
    """

    def __call__(self, location: str, options: Mapping[str, str], /) -> Checkpointer:
        """Open the store at ``location``; raise ``CheckpointError`` for a bad one."""
        ...


def store_for_location(location: str) -> str:
    """The name of the store a location's scheme selects.

    A bare path or ``file://`` selects ``file``, ``memory://`` selects ``memory``, and
    ``s3://``, ``gs://``, ``az://`` (and their aliases) select ``object``.

    :raises CheckpointError: for another scheme, saying how to name the store.
    """
    scheme, separator, _ = location.partition("://")
    if not separator:
        return "file"
    try:
        return _SCHEME_STORES[scheme.lower()]
    except KeyError:
        raise CheckpointError(
            f"no checkpoint store is known for {scheme}:// locations "
            f"({display_location(location)}); name one with store=... (--store NAME)"
        ) from None


def installed_checkpointers(
    entry_points: Iterable[metadata.EntryPoint | FoundEntryPoint] | None = None,
) -> dict[str, metadata.EntryPoint | FoundEntryPoint]:
    """Every installed checkpoint store by name, without importing any of them.

    :param entry_points: the entry points to consider instead of the installed ones.
    :raises PluginError: when two distributions declare the same store name.
    """
    if entry_points is None:
        entry_points = metadata.entry_points(group=CHECKPOINTER_ENTRY_POINT_GROUP)
    found: dict[str, metadata.EntryPoint | FoundEntryPoint] = {}
    for entry_point in entry_points:
        previous = found.get(entry_point.name)
        if previous is not None and previous.value != entry_point.value:
            first, second = distribution_of(previous)[0], distribution_of(entry_point)[0]
            raise PluginError(
                f"two distributions declare a checkpoint store named {entry_point.name!r}: "
                f"{first} and {second}; uninstall one of them",
                distribution=second,
            )
        found[entry_point.name] = entry_point
    return dict(sorted(found.items()))


def open_checkpointer(
    location: str,
    *,
    store: str | None = None,
    options: Mapping[str, str] | None = None,
    entry_points: Iterable[metadata.EntryPoint | FoundEntryPoint] | None = None,
) -> Checkpointer:
    """Open the checkpoint store at ``location``.

    The store is the factory registered under ``store`` in the ``laminar_sdk.checkpointers``
    entry-point group, or the one the location's scheme selects (:func:`store_for_location`).
    Only that store's module is imported, and only now. A store installed with ``pip`` from
    another distribution is found the same way as the built-in ``file``, ``memory`` and
    ``object`` stores.

    :param location: a directory, ``file://...``, ``memory://NAME``, ``s3://bucket/prefix``...
    :param store: the store name; inferred from ``location`` when ``None``.
    :param options: store settings (for ``object``: endpoint, region, credentials...).
    :param entry_points: the entry points to consider instead of the installed ones.
    :raises CheckpointError: for an unknown store name (listing the installed ones) or a
        location the store refuses.
    :raises PluginError: when the store's module fails to import or its factory misbehaves.
    """
    name = store or store_for_location(location)
    available = installed_checkpointers(entry_points)
    entry_point = available.get(name)
    if entry_point is None:
        raise CheckpointError(
            f"no checkpoint store named {name!r} is installed; installed: "
            f"{', '.join(available) or 'none'} (pip install the distribution providing it)"
        )
    distribution = distribution_of(entry_point)[0]
    try:
        factory: CheckpointerFactory = entry_point.load()
    except Exception as error:
        raise PluginError(
            f"checkpoint store {name!r} from distribution {distribution} failed to import "
            f"({entry_point.value}): {type(error).__name__}: {error}",
            distribution=distribution,
        ) from error
    checkpointer = factory(location, dict(options or {}))
    if not isinstance(checkpointer, Checkpointer):
        raise PluginError(
            f"checkpoint store {name!r} from distribution {distribution} returned "
            f"{type(checkpointer).__name__}, not a Checkpointer",
            distribution=distribution,
        )
    return checkpointer
