"""Secrets of a connector's configuration: looked for in what it shows, kept out of the kit's.

A secret is the value of a key declared ``secret=True`` or named like one (``password``,
``token``, ``secret``, ...; the SDK's rule), at least :data:`SHORTEST_SECRET` long. The checks
of health and metrics fail a connector that shows one (:func:`secrets_shown`); and whatever
check fails, its report — the terminal, JUnit, HTML and markdown — has them replaced by
``***`` (:func:`hide_secrets`): a traceback's function arguments and the captured log records
would otherwise print them in the CI log of the plugin's author.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass

import pytest

from laminar_sdk import REDACTED, ConnectorConfig, ConnectorSpec

SHORTEST_SECRET = 6
"""Secret values shorter than this are not looked for: they would be found by chance."""


def secret_values(spec: ConnectorSpec, properties: Mapping[str, str]) -> dict[str, str]:
    """The secret values of ``properties`` (a configuration of ``spec``'s connector), by key."""
    declared = [key.name for key in spec.config_keys if key.secret]
    config = ConnectorConfig(spec.name, properties, secret_keys=declared)
    return {
        key: value
        for key, value in properties.items()
        if config.is_secret(key) and len(value) >= SHORTEST_SECRET
    }


def secrets_shown(secrets: Mapping[str, str], shown: Mapping[str, str]) -> list[str]:
    """Where a secret (key → value) is in a text of ``shown`` (where → text), naming the key."""
    return [
        f"{where} shows the value of {key!r}"
        for where, text in shown.items()
        for key, value in secrets.items()
        if value in text
    ]


def assert_no_secret_shown(role: str, secrets: Mapping[str, str], shown: Mapping[str, str]) -> None:
    """Fail, naming where and which key, when a secret is in a text of ``shown``.

    The failure never holds the value (and :func:`hide_secrets` keeps the report's traceback
    arguments from showing it).
    """
    leaks = secrets_shown(secrets, shown)
    assert not leaks, (
        f"the {role} shows a secret of its configuration: {'; '.join(leaks)}. Render a "
        "configuration with str(config) or config.redacted(), never config.properties, "
        "and keep secret values out of messages"
    )


class LogRecords(logging.Handler):
    """Every log record emitted while :func:`every_log_record` is on, formatted, by origin."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self._shown: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        where = f"log record {len(self._shown) + 1} (logger {record.name!r})"
        self._shown[where] = self.format(record)

    def shown(self) -> dict[str, str]:
        """Each record's text, by where it came from."""
        return dict(self._shown)


@contextlib.contextmanager
def every_log_record() -> Iterator[LogRecords]:
    """Collect every log record, DEBUG and up, from every logger that propagates to the root."""
    root, records = logging.getLogger(), LogRecords()
    level = root.level
    root.addHandler(records)
    root.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        root.removeHandler(records)
        root.setLevel(level)


@dataclass(frozen=True, slots=True)
class _Crash:
    """Where a failure was raised, and its message (what pytest's ``reprcrash`` offers)."""

    path: str
    lineno: int
    message: str


class _HiddenSecrets:
    """A failed check's traceback with the secrets replaced, printed as pytest prints one."""

    def __init__(self, longrepr: object, hide: Callable[[str], str]) -> None:
        self._text = hide(str(longrepr))
        crash = getattr(longrepr, "reprcrash", None)
        self.reprcrash = (
            None if crash is None else _Crash(crash.path, crash.lineno, hide(crash.message))
        )

    def toterminal(self, out: object) -> None:
        for line in self._text.splitlines():
            out.line(line)  # type: ignore[attr-defined]

    def __str__(self) -> str:
        return self._text


def hide_secrets(report: pytest.TestReport, secrets: Collection[str]) -> None:
    """Replace every secret in ``report`` (traceback, captured output and logs) by ``***``."""

    def hide(text: str) -> str:
        for secret in secrets:
            text = text.replace(secret, REDACTED)
        return text

    longrepr = report.longrepr
    if not isinstance(longrepr, tuple) and any(secret in str(longrepr) for secret in secrets):
        report.longrepr = _HiddenSecrets(longrepr, hide)  # type: ignore[assignment]
    report.sections = [(title, hide(content)) for title, content in report.sections]
