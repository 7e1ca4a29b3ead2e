"""Toxiproxy: a TCP proxy on loopback, with faults the kit turns on and off through its API.

The faults (latency, resets, blackholes, bandwidth) act on a connector's connections to its
system while the connector talks through the proxy.

The server is Shopify's ``toxiproxy-server``, pinned to :data:`TOXIPROXY_VERSION`: the one named
by ``LAMINAR_TOXIPROXY_SERVER``, else ``toxiproxy-server`` on ``PATH``, else one built once with
``go install`` into the cache directory (``~/.cache/laminar/toxiproxy/VERSION``). One server
runs per process, started on first use and killed with the process.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laminar_conformance.services._process import (
    ServiceError,
    cache_root,
    free_port,
    made_once,
    require_success,
    spawn,
)

TOXIPROXY_VERSION = "v2.12.0"
"""The Toxiproxy the kit builds (``@latest`` resolves to an older module path's release)."""
TOXIPROXY_SERVER_VARIABLE = "LAMINAR_TOXIPROXY_SERVER"
"""Names a ``toxiproxy-server`` binary to use instead of building one."""
_MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"
_START_PATIENCE_S = 30.0


def resolve_toxiproxy_server(*, progress: bool = True) -> Path:
    """A ``toxiproxy-server`` binary: named, on ``PATH``, or built once with Go.

    :raises ServiceError: when the named binary is missing, or none is found and Go is not
        installed or fails to build it, saying what to install.
    """
    named = os.environ.get(TOXIPROXY_SERVER_VARIABLE)
    if named:
        if not os.access(named, os.X_OK):
            raise ServiceError(
                f"{TOXIPROXY_SERVER_VARIABLE}={named!r} is not an executable file: point it at "
                f"a toxiproxy-server {TOXIPROXY_VERSION} binary, or unset it to build one with Go"
            )
        return Path(named)
    on_path = shutil.which("toxiproxy-server")
    if on_path is not None:
        return Path(on_path)
    root = cache_root() / "toxiproxy" / TOXIPROXY_VERSION
    binary = root / "toxiproxy-server"

    def build() -> None:
        go = shutil.which("go")
        if go is None:
            raise ServiceError(
                "the network-fault checks need Toxiproxy, and there is no toxiproxy-server on "
                "PATH and no `go` to build it: install Go (then the kit builds it once), or set "
                f"{TOXIPROXY_SERVER_VARIABLE} to a toxiproxy-server {TOXIPROXY_VERSION} binary"
            )
        if progress:
            print(
                f"laminar: building Toxiproxy {TOXIPROXY_VERSION} with Go into {root} "
                "(first run only)...",
                file=sys.stderr,
                flush=True,
            )
        result = subprocess.run(
            [go, "install", f"{_MODULE}@{TOXIPROXY_VERSION}"],
            env={**os.environ, "GOBIN": str(root / "bin")},
            capture_output=True,
            text=True,
            check=False,
        )
        require_success(result, f"go install of Toxiproxy {TOXIPROXY_VERSION} failed")
        (root / "bin" / "server").rename(binary)
        (root / "bin").rmdir()

    return made_once(root, binary, build)


@dataclass(frozen=True, slots=True)
class Toxic:
    """One fault of a proxy's connections, as Toxiproxy's API takes it.

    :param name: its name on the proxy.
    :param type: Toxiproxy's toxic type (``latency``, ``reset_peer``, ``timeout``,
        ``bandwidth``).
    :param stream: ``downstream`` (server to client) or ``upstream``.
    :param attributes: the type's attributes (``{"latency": 250}``).
    """

    name: str
    type: str
    stream: str
    attributes: dict[str, int]


class Proxy:
    """A proxy of one upstream address, listening on a loopback port of its own."""

    def __init__(self, server: ToxiproxyServer, name: str, listen: str, upstream: str) -> None:
        self._server = server
        self.name = name
        self.listen = listen
        """``127.0.0.1:PORT``: where clients connect instead of :attr:`upstream`."""
        self.upstream = upstream

    def add(self, toxic: Toxic) -> None:
        """Turn ``toxic`` on, for the connections open now and those opened later."""
        self._server.call(
            "POST",
            f"/proxies/{self.name}/toxics",
            {
                "name": toxic.name,
                "type": toxic.type,
                "stream": toxic.stream,
                "attributes": toxic.attributes,
            },
        )

    def clear(self) -> None:
        """Turn every toxic off; connections open now go on normally."""
        listed = self._server.call("GET", f"/proxies/{self.name}/toxics")
        for toxic in listed or ():
            self._server.call("DELETE", f"/proxies/{self.name}/toxics/{toxic['name']}")

    def cut(self) -> None:
        """Close every connection through the proxy, then accept new ones again."""
        self._server.call("POST", f"/proxies/{self.name}", {"enabled": False})
        self._server.call("POST", f"/proxies/{self.name}", {"enabled": True})

    def delete(self) -> None:
        """Stop the proxy, closing its connections."""
        self._server.call("DELETE", f"/proxies/{self.name}")


class ToxiproxyServer:
    """A running ``toxiproxy-server`` on a loopback port, driven through its HTTP API."""

    def __init__(self, binary: Path) -> None:
        self._port = free_port()
        self._log = Path(tempfile.gettempdir(), f"laminar-toxiproxy-{self._port}.log")
        with self._log.open("wb") as log:
            self._process = spawn(
                [str(binary), "-host", "127.0.0.1", "-port", str(self._port)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._names = 0
        self._lock = threading.Lock()
        deadline = time.monotonic() + _START_PATIENCE_S
        while True:
            try:
                self.call("GET", "/version")
                return
            except ServiceError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise ServiceError(
                        f"toxiproxy-server ({binary}) did not start on 127.0.0.1:{self._port} "
                        f"within {_START_PATIENCE_S:g}s: {self._log.read_text()[-2000:]}"
                    ) from None
                time.sleep(0.05)

    def call(self, method: str, path: str, body: object = None) -> Any:  # noqa: ANN401 - JSON
        """Send one API request; its JSON answer (``None`` when it has none).

        :raises ServiceError: when the server does not answer or refuses the request.
        """
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self._port}{path}", data=data, method=method
        )
        try:
            # The URL is built here: http on loopback, never a caller's scheme.
            with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
                text = answer.read()
        except urllib.error.HTTPError as error:
            raise ServiceError(
                f"Toxiproxy refused {method} {path}: {error.code} {error.read().decode()[:500]}"
            ) from None
        except OSError as error:
            raise ServiceError(f"Toxiproxy did not answer {method} {path}: {error}") from None
        return json.loads(text) if text else None

    def proxy(self, upstream: str, listen: str = "127.0.0.1:0") -> Proxy:
        """A new proxy of ``upstream`` (``host:port``) at ``listen`` (default: a free port)."""
        with self._lock:
            self._names += 1
            name = f"laminar-{os.getpid()}-{self._names}"
        made = self.call("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream})
        return Proxy(self, name, str(made["listen"]), upstream)

    def close(self) -> None:
        """Stop the server."""
        self._process.kill()
        self._process.wait()
        self._log.unlink(missing_ok=True)


_server: ToxiproxyServer | None = None
_server_lock = threading.Lock()


def toxiproxy_server() -> ToxiproxyServer:
    """This process's Toxiproxy server, started on first use and stopped at exit.

    :raises ServiceError: when no binary can be had (see :func:`resolve_toxiproxy_server`) or
        the server does not start.
    """
    global _server  # noqa: PLW0603 - one server per process
    with _server_lock:
        if _server is None:
            _server = ToxiproxyServer(resolve_toxiproxy_server())
            atexit.register(_server.close)
        return _server
