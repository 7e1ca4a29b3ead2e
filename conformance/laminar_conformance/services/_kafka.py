"""A real Apache Kafka broker for tests: an existing cluster, a container, or a local process.

The local launcher resolves Apache Kafka's own jars from Maven Central with ``mvn`` into a cache
directory (once), formats a KRaft log directory (a copy of one formatted once per release) and
starts one combined broker/controller node with ``java`` on free loopback ports. The broker
dies with the process that started it, even if that process is killed: it is forked from the
kit's long-lived spawner thread (see :mod:`laminar_conformance.services._process` for why a
thread, not the process, matters).
"""

from __future__ import annotations

import base64
import contextlib
import enum
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from urllib.parse import urlparse

from laminar_conformance.services._process import (
    ServiceError,
    cache_root,
    free_port,
    made_once,
    require_success,
    spawn,
    stop_process,
)

KAFKA_VERSION = "4.1.1"
"""The Apache Kafka release the local launcher runs."""

KAFKA_BOOTSTRAP_VARIABLE = "LAMINAR_KAFKA_BOOTSTRAP"
"""Set to ``host:port[,host:port]`` to test against an existing cluster instead."""
KAFKA_PROXIED_VARIABLE = "LAMINAR_KAFKA_PROXIED"
"""With :data:`KAFKA_BOOTSTRAP_VARIABLE`: ``LISTENER=ADDRESS``, a listener of the cluster
(``host:port``) that advertises ``ADDRESS``, where a proxy in front of it must listen (the
network-fault checks; :attr:`LocalKafka.proxied_listener`)."""


_SLF4J_VERSION = "1.7.36"  # the SLF4J API version Kafka's jars are built against
_STARTED_MARKER = "Kafka Server started"
_META_PROPERTIES = "meta.properties"


class ServiceProvider(enum.Enum):
    """Where a service comes from."""

    EXTERNAL = "external"
    CONTAINER = "container"
    LOCAL = "local"


@dataclass(frozen=True, slots=True)
class KafkaService:
    """A running Kafka cluster: where to connect and where it came from.

    :param bootstrap_servers: ``host:port[,host:port]`` of the brokers.
    :param provider: where the cluster came from.
    :param local: the broker process when this package started it (``LOCAL``), else ``None``.
    :param proxied: see the attribute.
    """

    bootstrap_servers: str
    provider: ServiceProvider
    local: LocalKafka | None = None
    proxied: tuple[str, str] | None = None
    """A listener that advertises another address, and that address, where a proxy in front
    of the listener must listen: every connection of a client bootstrapped there goes through
    the proxy. ``None`` when the cluster has none (a container)."""

    @property
    def restartable(self) -> bool:
        """Whether :meth:`restart` can restart the broker (only one this package started)."""
        return self.local is not None

    def restart(self, *, graceful: bool = True) -> None:
        """Stop and start the broker on the same ports and data, as a crash and recovery would.

        :param graceful: SIGTERM and wait, or (``False``) SIGKILL at once.
        :raises ServiceError: for an external cluster or a container, which this package does
            not control.
        """
        if self.local is None:
            raise ServiceError(
                f"cannot restart the Kafka from {self.provider.value}: only a broker started "
                f"by the local launcher can be restarted (unset {KAFKA_BOOTSTRAP_VARIABLE})"
            )
        self.local.restart(graceful=graceful)


_DOCKER_SOCKET = "/var/run/docker.sock"
_DOCKER_PROBE_TIMEOUT_S = 3.0


def _docker_socket_answers(environ: Mapping[str, str]) -> bool:
    """Whether the engine's Unix socket accepts a connection (``True`` for other transports).

    Probed here, with the socket closed whatever happens, because the docker client leaves
    the socket of a failed connection open (a ``ResourceWarning`` in the caller's tests).
    """
    host = environ.get("DOCKER_HOST", "").strip() or f"unix://{_DOCKER_SOCKET}"
    if not host.startswith("unix://"):
        return True  # tcp:// or ssh://: the client's own ping decides
    path = urlparse(host).path or _DOCKER_SOCKET
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(_DOCKER_PROBE_TIMEOUT_S)
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def docker_engine_available() -> bool:
    """Whether a Docker engine answers (not merely whether a ``docker`` client is installed)."""
    try:
        import docker  # noqa: PLC0415 - optional, only with testcontainers
    except ImportError:
        return False
    if not _docker_socket_answers(os.environ):
        return False
    client = None
    try:
        client = docker.from_env(timeout=int(_DOCKER_PROBE_TIMEOUT_S))
        client.ping()
    except Exception:  # noqa: BLE001 - any failure to reach the engine means "no engine"
        return False
    finally:
        if client is not None:
            client.close()
    return True


