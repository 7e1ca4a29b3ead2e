"""Hook specifications: the hooks a Laminar plugin may implement.

Mark implementations with :data:`laminar_sdk.hookimpl`. A marked function whose name matches
no hook here is an error when the plugin loads, so a misspelt hook fails loudly instead of
being ignored. (An unmarked function is not a hook implementation at all and is not called.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from pathlib import Path

    from laminar_sdk._plugins.registry import ConnectorRegistry

PROJECT_NAME = "laminar_sdk"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
"""Marks the SDK's hook specifications (below); plugins do not need it."""

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
"""Marks a plugin's hook implementations: ``@hookimpl def laminar_register_connectors(...)``."""


# Registration ------------------------------------------------------------------------------


@hookspec
def laminar_register_connectors(registry: ConnectorRegistry) -> None:
    """Register the source and sink connectors this plugin provides.

    Called once for every plugin, when the connector registry is first built (never at
    import). Register with ``registry.add_source(...)`` / ``registry.add_sink(...)``; the
    registry records which distribution each connector came from.

    :param registry: the registry to add connectors to.
    :returns: nothing; registering through the registry is the whole effect.
    """


# Conformance testing -------------------------------------------------------------------------


@hookspec(firstresult=True)
def laminar_conformance_context(connector: str, role: str, workdir: Path) -> object | None:
    """Give the conformance kit a test context for one of this plugin's connectors.

    Declared by the SDK (not by ``laminar-conformance``) so that a plugin implementing it
    loads and works whether or not the kit is installed. The first non-``None`` result wins.

    :param connector: the connector name the kit is testing.
    :param role: ``"source"`` or ``"sink"``.
    :param workdir: a fresh, empty directory the context may use.
    :returns: a source or sink test context (see ``laminar_conformance``), or ``None`` when
        this plugin does not provide ``connector`` in ``role``.
    """
