"""Test contexts: how a plugin lets the conformance kit create and read its external system.

A plugin gives the kit a *test context* for each of its connectors through the SDK's hook
``laminar_conformance_context(connector, role, workdir)`` (declared by ``laminar_sdk``, so the
plugin does not depend on this kit)::

    from laminar_sdk import hookimpl

    @hookimpl
    def laminar_conformance_context(connector, role, workdir):
        if (connector, role) == ("my-sink", "sink"):
            return MySinkContext(workdir)
        return None

The object returned only needs the methods of :class:`SinkTestContext` or
:class:`SourceTestContext` (structural typing): the plugin never imports this module. The
kit asks for a new context, with a new ``workdir``, for every case it runs, and counts loss and
duplicates id by id, so a context only has to put integer ids into the external system and
read them back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import pluggy
import pyarrow as pa

from laminar_conformance import _reference_contexts
from laminar_sdk import (
    ConnectorConfig,
    ConnectorRegistry,
    ConnectorRole,
    PluginError,
    load_plugins,
)

__all__ = ["ConformancePlugins", "SinkTestContext", "SourceTestContext", "TestContext"]


@runtime_checkable
class SinkTestContext(Protocol):
    """One fresh, empty destination for a sink connector, and a reader of what it holds.

    Every instance the kit opens during one case gets :meth:`config`'s result: after a
    simulated crash, the new instance must find what the old one wrote.

    Optional, read when present (a connector that talks to its system over TCP):

    - ``network_endpoint: str | None`` — the ``host:port`` the connector of :meth:`config`
      connects to;
    - ``config_through(address: str) -> ConnectorConfig`` — :meth:`config`, connecting to
      ``address`` (``host:port``) instead: the network-fault checks put a proxy there;
    - ``network_proxy_listen: str | None`` — where that proxy must listen (default: a free
      port), for a system that tells its clients where to reconnect (a Kafka broker's
      advertised listener).
    """

    def config(self) -> ConnectorConfig:
        """The configuration of the sink, writing to this context's destination.

        Called once per sink instance; return the same destination every time.
        """
        ...

    def batch(self, ids: Sequence[int]) -> pa.RecordBatch:
        """A batch in the sink's schema with one record per id, carrying that id.

        ``ids`` may be empty; the batch then has no rows but still the sink's schema.
        """
        ...

    def committed_ids(self) -> Sequence[int] | None:
        """The ids a downstream reader of the destination sees now, duplicates kept.

        Return ``None`` when the destination cannot be read back (a sink that discards what
        it receives): the checks that compare ids are then skipped, saying so.
        """
        ...

    def close(self) -> None:
        """Release what the context holds (clients, temporary topics, tables)."""
        ...


@runtime_checkable
class SourceTestContext(Protocol):
    """One fresh source system for a source connector, and a way to put records into it.

    The kit appends the first records of a case before it opens the first source instance,
    so that a context whose data is fixed when the source is configured (a generator) works.
    Before the checks it *probes* the source through a context: it appends one record to each
    of partitions ``0 .. 3`` until :meth:`append` raises, reads them back and counts the
    distinct partitions of the batches; then it appends to the opened source and sees whether
    the records arrive. The multi-partition and live-append checks run as far as the probe
    found; a source checkpoint holding more partitions than the kit can fill fails.

    Optional attributes, read when present:

    - ``partitions: int`` — how many partitions the kit spreads records over, instead of
      probing; it passes ``partition=0 .. partitions - 1`` to :meth:`append` (``None`` when 1);
    - ``equal_partitions: bool`` (default ``False``) — when ``True``, the kit appends the same
      number of records to every partition;
    - ``live_appends: bool`` — ``True`` spares the live probe: records appended after a source
      was opened reach it;
    - ``poll_timeout_s: float`` (default 0) — how long the kit polls a source that returned
      nothing before counting what arrived;
    - ``remove_partition(partition: int) -> None`` — take ``partition`` away with its records,
      as the source's system does (a directory deleted, a table partition dropped, a shard
      closed after a split); the kit calls it only once a source has returned all of that
      partition's records, and appends to it no more;
    - ``skip_checks: Mapping[str, str]`` — categories of checks turned off, each with the
      reason the report prints (``{"live-appends": "the rows are fixed by the config"}``);
      the only way to turn a check off. Categories: ``replay``, ``multi-partition``,
      ``live-appends``, ``rollback``, ``crash-points``, ``spark`` (core: ``--strict`` fails on
      their skips unless stated here), ``range-reads``, ``partition-removal``, ``read-back``,
      ``capability``, ``configuration``.
      Sink contexts may set it too.
    """

    def config(self) -> ConnectorConfig:
        """The configuration of a source reading this context's system, from its start."""
        ...

    def append(self, ids: Sequence[int], partition: int | None = None) -> None:
        """Durably add records carrying ``ids``, in this order, to ``partition``."""
        ...

    def ids(self, records: pa.RecordBatch) -> list[int]:
        """The ids carried by ``records``, a batch the source returned, in row order."""
        ...

    def close(self) -> None:
        """Release what the context holds."""
        ...


