"""The timeline of a failing case: every protocol call, the faults, and what a reader saw.

A check that runs epochs through faults keeps the calls each sink instance received
(:class:`~laminar_conformance._faults.TraceEvent`); when the case fails, the timeline goes into
the failure's message as text and into the check's report as JSON, from which the HTML report
draws it: one row per sink instance (a crash starts a new one), one box per call, coloured by
what happened there, and under it the ids lost or duplicated, by epoch.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass

from laminar_conformance._faults import TraceEvent

_BOX_WIDTH = 118
_BOX_HEIGHT = 34
_ROW_GAP = 18
_LEFT = 96
_ROWS = {
    "instance": "sink instance",
    "source": "source instance",
    "run": "run of the Spark driver",
}
_COLOURS = {"ok": "#d8ead3", "error": "#fde3b5", "crash": "#f4b6b6", "raised": "#f9d1a0"}


@dataclass(frozen=True, slots=True)
class Timeline:
    """The events of a failing case, and what a reader saw at its end.

    :param rows: what a row (an event's ``instance``) is: ``instance``, a sink instance (a
        crash starts a new one), ``source``, a source instance (one an epoch, and a new one
        after a crash), or ``run``, a run of a Spark driver (a kill ends it).
    """

    events: tuple[TraceEvent, ...]
    problems: tuple[str, ...]
    rows: str = "instance"

    def to_json(self) -> str:
        """This timeline as the JSON a report carries."""
        return json.dumps(
            {
                "events": [[e.instance, e.what, e.epoch, e.outcome] for e in self.events],
                "problems": list(self.problems),
                "rows": self.rows,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Timeline:
        """The timeline :meth:`to_json` wrote."""
        data = json.loads(text)
        events = tuple(TraceEvent(int(i), str(w), int(e), str(o)) for i, w, e, o in data["events"])
        problems = tuple(str(problem) for problem in data["problems"])
        return cls(events, problems, str(data.get("rows", "instance")))

    def text(self) -> str:
        """One line per row: its calls in order, each with what happened there."""
        lines = [f"timeline (each line one {_ROWS[self.rows]}; a crash ends it):"]
        for instance in sorted({event.instance for event in self.events}):
            calls = [
                f"{event.what}({event.epoch})"
                + ("" if event.outcome == "ok" else f" [{event.outcome}]")
                for event in self.events
                if event.instance == instance
            ]
            lines.append(f"  {self.rows} {instance}: " + " -> ".join(calls))
        lines += [f"  then a reader saw: {problem}" for problem in self.problems]
        return "\n".join(lines)

    def svg(self) -> str:
        """The timeline drawn: rows of instances, boxes of calls, faults in colour."""
        rows = sorted({event.instance for event in self.events}) or [0]
        columns: dict[int, int] = {}
        placed: list[tuple[int, int, TraceEvent]] = []
        for event in self.events:
            column = columns.get(event.instance, 0)
            columns[event.instance] = column + 1
            placed.append((rows.index(event.instance), column, event))
        width = _LEFT + max(columns.values(), default=1) * (_BOX_WIDTH + 6) + 10
        height = len(rows) * (_BOX_HEIGHT + _ROW_GAP) + 24 * len(self.problems) + 20
        parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            'font-family="monospace" font-size="11">'
        ]
        for row, instance in enumerate(rows):
            y = 10 + row * (_BOX_HEIGHT + _ROW_GAP)
            parts.append(f'<text x="4" y="{y + 21}">{self.rows} {instance}</text>')
        for row, column, event in placed:
            x = _LEFT + column * (_BOX_WIDTH + 6)
            y = 10 + row * (_BOX_HEIGHT + _ROW_GAP)
            kind = _kind(event.outcome)
            title = html.escape(_title(event, self.rows))
            parts.append(
                f'<rect x="{x}" y="{y}" width="{_BOX_WIDTH}" height="{_BOX_HEIGHT}" rx="4" '
                f'fill="{_COLOURS[kind]}" stroke="#555"><title>{title}</title></rect>'
            )
            parts.append(
                f'<text x="{x + 4}" y="{y + 14}">{html.escape(event.what[:17])}</text>'
                f'<text x="{x + 4}" y="{y + 28}">epoch {event.epoch}'
                f"{'' if kind == 'ok' else ' ' + kind.upper()}</text>"
            )
        y = len(rows) * (_BOX_HEIGHT + _ROW_GAP) + 16
        for problem in self.problems:
            parts.append(f'<text x="4" y="{y}" fill="#a00">{html.escape(problem)}</text>')
            y += 24
        parts.append("</svg>")
        return "".join(parts)


def _kind(outcome: str) -> str:
    if outcome == "ok":
        return "ok"
    if outcome.startswith("crash"):
        return "crash"
    if outcome.startswith("raised"):
        return "raised"
    return "error"


def _title(event: TraceEvent, rows: str) -> str:
    return f"{rows} {event.instance}: {event.what} of epoch {event.epoch}: {event.outcome}"
