"""The connector contract: the base classes, their types, errors, configuration and helpers."""
