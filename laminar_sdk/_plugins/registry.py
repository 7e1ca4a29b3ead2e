"""The connector registry: which connectors exist, where they came from, how to build them."""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from laminar_sdk._contract.config import ConfigKeySpec, ConnectorConfig
from laminar_sdk._contract.connector import SinkConnector, SourceConnector
from laminar_sdk._contract.errors import ConfigurationError, LaminarError, PluginError
from laminar_sdk._contract.state import StateStore


class ConnectorRole(enum.Enum):
    """Whether a connector reads (source) or writes (sink)."""

    SOURCE = "source"
    SINK = "sink"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class ConnectorSpec:
    """A registered connector: its name, role, factory, declared config keys and origin.

    Its origin is the distribution (and version) that registered it and ``plugin``, the name
    of that distribution's ``laminar_sdk.plugins`` entry point (empty for a connector added to
    a registry directly): ``load_connector_registry(plugin=spec.plugin)`` loads only it.
    """

    name: str
    role: ConnectorRole
    factory: Callable[[], SourceConnector | SinkConnector]
    config_keys: tuple[ConfigKeySpec, ...]
    description: str
    config_prefixes: tuple[str, ...]
    distribution: str
    version: str
    plugin: str = ""

    def create(self) -> SourceConnector | SinkConnector:
        """Call the factory and check that it returned a connector of the right role.

        :raises PluginError: when the factory raises or returns something else, naming the
            connector and its distribution.
        """
        expected = SourceConnector if self.role is ConnectorRole.SOURCE else SinkConnector
        try:
            connector = self.factory()
        except Exception as error:
            raise PluginError(
                f"{self.role} connector {self.name!r} (from {self.distribution}) failed to "
                f"build: {type(error).__name__}: {error}",
                distribution=self.distribution,
            ) from error
        if not isinstance(connector, expected):
            raise PluginError(
                f"{self.role} connector {self.name!r} (from {self.distribution}): its factory "
                f"returned {type(connector).__name__}, not a {expected.__name__} subclass",
                distribution=self.distribution,
            )
        return connector

    def capability_names(self) -> tuple[str, ...]:
        """What the connector says it can do, as ``laminar plugins list`` shows it.

        A sink's declared capabilities, then ``distributed_commit`` when it offers
        :meth:`SinkConnector.as_distributed_commit`; a source's ``replay`` (or
        ``no-replay``), then ``range_readable`` when it offers
        :meth:`SourceConnector.as_range_readable`.

        :raises PluginError: when the factory fails (see :meth:`create`).
        """
        connector = self.create()
        if isinstance(connector, SinkConnector):
            names = list(connector.capabilities().names())
            if connector.as_distributed_commit() is not None:
                names.append("distributed_commit")
        else:
            names = ["replay" if connector.supports_replay() else "no-replay"]
            if connector.as_range_readable() is not None:
                names.append("range_readable")
        return tuple(names)

    def configure(self, properties: Mapping[str, str]) -> ConnectorConfig:
        """Validate ``properties`` against the declared keys and fill in defaults.

        :raises ConfigurationError: naming the first missing, unknown or mistyped key.
        """
        return ConnectorConfig(self.name, properties).validate(
            self.config_keys, allow_prefixes=self.config_prefixes
        )