def choose_kafka_provider(
    environ: Mapping[str, str], docker_available: Callable[[], bool]
) -> ServiceProvider:
    """Decide where the Kafka for a test run comes from.

    ``LAMINAR_KAFKA_BOOTSTRAP`` names an existing cluster and wins; else a testcontainers
    ``KafkaContainer`` when a Docker engine answers; else the local launcher.
    """
    return choose_provider(KAFKA_BOOTSTRAP_VARIABLE, environ, docker_available)


def choose_provider(
    variable: str, environ: Mapping[str, str], docker_available: Callable[[], bool]
) -> ServiceProvider:
    """Where a service comes from, in the order every launcher of the kit follows.

    ``EXTERNAL`` when ``variable`` is set (not blank), else ``CONTAINER`` when a Docker engine
    answers, else ``LOCAL``.
    """
    if environ.get(variable, "").strip():
        return ServiceProvider.EXTERNAL
    if docker_available():
        return ServiceProvider.CONTAINER
    return ServiceProvider.LOCAL


@contextlib.contextmanager
def kafka_service(environ: Mapping[str, str] | None = None) -> Iterator[KafkaService]:
    """Provide a Kafka cluster for the duration of the block, and clean up after it.

    A broker started here (``provider`` ``LOCAL``) can be restarted through
    :meth:`KafkaService.restart`, from any thread.
    """
    env = os.environ if environ is None else environ
    provider = choose_kafka_provider(env, docker_engine_available)
    if provider is ServiceProvider.EXTERNAL:
        listener, _, address = env.get(KAFKA_PROXIED_VARIABLE, "").strip().partition("=")
        proxied = (listener, address) if listener and address else None
        yield KafkaService(env[KAFKA_BOOTSTRAP_VARIABLE].strip(), provider, proxied=proxied)
    elif provider is ServiceProvider.CONTAINER:
        from testcontainers.kafka import KafkaContainer  # noqa: PLC0415

        with KafkaContainer() as container:
            yield KafkaService(container.get_bootstrap_server(), provider)
    else:
        with LocalKafka() as broker:
            proxied = (broker.proxied_listener, broker.proxy_address)
            yield KafkaService(broker.bootstrap_servers, provider, broker, proxied)


_free_port = free_port  # the former private name, which some callers import


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home, "bin", "java") if java_home else None
    if candidate is not None and candidate.exists():
        return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise ServiceError(
            "cannot start Kafka: no `java` on PATH and JAVA_HOME is not set; install Java 17 "
            f"or point {KAFKA_BOOTSTRAP_VARIABLE} at an existing cluster"
        )
    return found


_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.laminar.test</groupId>
  <artifactId>resolved-jars</artifactId>
  <version>1</version>
  <dependencyManagement><dependencies>
{pinned}
  </dependencies></dependencyManagement>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""
_DEPENDENCY = """    <dependency>
      <groupId>{group}</groupId><artifactId>{artifact}</artifactId>
      <version>{version}</version>
    </dependency>"""


