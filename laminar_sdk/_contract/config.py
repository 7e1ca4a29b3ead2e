"""Connector configuration: typed keys, validation and redaction of secrets."""

from __future__ import annotations

import difflib
import enum
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar, overload

from laminar_sdk._contract.errors import ConfigurationError
from laminar_sdk._contract.state import StateStore

T = TypeVar("T")

REDACTED = "***"
"""What a secret value is rendered as, everywhere."""

# Keys whose values are secrets even when no spec declares them so: a plugin that forgets to
# mark its password key must still not leak it through a repr or a log line.
_SECRET_KEY_PATTERN = re.compile(
    r"(password|passwd|secret|token|credential|private[._-]?key|api[._-]?key|access[._-]?key"
    r"|sasl\.jaas)",
    re.IGNORECASE,
)

_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def parse_bool(text: str) -> bool:
    """Parse ``true/false``, ``1/0``, ``yes/no``, ``on/off`` (any case).

    :raises ValueError: for anything else.
    """
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"not a boolean: use one of {sorted(_TRUE | _FALSE)}")


_BYTE_SIZE = re.compile(r"(\d+)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
_BINARY_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_byte_size(text: str) -> int:
    """Parse a byte count with an optional binary unit: ``268435456``, ``256m``, ``1 GiB``.

    Units are powers of 1024 — ``k``, ``m``, ``g``, ``t`` (any case) — optionally followed
    by ``b`` or ``ib``.

    :raises ValueError: for anything else.
    """
    found = _BYTE_SIZE.fullmatch(text.strip())
    if found is None:
        raise ValueError(f"not a size in bytes: {text!r}; write a number, or one like 64m or 1g")
    return int(found[1]) * _BINARY_UNITS[found[2].lower()]


_PARSERS: dict[type, Callable[[str], object]] = {
    str: str,
    int: int,
    float: float,
    bool: parse_bool,
}


class PathKind(enum.Enum):
    """Marks a configuration key whose value is a local file or directory, and what it needs.

    Give it as :attr:`ConfigKeySpec.path`. In a pipeline file (``laminar run``), a relative
    value of such a key resolves against the pipeline file's directory, as
    ``checkpoint_location`` does, and the connector receives the absolute path; a value that
    is a URI (``s3://...``; ``file://`` URIs are local) is passed unchanged.
    """

    MUST_EXIST = "must exist"
    """The file or directory must be there before the pipeline starts (what a source reads,
    a database file): ``laminar run`` and ``laminar run --check`` fail, naming the key and the
    resolved path, when it is not."""

    MAY_CREATE = "may be created"
    """The connector creates the file or directory when it is missing (what a sink writes)."""


@dataclass(frozen=True, slots=True)
class ConfigKeySpec:
    """One configuration key a connector accepts.

    :param name: the key, as the user writes it (``bootstrap.servers``).
    :param required: whether the key must be given.
    :param default: the value used when the key is not given (as text, like user input).
    :param secret: whether the value must never be shown; it is rendered as ``***``.
    :param description: one line for ``laminar plugins show``.
    :param value_type: ``str``, ``int``, ``float`` or ``bool``; the value must parse as one.
    :param path: marks a key whose value is a local file or directory (a ``str`` key):
        :attr:`PathKind.MUST_EXIST` or :attr:`PathKind.MAY_CREATE`. Pipeline files resolve
        its relative values against their own directory, and check that a ``MUST_EXIST``
        path exists before Spark starts (see :class:`PathKind`). ``None``: not a path; its
        value is passed as written.
    :param check: what else a value must be, beyond its type: given the value, returns what
        is wrong with it (a phrase; the error names the connector and the key before it), or
        ``None``. It runs wherever the configuration is validated — the Spark bridge before a
        query starts, ``laminar run --check``, :meth:`ConnectorConfig.validate` — so it must
        contact nothing, and must not repeat the value when it may hold a secret.
    """

    name: str
    required: bool = False
    default: str | None = None
    secret: bool = False
    description: str = ""
    value_type: type = str
    path: PathKind | None = None
    check: Callable[[str], str | None] | None = None

    def __post_init__(self) -> None:
        if self.value_type not in _PARSERS:
            raise TypeError(
                f"ConfigKeySpec {self.name!r}: value_type must be one of "
                f"{', '.join(t.__name__ for t in _PARSERS)}, got {self.value_type!r}"
            )
        if self.required and self.default is not None:
            raise TypeError(f"ConfigKeySpec {self.name!r}: a required key cannot have a default")
        if self.path is not None and not isinstance(self.path, PathKind):
            raise TypeError(
                f"ConfigKeySpec {self.name!r}: path must be PathKind.MUST_EXIST, "
                f"PathKind.MAY_CREATE or None, got {self.path!r}"
            )
        if self.path is not None and self.value_type is not str:
            raise TypeError(
                f"ConfigKeySpec {self.name!r}: a path key holds text (value_type str), "
                f"not {self.value_type.__name__}"
            )


def is_secret_key(key: str) -> bool:
    """Whether a key's name marks its value as a secret even without a spec saying so."""
    return _SECRET_KEY_PATTERN.search(key) is not None


# Passwords inside connection strings, in the forms drivers accept: a libpq-style keyword
# (``password=pw``, ``PASSWORD = 'p w'``, quoted with backslash escapes), the password of a
# URI's user information (``scheme://user:pw@host``) and a URI query parameter
# (``?password=pw``, ``&password=pw``). Group 2 of each is the secret.
_CONNECTION_STRING_SECRETS = (
    re.compile(r"((?:^|[\s;])password\s*=\s*)('(?:\\.|[^'\\])*'?|[^\s;]*)", re.IGNORECASE),
    re.compile(
        r"(\b[a-z][a-z0-9+.-]*://[^/?#@\s:]*:)([^/?#\s]*)(?=@[^@/?#\s]*(?:[/?#\s]|$))",
        re.IGNORECASE,
    ),
    re.compile(r"([?&]password=)([^&#\s]*)", re.IGNORECASE),
)


def redact_secrets(text: str) -> str:
    """``text`` with every password a connection string in it holds replaced by ``***``.

    The SDK's one rule for secrets inside values: :meth:`ConnectorConfig.redacted` (and so
    ``repr``, ``str``, ``laminar run --check`` and errors that show a configuration) applies
    it to every value that is not a secret as a whole. It finds a libpq-style keyword
    (``password=pw``, ``PASSWORD = 'p w'``, ``...;Password=pw`` as in ODBC strings), the
    password in a URI (``postgresql://user:pw@host/db``) and a URI query parameter
    (``?password=pw``), in any case. A connector that must refuse a password in a value (so
    that it comes from a secret key instead) can test ``redact_secrets(value) != value``.
    """
    for pattern in _CONNECTION_STRING_SECRETS:
        text = pattern.sub(lambda match: match[1] + REDACTED, text)
    return text


class ConnectorConfig:
    """A connector's configuration: string keys to string values, read-only.

    Secrets (keys declared ``secret=True`` and keys whose names look like secrets, such as
    ``sasl.password``) never appear in ``repr``, ``str``, logs, error messages or
    :meth:`redacted`; read them only with :meth:`require` / :meth:`get`.

    It is deliberately not a ``Mapping``: ``dict(config)`` or ``json.dumps`` would carry the
    secrets along. Pickling keeps them (a Spark executor needs them to connect), so a pickled
    configuration is never written anywhere durable.

    :param connector_type: the connector name the configuration is for, used in messages.
    :param properties: the keys and values, as the user gave them.
    :param secret_keys: keys to treat as secret besides those recognised by name.
    :param state_store: durable storage the runtime gives the connector (see
        :attr:`state_store`).
    """

    __slots__ = ("_connector_type", "_properties", "_secret_keys", "_state_store")

    def __init__(
        self,
        connector_type: str,
        properties: Mapping[str, str] | None = None,
        *,
        secret_keys: Iterable[str] = (),
        state_store: StateStore | None = None,
    ) -> None:
        # Checked at run time too: configurations arrive from TOML files and Spark options.
        given: Iterable[tuple[object, object]] = (properties or {}).items()
        props: dict[str, str] = {}
        for key, value in given:
            if not isinstance(key, str) or not isinstance(value, str):
                shown = REDACTED if isinstance(key, str) and is_secret_key(key) else repr(value)
                raise ConfigurationError(
                    f"{connector_type}: config {key!r} must be a string, got {shown} "
                    f"({type(value).__name__}); pass every value as text",
                    key=str(key),
                )
            props[key] = value
        self._connector_type = connector_type
        self._properties = props
        self._secret_keys = frozenset(secret_keys) | {k for k in props if is_secret_key(k)}
        self._state_store = state_store

    def __reduce__(self) -> tuple[object, ...]:
        # The state store stays behind: the runtime gives each process the store it has there.
        return (_unpickled, (self._connector_type, self._properties, self._secret_keys))

    @property
    def state_store(self) -> StateStore | None:
        """Durable storage of this connector's own, where the runtime keeps its checkpoints.

        ``None`` when the runtime has no checkpoint location to offer (then keep what must
        survive a crash where a setting of yours says). See :class:`StateStore`.
        """
        return self._state_store

    def with_state_store(self, state_store: StateStore | None) -> ConnectorConfig:
        """A copy of this configuration carrying ``state_store``."""
        return ConnectorConfig(
            self._connector_type,
            self._properties,
            secret_keys=self._secret_keys,
            state_store=state_store,
        )

    @property
    def connector_type(self) -> str:
        """The connector this configuration is for."""
        return self._connector_type

    @property
    def properties(self) -> dict[str, str]:
        """A copy of every key and value, secrets included: never log it."""
        return dict(self._properties)

    def is_secret(self, key: str) -> bool:
        """Whether ``key``'s value is a secret."""
        return key in self._secret_keys or is_secret_key(key)

    def keys(self) -> list[str]:
        """The keys that are set, sorted."""
        return sorted(self._properties)

    def __contains__(self, key: object) -> bool:
        return key in self._properties

    def __len__(self) -> int:
        return len(self._properties)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ConnectorConfig):
            return NotImplemented
        return (
            self._connector_type == other._connector_type and self._properties == other._properties
        )

    # Compared by value; not hashable, so a config is never used as a cache key by mistake.
    __hash__ = None  # type: ignore[assignment]

    # Reading ----------------------------------------------------------------------------

    def require(self, key: str) -> str:
        """The value of a key that must be present.

        :raises ConfigurationError: naming the key when it is missing.
        """
        try:
            return self._properties[key]
        except KeyError:
            raise ConfigurationError(
                f"{self._connector_type}: missing required config key {key!r}; "
                f"set it with .option({key!r}, ...) or in the pipeline file",
                key=key,
            ) from None

    @overload
    def get(self, key: str, default: None = None) -> str | None: ...

    @overload
    def get(self, key: str, default: str) -> str: ...

    def get(self, key: str, default: str | None = None) -> str | None:
        """The value of ``key``, or ``default`` when it is absent."""
        return self._properties.get(key, default)

    @overload
    def get_parsed(self, key: str, parse: Callable[[str], T]) -> T | None: ...

    @overload
    def get_parsed(self, key: str, parse: Callable[[str], T], default: T) -> T: ...

    def get_parsed(self, key: str, parse: Callable[[str], T], default: T | None = None) -> T | None:
        """The value of ``key`` converted by ``parse`` (``int``, ``float``, ``bool``, ...).

        ``bool`` is read with :func:`parse_bool` (``"false"`` is false). Returns ``default``
        when the key is absent.

        :raises ConfigurationError: naming the key when the value does not parse; a secret
            value is not shown.
        """
        text = self._properties.get(key)
        if text is None:
            return default
        parser: Callable[[str], object] = parse_bool if parse is bool else parse
        try:
            return parser(text)  # type: ignore[return-value]
        except (ValueError, TypeError) as error:
            shown = REDACTED if self.is_secret(key) else repr(text)
            type_name = getattr(parse, "__name__", repr(parse))
            raise ConfigurationError(
                f"{self._connector_type}: config key {key!r} must be {type_name}, got {shown}",
                key=key,
            ) from error

    def properties_with_prefix(self, prefix: str) -> dict[str, str]:
        """Keys that start with ``prefix``, with the prefix removed.

        ``properties_with_prefix("kafka.")`` turns ``kafka.acks=all`` into ``{"acks": "all"}``
        — the usual way to pass settings through to a client library.
        """
        return {
            key[len(prefix) :]: value
            for key, value in self._properties.items()
            if key.startswith(prefix)
        }

    # Validation -------------------------------------------------------------------------

    def validate(
        self, specs: Iterable[ConfigKeySpec], *, allow_prefixes: Iterable[str] = ()
    ) -> ConnectorConfig:
        """Check this configuration against declared keys and fill in defaults.

        A key not declared is an error (with the closest declared key suggested), unless it
        starts with one of ``allow_prefixes`` (pass-through settings such as ``kafka.``).

        :returns: a new configuration with defaults applied and declared secrets marked.
        :raises ConfigurationError: for the first missing, unknown or mistyped key, or one
            whose :attr:`ConfigKeySpec.check` fails, naming it.
        """
        by_name = {spec.name: spec for spec in specs}
        prefixes = tuple(allow_prefixes)
        for key in sorted(self._properties):
            if key in by_name or key.startswith(prefixes):
                continue
            close = difflib.get_close_matches(key, list(by_name), n=1)
            hint = (
                f"did you mean {close[0]!r}?"
                if close
                else (f"accepted keys: {', '.join(sorted(by_name)) or 'none'}")
            )
            raise ConfigurationError(
                f"{self._connector_type}: unknown config key {key!r}; {hint}", key=key
            )
        values = dict(self._properties)
        for spec in by_name.values():
            if spec.name not in values:
                if spec.required:
                    detail = f" ({spec.description})" if spec.description else ""
                    raise ConfigurationError(
                        f"{self._connector_type}: missing required config key "
                        f"{spec.name!r}{detail}",
                        key=spec.name,
                    )
                if spec.default is not None:
                    values[spec.name] = spec.default
        validated = ConnectorConfig(
            self._connector_type,
            values,
            secret_keys=self._secret_keys | {s.name for s in by_name.values() if s.secret},
            state_store=self._state_store,
        )
        for spec in by_name.values():
            if spec.name in values and spec.value_type is not str:
                validated.get_parsed(spec.name, spec.value_type)
            problem = spec.check(values[spec.name]) if spec.check and spec.name in values else None
            if problem:
                raise ConfigurationError(
                    f"{self._connector_type}: {spec.name}: {problem}", key=spec.name
                )
        return validated

    # Rendering --------------------------------------------------------------------------

    def redacted(self) -> dict[str, str]:
        """Every key, with each secret value replaced by ``***``: safe to log or persist.

        A password inside another value (a connection string's) is replaced too: see
        :func:`redact_secrets`.
        """
        return {
            key: REDACTED if self.is_secret(key) else redact_secrets(value)
            for key, value in sorted(self._properties.items())
        }

    def __repr__(self) -> str:
        return f"ConnectorConfig({self._connector_type!r}, {self.redacted()!r})"

    def __str__(self) -> str:
        body = ", ".join(f"{key}={value}" for key, value in self.redacted().items())
        return f"{self._connector_type}({body})"


def _unpickled(
    connector_type: str, properties: Mapping[str, str], secret_keys: Iterable[str]
) -> ConnectorConfig:
    return ConnectorConfig(connector_type, properties, secret_keys=secret_keys)
