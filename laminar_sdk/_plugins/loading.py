"""Finding, validating and loading connector plugins through entry points and pluggy."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import pluggy

from laminar_sdk._contract.errors import PluginError
from laminar_sdk._plugins import hookspecs
from laminar_sdk._plugins.registry import ConnectorRegistry

PLUGIN_ENTRY_POINT_GROUP = "laminar_sdk.plugins"
"""The entry-point group connector plugins register under."""

ALLOWLIST_VARIABLE = "LAMINAR_PLUGINS"
"""Comma-separated plugin or distribution names: when set, only these plugins load (the SDK's
own built-in connectors always load unless disabled)."""

DENYLIST_VARIABLE = "LAMINAR_DISABLE_PLUGINS"
"""Comma-separated plugin or distribution names that never load."""

SDK_DISTRIBUTION = "laminar-sdk"


def _names(value: str | None) -> frozenset[str] | None:
    if value is None:
        return None
    return frozenset(_canonical(part) for part in value.split(",") if part.strip())


def _canonical(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def _selected(
    entry_points: Iterable[metadata.EntryPoint | FoundEntryPoint], environ: Mapping[str, str]
) -> list[metadata.EntryPoint | FoundEntryPoint]:
    allow = _names(environ.get(ALLOWLIST_VARIABLE))
    deny = _names(environ.get(DENYLIST_VARIABLE)) or frozenset()
    chosen = []
    for entry_point in entry_points:
        distribution = distribution_of(entry_point)[0]
        names = {_canonical(entry_point.name), _canonical(distribution)}
        if names & deny:
            continue
        if allow is not None and distribution != SDK_DISTRIBUTION and not names & allow:
            continue
        chosen.append(entry_point)
    return sorted(chosen, key=lambda ep: (distribution_of(ep)[0], ep.name))


@dataclass(frozen=True, slots=True)
class FoundEntryPoint:
    """An installed entry point and its distribution, as a scan of the installed ones found it.

    Plain, picklable data: Spark ships it to its Python workers inside the options of a
    ``format("laminar")`` query, and a worker loads the plugin, or the checkpoint store, from
    it without scanning every installed distribution again. Spark starts a new Python process
    for each query's source, where that scan took about a tenth of a second (a short query's
    whole start is a few tenths). Loaders here take it wherever they take an
    :class:`importlib.metadata.EntryPoint`.
    """

    group: str
    name: str
    value: str
    distribution: str
    version: str

    @classmethod
    def of(cls, entry_point: metadata.EntryPoint) -> FoundEntryPoint:
        """What ``entry_point`` names, with its distribution's name and version."""
        distribution, version = distribution_of(entry_point)
        return cls(entry_point.group, entry_point.name, entry_point.value, distribution, version)

    def load(self) -> Any:  # noqa: ANN401 - whatever the entry point names
        """Import and return the object the entry point names, as ``EntryPoint.load`` does."""
        return metadata.EntryPoint(self.name, self.value, self.group).load()


def find_entry_point(group: str, name: str) -> FoundEntryPoint | None:
    """The installed entry point ``name`` of ``group``; ``None`` unless exactly one is installed.

    (Two distributions declaring one name is an error the loaders report, with both names.)
    """
    found = list(metadata.entry_points(group=group, name=name))
    return FoundEntryPoint.of(found[0]) if len(found) == 1 else None


def distribution_of(entry_point: metadata.EntryPoint | FoundEntryPoint) -> tuple[str, str]:
    """The name and version of the distribution that declares ``entry_point``."""
    if isinstance(entry_point, FoundEntryPoint):
        return entry_point.distribution, entry_point.version
    dist = entry_point.dist
    if dist is None:
        return "<unknown distribution>", ""
    return dist.metadata["Name"] or dist.name, dist.version


def _load(entry_point: metadata.EntryPoint | FoundEntryPoint, distribution: str) -> object:
    try:
        plugin: object = entry_point.load()
    except Exception as error:
        raise PluginError(
            f"plugin {entry_point.name!r} from distribution {distribution} failed to import "
            f"({entry_point.value}): {type(error).__name__}: {error}. Fix or uninstall it "
            f"(pip uninstall {distribution}), or skip it with "
            f"{DENYLIST_VARIABLE}={entry_point.name}",
            distribution=distribution,
        ) from error
    return plugin


