"""The ``laminar`` command line."""
