"""Laminar conformance kit: suites that prove a plugin or a checkpoint store keeps its contract.

Plugin and store authors run them in their own CI.

The suites live in submodules: ``laminar_conformance.sink`` and ``laminar_conformance.source``
for connectors (with the test-context protocols a plugin implements in
``laminar_conformance.contexts``), ``laminar_conformance.checkpointer`` for checkpoint stores.
``laminar conformance run CONNECTOR`` runs them from the shell; ``laminar_conformance.services``
starts the external systems they run against.
"""
