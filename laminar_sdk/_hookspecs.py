"""Hook specifications: the hooks a Laminar plugin may implement.

Mark implementations with :data:`laminar_sdk.hookimpl`. A marked function whose name matches
no hook here is an error when the plugin loads, so a misspelt hook fails loudly instead of
being ignored. (An unmarked function is not a hook implementation at all and is not called.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from laminar_sdk._registry import ConnectorRegistry

PROJECT_NAME = "laminar_sdk"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


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
