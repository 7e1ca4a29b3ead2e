"""Laminar conformance kit: suites that prove a plugin or a checkpoint store keeps its contract.

Plugin and store authors run them in their own CI.

The suites live in submodules (``laminar_conformance.checkpointer`` for checkpoint stores);
``laminar_conformance.services`` starts the external systems they run against.
"""