def _register(
    manager: pluggy.PluginManager,
    plugin: object,
    entry_point: metadata.EntryPoint | FoundEntryPoint,
    dist: str,
) -> None:
    try:
        manager.register(plugin, name=entry_point.name)
        # Checked after each registration, so whatever is pending belongs to this plugin.
        manager.check_pending()
    except (pluggy.PluginValidationError, ValueError) as error:
        if manager.is_registered(plugin):
            manager.unregister(plugin)
        raise PluginError(
            f"plugin {entry_point.name!r} from distribution {dist} declares a bad hook: "
            f"{error}. Hooks it may implement: {', '.join(_hook_names())}",
            distribution=dist,
        ) from error


def _hook_names() -> list[str]:
    return sorted(name for name in vars(hookspecs) if name.startswith("laminar_"))


def load_connector_registry(
    *,
    entry_points: Iterable[metadata.EntryPoint | FoundEntryPoint] | None = None,
    environ: Mapping[str, str] | None = None,
    plugin: str | None = None,
) -> ConnectorRegistry:
    """Load the installed plugins (or ``plugin`` alone) and return the connectors they register.

    Plugins are the entry points of group ``laminar_sdk.plugins``, filtered by the
    ``LAMINAR_PLUGINS`` allowlist and the ``LAMINAR_DISABLE_PLUGINS`` denylist. Each plugin is
    imported, validated (a misspelt or malformed hook is an error) and asked to register its
    connectors. Nothing happens at import time: call this when connectors are needed.

    :param entry_points: the entry points to load instead of the installed ones (for tests).
    :param environ: the environment to read the allow- and denylist from (default: os.environ).
    :param plugin: load only the plugin of this entry-point name (a connector's
        :attr:`ConnectorSpec.plugin`), not every installed one: what a process that needs one
        known connector does, since importing every plugin costs each new process a good part
        of a second when several are installed.
    :raises PluginError: naming the plugin and its distribution when one fails to import, has
        a bad hook, fails while registering, or registers a name another plugin registered.
    """
    registry, _ = load_plugins(entry_points=entry_points, environ=environ, plugin=plugin)
    return registry


def load_plugins(
    *,
    entry_points: Iterable[metadata.EntryPoint | FoundEntryPoint] | None = None,
    environ: Mapping[str, str] | None = None,
    plugin: str | None = None,
) -> tuple[ConnectorRegistry, pluggy.PluginManager]:
    """Load plugins like :func:`load_connector_registry`; also return the plugin manager.

    For callers that invoke hooks beyond connector registration.
    """
    if entry_points is None:
        entry_points = metadata.entry_points(group=PLUGIN_ENTRY_POINT_GROUP)
    if plugin is not None:
        entry_points = [ep for ep in entry_points if ep.name == plugin]
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    origins: dict[str, tuple[str, str]] = {}
    for entry_point in _selected(entry_points, os.environ if environ is None else environ):
        distribution, version = distribution_of(entry_point)
        if manager.has_plugin(entry_point.name):
            previous = origins[entry_point.name][0]
            raise PluginError(
                f"two distributions declare a plugin named {entry_point.name!r}: {previous} "
                f"and {distribution}; uninstall one of them",
                distribution=distribution,
            )
        module = _load(entry_point, distribution)
        _register(manager, module, entry_point, distribution)
        origins[entry_point.name] = (distribution, version)

    registry = ConnectorRegistry()
    for name, (distribution, version) in origins.items():
        others = [p for n, p in manager.list_name_plugin() if n != name]
        hook = manager.subset_hook_caller("laminar_register_connectors", remove_plugins=others)
        with registry.registering_for(distribution, version, name):
            try:
                hook(registry=registry)
            except PluginError:
                raise
            except Exception as error:
                raise PluginError(
                    f"plugin {name!r} from distribution {distribution} failed while "
                    f"registering its connectors: {type(error).__name__}: {error}",
                    distribution=distribution,
                ) from error
    return registry, manager