def resolve_maven_jars(
    coordinates: Sequence[str],
    cache_subdir: str,
    *,
    what: str,
    hint: str = "",
    pinned: Sequence[str] = (),
    progress: bool = True,
) -> Path:
    """Return a directory holding the jars of ``coordinates`` and their runtime dependencies.

    Resolution runs ``mvn dependency:copy-dependencies`` once into ``cache_subdir`` of the
    cache directory; later calls return at once. Concurrent callers wait for one another.

    :param coordinates: Maven coordinates, ``group:artifact:version`` each.
    :param cache_subdir: where under the cache directory the jars go (``kafka/4.1.1``); one
        directory per set of coordinates.
    :param what: what the jars are, for messages (``Apache Kafka 4.1.1``).
    :param hint: appended to the message when Maven is missing (another way to go on).
    :param pinned: versions forced on dependencies wherever they occur (Maven's
        ``dependencyManagement``), ``group:artifact:version`` each.
    :raises ServiceError: when Maven is missing or fails, with its output.
    :raises ValueError: when a coordinate is not ``group:artifact:version``.
    """
    if not coordinates or any(c.count(":") != 2 for c in (*coordinates, *pinned)):
        raise ValueError(
            f"Maven coordinates must be group:artifact:version, got {[*coordinates, *pinned]}"
        )
    root = cache_root() / cache_subdir
    libs = root / "libs"

    def resolve() -> None:
        mvn = shutil.which("mvn")
        if mvn is None:
            raise ServiceError(
                f"cannot resolve the jars of {what}: no `mvn` on PATH; install Maven{hint}"
            )
        (root / "pom.xml").write_text(
            _POM.format(dependencies=_dependencies(coordinates), pinned=_dependencies(pinned))
        )
        if progress:
            print(
                f"laminar: resolving the jars of {what} with Maven into {libs} (first run only)...",
                file=sys.stderr,
                flush=True,
            )
        shutil.rmtree(libs, ignore_errors=True)
        result = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                "dependency:copy-dependencies",
                f"-DoutputDirectory={libs}",
                "-DincludeScope=runtime",
            ],
            cwd=root,
            capture_output=True,
            text=True,
            check=False,
        )
        require_success(result, f"mvn failed to resolve {what}")
        (root / ".complete").touch()

    made_once(root, root / ".complete", resolve)
    return libs


def _dependencies(coordinates: Sequence[str]) -> str:
    return "\n".join(
        _DEPENDENCY.format(group=group, artifact=artifact, version=version)
        for group, artifact, version in (coordinate.split(":") for coordinate in coordinates)
    )


def resolve_kafka_jars(version: str = KAFKA_VERSION, *, progress: bool = True) -> Path:
    """Return a directory holding Apache Kafka ``version``'s jars, resolving them if needed.

    See :func:`resolve_maven_jars`; the jars go to ``kafka/VERSION`` in the cache directory.

    :raises ServiceError: when Maven is missing or fails, with its output.
    """
    return resolve_maven_jars(
        (f"org.apache.kafka:kafka_2.13:{version}", f"org.slf4j:slf4j-simple:{_SLF4J_VERSION}"),
        f"kafka/{version}",
        what=f"Apache Kafka {version}",
        hint=f", or point {KAFKA_BOOTSTRAP_VARIABLE} at an existing cluster",
        progress=progress,
    )


_WORKDIR_PREFIX = "laminar-kafka-"
_IN_USE = ".in-use"  # in a temporary work directory: locked while its launcher lives


