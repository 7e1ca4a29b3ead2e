"""PostgreSQL connectors for Laminar: the ``postgres`` sink and source, the ``postgres-cdc`` source.

Installed, the plugin registers through the ``laminar_sdk.plugins`` entry point (``postgres``):

- ``postgres`` sink (:class:`PostgresSink`) — each epoch exactly once: ``COPY`` and a marker
  row in one transaction;
- ``postgres-2pc`` sink (:class:`PostgresTwoPhaseSink`) — each epoch exactly once through
  ``PREPARE TRANSACTION`` / ``COMMIT PREPARED``, each Spark write task preparing its share;
- ``postgres-upsert`` sink (:class:`PostgresUpsertSink`) — ``INSERT ... ON CONFLICT`` on a
  key: idempotent, at least once;
- ``postgres`` source (:class:`PostgresKeysetSource`) — a table read in the order of a monotonic
  key, replayable, range-readable for parallel reads on Spark;
- ``postgres-cdc`` source (:class:`PostgresCdcSource`) — a table's inserts, updates and deletes
  from a logical replication slot (``pgoutput``), the slot advanced only past durable epochs.

Passwords come from ``password.env`` / ``password.file`` (or libpq's own ``PGPASSWORD`` and
passfile), never from the connection string, and are never shown. For the conformance kit the
plugin also gives test contexts, which take their server from
``laminar_conformance.services.postgres_service()`` (the kit is imported only when asked).
"""

from __future__ import annotations

from laminar_plugin_postgres._cdc import PostgresCdcSource, create_slot, drop_slot
from laminar_plugin_postgres._keyset import PostgresKeysetSource
from laminar_plugin_postgres._plugin import laminar_conformance_context, laminar_register_connectors
from laminar_plugin_postgres._sink import PostgresSink, PostgresTwoPhaseSink, PostgresUpsertSink

__all__ = [
    "PostgresCdcSource",
    "PostgresKeysetSource",
    "PostgresSink",
    "PostgresTwoPhaseSink",
    "PostgresUpsertSink",
    "create_slot",
    "drop_slot",
    "laminar_conformance_context",
    "laminar_register_connectors",
]
