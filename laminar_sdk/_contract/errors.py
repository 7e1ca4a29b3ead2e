"""One error hierarchy for everything the SDK raises.

Every error names what it is about (a connector, a config key, a plugin, a path) and says what
to do next; none ever carries a secret value. Errors raised while handling another chain it
(``raise ... from cause``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator


class LaminarError(Exception):
    """Root of every error the Laminar SDK raises."""


class ConnectorError(LaminarError):
    """A connector operation failed.

    Callers that must decide between "retry" and "give up" read :attr:`is_transient` rather
    than matching subclasses: the set of subclasses may grow.
    """

    #: Whether retrying the same operation may succeed (network blip, throttling, timeout).
    transient: bool = False

    @property
    def is_transient(self) -> bool:
        """``True`` when the operation may succeed if retried unchanged."""
        return self.transient


class ConnectionFailed(ConnectorError):
    """The external system could not be reached (network, DNS, TLS, authentication)."""

    transient = True


class ConfigurationError(ConnectorError):
    """Connector or SDK configuration is missing, malformed or contradictory.

    :param message: what is wrong and what to do about it.
    :param key: the configuration key at fault, when there is one.
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class ReadError(ConnectorError):
    """Reading from a source failed."""

    transient = True


class WriteError(ConnectorError):
    """Writing to a sink failed."""

    transient = True


class SerdeError(ConnectorError):
    """Records could not be serialized or deserialized."""


class TransactionError(ConnectorError):
    """Beginning, committing or aborting a transaction failed.

    Not transient by default: looping on broken transactional state never helps.
    """


class InvalidState(ConnectorError):
    """The connector was called in a state that does not allow the call."""

    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(f"invalid state: expected {expected}, got {actual}")
        self.expected = expected
        self.actual = actual


class SchemaMismatch(ConnectorError):
    """A batch's schema does not match the schema the connector declared."""


class Timeout(ConnectorError):
    """An operation did not finish within its time bound."""

    transient = True

    def __init__(self, message: str, *, timeout_s: float | None = None) -> None:
        super().__init__(message)
        self.timeout_s = timeout_s


class Closed(ConnectorError):
    """The connector was used after :meth:`close`."""


class Internal(ConnectorError):
    """A bug or an unexpected condition inside a connector or the SDK."""


class ConnectorIOError(ConnectorError):
    """An operating-system level I/O failure (disk, socket) below a connector."""

    transient = True


class PluginError(LaminarError):
    """A plugin could not be loaded, validated or registered.

    :param message: what went wrong and what to do.
    :param distribution: the distribution (``pip`` name) the plugin came from, when known.
    """

    def __init__(self, message: str, *, distribution: str | None = None) -> None:
        super().__init__(message)
        self.distribution = distribution


class CheckpointError(LaminarError):
    """A checkpoint could not be encoded, decoded, stored or loaded."""


_JAVA_EXCEPTION = re.compile(r"^(?:[a-z]\w*\.)+(\w*(?:Exception|Error)): (.+)$", re.MULTILINE)


def _laminar_error_names() -> Iterator[str]:
    pending: list[type[BaseException]] = [LaminarError]
    while pending:
        error = pending.pop()
        yield error.__name__
        pending += error.__subclasses__()


def failure_line(text: str) -> str:
    """The one line of a failed pipeline's report that says what went wrong.

    ``text`` is what Spark says of the failure (the Python and Java tracebacks it joins), or
    a driver's output. A connector's error reaches the driver inside a Python worker's
    traceback, itself inside a Java stack trace: the last laminar error printed in it (a
    plugin's own subclasses included) is what the user can act on, as ``SchemaMismatch: sink
    'postgres' ...``.
    Without one, the first Java exception (``IOException: mkdir of file:/... failed``), else
    the first line.
    """
    names = "|".join(sorted(set(_laminar_error_names()), key=len, reverse=True))
    laminar = re.findall(rf"^(?:[\w.]+\.)?({names}): (.+)$", text, re.MULTILINE)
    if laminar:
        name, message = laminar[-1]
        return f"{name}: {message.strip()}"
    java = _JAVA_EXCEPTION.search(text)
    if java is not None:
        return f"{java[1]}: {java[2].strip()}"
    return next((line.strip() for line in text.splitlines() if line.strip()), "(no message)")