def temporary_workdir(prefix: str) -> tuple[Path, int]:
    """A new temporary work directory named ``prefix...``, and its lock, held until closed.

    Shared by the launchers of this package (each with a prefix of its own).

    First removes the temporary work directories of launchers that died without closing (a
    killed test process): their lock is free. The lock file is locked before it takes its
    name, so no other launcher ever finds it unlocked while its owner lives.
    """
    root = Path(tempfile.gettempdir())
    remove_abandoned_workdirs(root, prefix)
    workdir = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    staged = workdir / f"{_IN_USE}.new"
    lock = os.open(staged, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    staged.rename(workdir / _IN_USE)
    return workdir, lock


def remove_abandoned_workdirs(root: Path, prefix: str) -> None:
    """Remove this user's work directories ``prefix...`` in ``root`` whose lock no one holds."""
    for workdir in root.glob(f"{prefix}*"):
        try:
            lock = os.open(workdir / _IN_USE, os.O_RDWR)
        except OSError:  # not a launcher's of this version, or another user's
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # its launcher lives
        else:
            shutil.rmtree(workdir, ignore_errors=True)
        finally:
            os.close(lock)


class LocalKafka:
    """One KRaft Kafka node (broker and controller) on free loopback ports.

    Use as a context manager, or call :meth:`start` / :meth:`stop`. :meth:`restart` stops and
    starts the same node on the same ports and data, as a broker crash and recovery would.

    :param version: the Apache Kafka release to run.
    :param workdir: where the log directory and broker log go, created when missing (default:
        a temporary directory, removed on :meth:`close`, or by the next launcher when this
        process dies first).
    :param start_timeout_s: how long :meth:`start` waits for the broker to be ready.
    """

    def __init__(
        self,
        *,
        version: str = KAFKA_VERSION,
        workdir: Path | None = None,
        start_timeout_s: float = 60.0,
    ) -> None:
        self._version = version
        self._workdir_lock: int | None = None
        if workdir is None:
            workdir, self._workdir_lock = temporary_workdir(_WORKDIR_PREFIX)
        self._workdir = workdir
        self._timeout = start_timeout_s
        self._port = free_port()
        self._controller_port = free_port()
        self._proxied_port = free_port()
        self._proxy_port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:PORT`` of the broker."""
        return f"127.0.0.1:{self._port}"

    @property
    def proxied_listener(self) -> str:
        """``127.0.0.1:PORT`` of a second listener, which advertises :attr:`proxy_address`.

        A client bootstrapped through a proxy at :attr:`proxy_address` in front of this
        listener is told to reconnect to the proxy, not to the broker: every connection it
        makes goes through the proxy (the kit's network-fault checks). The clients of
        :attr:`bootstrap_servers` never see it.
        """
        return f"127.0.0.1:{self._proxied_port}"

    @property
    def proxy_address(self) -> str:
        """Where a proxy of :attr:`proxied_listener` must listen: the address it advertises."""
        return f"127.0.0.1:{self._proxy_port}"

    @property
    def log_path(self) -> Path:
        """The broker's own log, for diagnosing a failure."""
        return self._workdir / "broker.log"

    def start(self) -> str:
        """Start the broker and wait until it accepts clients; return its bootstrap address.

        :raises ServiceError: when it does not start in time, with the end of its log.
        """
        if self._process is not None:
            return self.bootstrap_servers
        libs = resolve_kafka_jars(self._version)
        self._workdir.mkdir(parents=True, exist_ok=True)
        properties = self._workdir / "server.properties"
        data = self._workdir / "data"
        ports = _Ports(self._port, self._controller_port, self._proxied_port, self._proxy_port)
        _write_properties(properties, data, ports)
        if not (data / _META_PROPERTIES).is_file():  # a restart, or a work directory reused
            _format_log_directory(data, libs, _formatted_log_directory(self._version))
        with self.log_path.open("ab") as log:
            started_from = log.tell()
            # From the spawner thread: the broker dies with this process, not with the thread
            # that happens to call start() (PR_SET_PDEATHSIG watches the forking thread).
            self._process = spawn(
                _java_command(libs, "kafka.Kafka", str(properties)),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait_until_started(started_from)
        return self.bootstrap_servers

    def _wait_until_started(self, log_offset: int) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                tail = self._log_tail()
                self._process = None
                raise ServiceError(f"Kafka exited while starting; its log ends:\n{tail}")
            with self.log_path.open("rb") as log:
                log.seek(log_offset)
                started = _STARTED_MARKER.encode() in log.read()
            if started:
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", self._port), timeout=1),
                ):
                    return
            time.sleep(0.2)
        self.stop()
        raise ServiceError(
            f"Kafka did not start within {self._timeout:.0f}s; its log ends:\n{self._log_tail()}"
        )

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return "(no log)"

    def stop(self, *, graceful: bool = True) -> None:
        """Stop the broker: SIGTERM and wait (or SIGKILL at once when not ``graceful``)."""
        process, self._process = self._process, None
        stop_process(process, graceful=graceful)

    def restart(self, *, graceful: bool = True) -> None:
        """Stop and start the same node: same ports, same data."""
        self.stop(graceful=graceful)
        self.start()

    def close(self) -> None:
        """Stop the broker and remove a temporary work directory."""
        self.stop()
        lock, self._workdir_lock = self._workdir_lock, None
        if lock is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            os.close(lock)

    def __enter__(self) -> LocalKafka:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _java_command(libs: Path, main_class: str, *args: str) -> list[str]:
    # The C1 compiler alone: a test broker serves little, and compiling less lets it start
    # about half a second sooner on two cores.
    options = ["-Xmx768m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
    return [_java(), *options, "-cp", f"{libs}/*", main_class, *args]


def _formatted_log_directory(version: str) -> Path:
    """Where the log directory formatted for Kafka ``version``'s brokers is kept."""
    return cache_root() / "kafka" / version / "formatted-log-dir"


def _format_log_directory(data: Path, libs: Path, template: Path) -> None:
    """Make ``data`` a formatted KRaft log directory of a new cluster (id) and directory (id).

    Formatting takes a JVM of its own, well over a second; its result differs between brokers
    only in the two ids of ``meta.properties``. So one log directory is formatted per Kafka
    release (``template``, made when missing), and each broker gets a copy with ids of its own.
    """
    if not (template / _META_PROPERTIES).is_file():
        _format_template(template, libs)
    shutil.copytree(template, data, dirs_exist_ok=True)
    meta = data / _META_PROPERTIES
    ids = {"cluster.id": _cluster_id(), "directory.id": _cluster_id()}
    lines = [
        f"{key}={ids[key]}" if (key := line.partition("=")[0]) in ids else line
        for line in meta.read_text().splitlines()
    ]
    meta.write_text("\n".join(lines) + "\n")


def _format_template(template: Path, libs: Path) -> None:
    """Format a log directory with Kafka's own tool, and make it ``template`` once whole.

    Made aside and renamed into place, so a template is always whole; when another process
    made it first, its template is kept.
    """
    template.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{template.name}.", dir=template.parent) as aside:
        properties, data = Path(aside, "server.properties"), Path(aside, "data")
        # Ports are written, never bound: formatting starts no listener.
        ports = _Ports(free_port(), free_port(), free_port(), free_port())
        _write_properties(properties, data, ports)
        result = subprocess.run(
            _java_command(
                libs,
                "kafka.tools.StorageTool",
                "format",
                f"--cluster-id={_cluster_id()}",
                f"--config={properties}",
            ),
            capture_output=True,
            text=True,
            check=False,
        )
        require_success(result, "formatting Kafka's log directory failed")
        with contextlib.suppress(OSError):  # made by another process meanwhile
            data.rename(template)


@dataclass(frozen=True, slots=True)
class _Ports:
    """The broker's listeners: clients', the controller's, the one behind a proxy, the proxy's."""

    client: int
    controller: int
    proxied: int
    proxy: int


def _write_properties(path: Path, data: Path, ports: _Ports) -> None:
    """Write a one-node KRaft configuration to ``path``: its log directory ``data``."""
    client, proxied = f"127.0.0.1:{ports.client}", f"127.0.0.1:{ports.proxied}"
    controller = f"127.0.0.1:{ports.controller}"
    path.write_text(
        "\n".join(
            [
                "process.roles=broker,controller",
                "node.id=1",
                f"controller.quorum.voters=1@{controller}",
                f"listeners=PLAINTEXT://{client},PROXIED://{proxied},CONTROLLER://{controller}",
                f"advertised.listeners=PLAINTEXT://{client},PROXIED://127.0.0.1:{ports.proxy}",
                "controller.listener.names=CONTROLLER",
                "listener.security.protocol.map="
                "PLAINTEXT:PLAINTEXT,PROXIED:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "inter.broker.listener.name=PLAINTEXT",
                f"log.dirs={data}",
                "num.partitions=1",
                "offsets.topic.replication.factor=1",
                "offsets.topic.num.partitions=4",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1",
                "transaction.state.log.num.partitions=4",
                "group.initial.rebalance.delay.ms=0",
                "auto.create.topics.enable=false",
                "",
            ]
        )
    )


def _cluster_id() -> str:
    # Kafka cluster ids are 16 random bytes, URL-safe base64 without padding (22 characters).
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
