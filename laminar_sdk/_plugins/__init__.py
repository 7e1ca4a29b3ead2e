"""Finding plugins: the pluggy hooks, the entry points, the connector registry."""
