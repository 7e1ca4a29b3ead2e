"""Plain-text output shared by the ``laminar`` commands."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns, two spaces apart; the first row is the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )
