"""The conformance kit's context for the ``postgres`` sink in ``mode=upsert``.

Pass this module to the kit to check that mode instead of the default (``append``)::

    laminar conformance run postgres --role sink --plugin laminar_plugin_postgres.upsert_context

or, in a test module, ``plugins = [laminar_plugin_postgres.upsert_context]`` in the class
adopting the suites. Its hook runs before the plugin's own.
"""

from __future__ import annotations

from pathlib import Path

from laminar_sdk import hookimpl

from laminar_plugin_postgres._contexts import PostgresSinkContext


@hookimpl(tryfirst=True)
def laminar_conformance_context(
    connector: str, role: str, workdir: Path
) -> PostgresSinkContext | None:
    """The ``postgres`` sink in ``mode=upsert`` on a fresh table."""
    if (connector, role) == ("postgres", "sink"):
        return PostgresSinkContext(workdir, mode="upsert")
    return None
