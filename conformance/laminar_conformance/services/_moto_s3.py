"""An S3-compatible server on loopback for object-store tests: moto's server mode, in a process.

:func:`moto_s3_server` starts ``python -m laminar_conformance.services._moto_s3`` on a free loopback
port, creates a bucket, yields where to connect, and stops the process when the block exits,
also when a test failed. The server dies with the process that started it.

One deliberate difference from plain ``python -m moto.server``: requests are served one at a
time. moto (5.2) checks ``If-None-Match`` / ``If-Match`` and then writes, without a lock, so
two racing conditional PUTs can both succeed — which Amazon S3 never allows. Serialising the
requests gives moto S3's atomic conditional writes, which the checkpoint store's concurrency
guarantees are built on; without it the racing-writer tests would test moto's race instead.

Needs ``pip install 'laminar-conformance[s3]'`` (moto's server extra).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from laminar_conformance.services._process import ServiceError, die_with_parent

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

_READY_PREFIX = "moto-s3 listening on port "
_START_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class S3Endpoint:
    """A running S3-compatible server and the bucket made for the caller.

    The credentials are moto's dummies: moto accepts any.
    """

    url: str
    bucket: str
    region: str = "us-east-1"
    access_key_id: str = "laminar-test"
    secret_access_key: str = "laminar-test"  # noqa: S105 - moto's dummy credential

    def location(self, prefix: str) -> str:
        """An ``s3://`` location in the bucket, under ``prefix``."""
        return f"s3://{self.bucket}/{prefix.strip('/')}"

    def checkpointer_options(self) -> dict[str, str]:
        """Options for ``open_checkpointer(location, store="object", options=...)``."""
        return {
            "endpoint": self.url,
            "region": self.region,
            "access_key_id": self.access_key_id,
            "secret_access_key": self.secret_access_key,
            "allow_http": "true",
        }


@contextlib.contextmanager
def moto_s3_server(*, bucket: str | None = None) -> Iterator[S3Endpoint]:
    """Start moto's S3 server on a free loopback port with one empty bucket; stop it after.

    :param bucket: the bucket to create (default: a fresh random name).
    :raises ServiceError: when moto is not installed or the server does not start, with its
        log.
    """
    log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in the finally below
        prefix="laminar-moto-", suffix=".log", delete=False
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "laminar_conformance.services._moto_s3",
            "--parent",
            str(os.getpid()),
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    try:
        port = _await_port(process, Path(log.name))
        endpoint = S3Endpoint(url=f"http://127.0.0.1:{port}", bucket=bucket or _bucket_name())
        # Our own loopback http:// URL, never user input.
        request = urllib.request.Request(f"{endpoint.url}/{endpoint.bucket}", method="PUT")  # noqa: S310
        with urllib.request.urlopen(request, timeout=30):  # noqa: S310
            pass
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
        log.close()
        Path(log.name).unlink(missing_ok=True)


def _bucket_name() -> str:
    return f"laminar-{uuid.uuid4().hex[:12]}"


def _await_port(process: subprocess.Popen[str], log: Path) -> int:
    assert process.stdout is not None
    deadline = time.monotonic() + _START_TIMEOUT_S
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if selector.select(timeout=0.2):
                line = process.stdout.readline()
                if line.startswith(_READY_PREFIX):
                    return int(line.removeprefix(_READY_PREFIX))
                if not line:
                    break  # the process exited
    detail = log.read_text(errors="replace")[-2000:]
    raise ServiceError(
        f"moto's S3 server did not start within {_START_TIMEOUT_S:.0f}s (exit status "
        f"{process.poll()}); is moto installed (pip install 'laminar-conformance[s3]')? "
        f"Its log:\n{detail}"
    )


def _serialized(app: WSGIApplication) -> WSGIApplication:
    """``app``, serving one request at a time (see the module docstring for why)."""
    lock = threading.Lock()

    def serve(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        with lock:
            return list(app(environ, start_response))

    return serve


def _die_with_parent(parent: int) -> None:
    die_with_parent(signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the signal was armed
        sys.exit(0)


def _serve() -> None:
    parser = argparse.ArgumentParser(description="moto's S3 server, one request at a time")
    parser.add_argument("--parent", type=int, required=True, help="exit when this pid exits")
    args = parser.parse_args()
    _die_with_parent(args.parent)

    import logging  # noqa: PLC0415 - only in the server process

    from moto.moto_server.werkzeug_app import (  # noqa: PLC0415
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server  # noqa: PLC0415

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app = _serialized(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    print(f"{_READY_PREFIX}{server.server_port}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()


if __name__ == "__main__":
    _serve()