TestContext = SinkTestContext | SourceTestContext
"""A sink or source test context."""


class ConformancePlugins:
    """The connectors and test contexts the kit can use.

    Built by :meth:`load`: every installed plugin (the ``laminar_sdk.plugins`` entry points),
    the contexts the kit ships for the SDK's reference connectors, and ``extra`` plugins.

    :param registry: the connectors, by role and name.
    :param manager: the plugin manager whose ``laminar_conformance_context`` hook is asked.
    """

    def __init__(self, registry: ConnectorRegistry, manager: pluggy.PluginManager) -> None:
        self.registry = registry
        self._manager = manager

    @classmethod
    def load(cls, extra: Iterable[object] = ()) -> ConformancePlugins:
        """Load the installed plugins, the kit's reference contexts and ``extra`` plugins.

        :param extra: pluggy plugins (modules or objects with ``laminar_sdk.hookimpl``
            functions) to use as if they were installed — for a plugin's own tests before it
            is packaged. Their connectors are registered too.
        :raises PluginError: when a plugin fails to load, or an extra plugin declares a bad
            hook or registers a connector name that is taken.
        """
        registry, manager = load_plugins()
        manager.register(_reference_contexts, name="laminar_conformance.reference_contexts")
        for plugin in extra:
            try:
                name = manager.register(plugin)
                manager.check_pending()
            except (ValueError, pluggy.PluginValidationError) as error:
                raise PluginError(
                    f"extra plugin {plugin!r} cannot be registered: {error}"
                ) from error
            others = [other for other in manager.get_plugins() if other is not plugin]
            register = manager.subset_hook_caller(
                "laminar_register_connectors", remove_plugins=others
            )
            with registry.registering_for(f"{name} (extra plugin)", ""):
                register(registry=registry)
        return cls(registry, manager)

    def context(self, connector: str, role: ConnectorRole, workdir: Path) -> TestContext:
        """A new test context for ``connector`` in ``role``, using the fresh ``workdir``.

        :raises PluginError: when no plugin provides one, or the one provided lacks a method.
        """
        context: object | None = self._manager.hook.laminar_conformance_context(
            connector=connector, role=str(role), workdir=workdir
        )
        expected = SinkTestContext if role is ConnectorRole.SINK else SourceTestContext
        if context is None:
            spec = self.registry.get(connector, role)
            raise PluginError(
                f"no plugin gives the conformance kit a test context for {role} {connector!r} "
                f"(from {spec.distribution}): implement the hook laminar_conformance_context in "
                f"the plugin, returning an object with the methods of "
                f"laminar_conformance.contexts.{expected.__name__}",
                distribution=spec.distribution,
            )
        if not isinstance(context, expected):
            wanted = ("config", "batch", "committed_ids", "close")
            if role is ConnectorRole.SOURCE:
                wanted = ("config", "append", "ids", "close")
            missing = [name for name in wanted if not callable(getattr(context, name, None))]
            raise PluginError(
                f"the test context for {role} {connector!r} ({type(context).__name__}) lacks "
                f"{', '.join(missing)}: see laminar_conformance.contexts.{expected.__name__}"
            )
        return context