class ConnectorRegistry:
    """Every connector the installed plugins registered, by role and name.

    Plugins receive it in :func:`laminar_register_connectors` and call :meth:`add_source` /
    :meth:`add_sink`; the runtime and the CLI look connectors up with :meth:`get`. Build one
    with :func:`laminar_sdk.load_connector_registry`.
    """

    def __init__(self) -> None:
        self._specs: dict[tuple[ConnectorRole, str], ConnectorSpec] = {}
        self._distribution = "<direct registration>"
        self._version = ""
        self._plugin = ""

    @contextlib.contextmanager
    def registering_for(self, distribution: str, version: str, plugin: str = "") -> Iterator[None]:
        """Attribute every connector added inside the block to ``distribution``'s ``plugin``."""
        previous = (self._distribution, self._version, self._plugin)
        self._distribution, self._version, self._plugin = distribution, version, plugin
        try:
            yield
        finally:
            self._distribution, self._version, self._plugin = previous

    def add_source(
        self,
        name: str,
        factory: Callable[[], SourceConnector],
        *,
        config_keys: Iterable[ConfigKeySpec] = (),
        description: str = "",
        config_prefixes: Iterable[str] = (),
    ) -> None:
        """Register a source connector.

        :param name: the name users pick it by (``.option("connector", name)``).
        :param factory: a callable returning a new, unopened :class:`SourceConnector`.
        :param config_keys: every key the connector accepts; any other key is an error.
        :param description: one line for ``laminar plugins list``.
        :param config_prefixes: key prefixes passed through unchecked (``kafka.``).
        :raises PluginError: when a source of that name is already registered.
        """
        self._add(
            role=ConnectorRole.SOURCE,
            name=name,
            factory=factory,
            config_keys=config_keys,
            description=description,
            config_prefixes=config_prefixes,
        )

    def add_sink(
        self,
        name: str,
        factory: Callable[[], SinkConnector],
        *,
        config_keys: Iterable[ConfigKeySpec] = (),
        description: str = "",
        config_prefixes: Iterable[str] = (),
    ) -> None:
        """Register a sink connector; the parameters are those of :meth:`add_source`."""
        self._add(
            role=ConnectorRole.SINK,
            name=name,
            factory=factory,
            config_keys=config_keys,
            description=description,
            config_prefixes=config_prefixes,
        )

    def _add(
        self,
        *,
        role: ConnectorRole,
        name: str,
        factory: Callable[[], SourceConnector | SinkConnector],
        config_keys: Iterable[ConfigKeySpec],
        description: str,
        config_prefixes: Iterable[str],
    ) -> None:
        if not name or not name.replace("-", "").replace("_", "").isalnum():
            raise PluginError(
                f"{self._distribution} registers a {role} named {name!r}: connector names are "
                "letters, digits, '-' and '_'",
                distribution=self._distribution,
            )
        if not callable(factory):
            raise PluginError(
                f"{self._distribution} registers {role} {name!r} with a factory that is not "
                f"callable ({type(factory).__name__})",
                distribution=self._distribution,
            )
        existing = self._specs.get((role, name))
        if existing is not None:
            raise PluginError(
                f"two plugins register a {role} connector named {name!r}: "
                f"{existing.distribution} and {self._distribution}; uninstall one, or leave "
                "one out with LAMINAR_DISABLE_PLUGINS",
                distribution=self._distribution,
            )
        keys = tuple(config_keys)
        names = [key.name for key in keys]
        if len(set(names)) != len(names):
            raise PluginError(
                f"{self._distribution}: {role} {name!r} declares a config key twice",
                distribution=self._distribution,
            )
        self._specs[(role, name)] = ConnectorSpec(
            name=name,
            role=role,
            factory=factory,
            config_keys=keys,
            description=description,
            config_prefixes=tuple(config_prefixes),
            distribution=self._distribution,
            version=self._version,
            plugin=self._plugin,
        )

    def __iter__(self) -> Iterator[ConnectorSpec]:
        """Every registered connector, sorted by name then role."""
        return iter(sorted(self._specs.values(), key=lambda s: (s.name, s.role.value)))

    def __len__(self) -> int:
        return len(self._specs)

    def get(self, name: str, role: ConnectorRole | None = None) -> ConnectorSpec:
        """The connector registered as ``name`` (in ``role``, when given).

        :raises ConfigurationError: when there is no such connector, listing the installed
            ones; or when ``role`` is ``None`` and ``name`` is both a source and a sink.
        """
        roles = [role] if role is not None else list(ConnectorRole)
        found = [self._specs[(r, name)] for r in roles if (r, name) in self._specs]
        if len(found) == 1:
            return found[0]
        if found:
            raise ConfigurationError(
                f"{name!r} is both a source and a sink connector: say which role with "
                f"--role source or --role sink (in Python: get({name!r}, ConnectorRole.SINK), "
                "or every_role() for both)",
                key="connector",
            )
        raise self._not_installed(name, role)

    def every_role(self, name: str) -> tuple[ConnectorSpec, ...]:
        """Every registration of ``name``: its source, its sink, or both (source first).

        :raises ConfigurationError: when there is no such connector, listing the installed ones.
        """
        found = tuple(self._specs[(r, name)] for r in ConnectorRole if (r, name) in self._specs)
        if not found:
            raise self._not_installed(name, None)
        return found

    def _not_installed(self, name: str, role: ConnectorRole | None) -> ConfigurationError:
        wanted = f"{role} connector" if role else "connector"
        installed = sorted({s.name for s in self if role is None or s.role is role})
        return ConfigurationError(
            f"no {wanted} named {name!r} is installed; installed: "
            f"{', '.join(installed) or 'none'}. Install the plugin that provides it "
            "(pip install laminar-plugin-...), then check `laminar plugins list`",
            key="connector",
        )

    def create_source(self, name: str) -> SourceConnector:
        """Build a new, unopened source connector by name."""
        connector = self.get(name, ConnectorRole.SOURCE).create()
        assert isinstance(connector, SourceConnector)  # checked by ConnectorSpec.create
        return connector

    def create_sink(self, name: str) -> SinkConnector:
        """Build a new, unopened sink connector by name."""
        connector = self.get(name, ConnectorRole.SINK).create()
        assert isinstance(connector, SinkConnector)  # checked by ConnectorSpec.create
        return connector

    async def open_source(
        self,
        name: str,
        properties: Mapping[str, str],
        *,
        state_store: StateStore | None = None,
    ) -> tuple[SourceConnector, ConnectorConfig]:
        """Build source ``name``, validate ``properties`` and open it.

        :param state_store: durable storage to give the source in its configuration.
        :returns: the opened connector and its validated configuration.
        :raises ConfigurationError: for unknown connectors and bad configuration.
        :raises PluginError: when the plugin's own code fails in its factory or ``open``.
        """
        spec = self.get(name, ConnectorRole.SOURCE)
        config = spec.configure(properties).with_state_store(state_store)
        source = self.create_source(name)
        await _open(spec, source, config)
        return source, config

    async def open_sink(
        self,
        name: str,
        properties: Mapping[str, str],
        *,
        state_store: StateStore | None = None,
    ) -> tuple[SinkConnector, ConnectorConfig]:
        """Build sink ``name``, validate ``properties`` and open it (see :meth:`open_source`)."""
        spec = self.get(name, ConnectorRole.SINK)
        config = spec.configure(properties).with_state_store(state_store)
        sink = self.create_sink(name)
        await _open(spec, sink, config)
        return sink, config


async def _open(
    spec: ConnectorSpec, connector: SourceConnector | SinkConnector, config: ConnectorConfig
) -> None:
    try:
        await connector.open(config)
    except LaminarError:
        raise
    except Exception as error:
        raise PluginError(
            f"{spec.role} connector {spec.name!r} (from {spec.distribution}) raised in open(): "
            f"{type(error).__name__}: {error}",
            distribution=spec.distribution,
        ) from error
