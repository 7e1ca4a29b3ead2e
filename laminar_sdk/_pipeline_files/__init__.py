"""Pipeline files: loading them, and checking them without Spark (``laminar run --check``)."""
