"""What every service process started by the kit shares: errors, and dying with its parent.

Why services are started from one long-lived thread
---------------------------------------------------
:func:`die_with_parent` uses Linux's ``PR_SET_PDEATHSIG``. Despite its name, the "parent" it
watches is the *thread* that forked the child, not the whole process: the signal is sent when
that thread exits. A broker started from a short-lived thread (``asyncio.to_thread``, a
thread-pool worker, a test's helper thread) would be killed the moment that thread finished,
while the test process goes on. :func:`spawn` therefore forks every service from one daemon
thread that lives as long as the process, so a service dies exactly when its process does
(including on ``kill -9``), whichever thread asked for it.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import fcntl
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from laminar_sdk import LaminarError

_PR_SET_PDEATHSIG = 1


class ServiceError(LaminarError):
    """A test service could not be provisioned, started or stopped."""


def require_success(result: subprocess.CompletedProcess[str], failed: str) -> None:
    """Raise :class:`ServiceError` when the tool that gave ``result`` exited non-zero.

    :param failed: what failed, as the error's first words (``"initdb failed"``); the exit
        status and the end of the tool's output follow.
    """
    if result.returncode != 0:
        raise ServiceError(
            f"{failed} (exit {result.returncode}):\n{(result.stdout + result.stderr)[-2000:]}"
        )


def die_with_parent(signal_number: signal.Signals = signal.SIGKILL) -> None:
    """Ask the kernel to send ``signal_number`` to this process when its parent thread ends.

    Called in a service process between fork and exec (``preexec_fn``) so that a test run
    killed with ``kill -9`` leaves no broker or server behind. The kernel watches the *thread*
    that forked the process, not the whole parent process: fork from a thread that lives as
    long as the process — :func:`spawn` does. Linux only; elsewhere it does nothing.
    """
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal_number)


_Request = tuple[Callable[[], Any], "concurrent.futures.Future[Any]"]
_requests: queue.SimpleQueue[_Request] = queue.SimpleQueue()
_spawner: threading.Thread | None = None
_spawner_lock = threading.Lock()


def _serve() -> None:
    while True:
        call, future = _requests.get()
        if not future.set_running_or_notify_cancel():
            continue
        try:
            future.set_result(call())
        except BaseException as error:  # noqa: BLE001 - handed to the caller, who raises it
            future.set_exception(error)


def _on_spawner_thread(call: Callable[[], Any]) -> Any:  # noqa: ANN401 - returns what call does
    global _spawner  # noqa: PLW0603 - one spawner thread per process, started on first use
    with _spawner_lock:
        if _spawner is None or not _spawner.is_alive():
            _spawner = threading.Thread(target=_serve, name="laminar-service-spawner", daemon=True)
            _spawner.start()
    if threading.current_thread() is _spawner:
        return call()
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    _requests.put((call, future))
    return future.result()


def spawn(arguments: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:  # noqa: ANN401
    """Start a service process that dies with this process (``SIGKILL``), even on ``kill -9``.

    The process is forked from one daemon thread that lives as long as this process (see the
    module documentation), with :func:`die_with_parent` between fork and exec, and in a new
    session (a signal to the caller's process group does not reach it).

    :param arguments: the command line.
    :param popen: other :class:`subprocess.Popen` arguments (``stdout``, ``env``, ``cwd``...).
    """
    process: subprocess.Popen[bytes] = _on_spawner_thread(
        lambda: subprocess.Popen(
            list(arguments),
            start_new_session=True,
            preexec_fn=die_with_parent,  # noqa: PLW1509 - only calls prctl, safe after fork
            **popen,
        )
    )
    return process


def stop_process(process: subprocess.Popen[bytes] | None, *, graceful: bool = True) -> None:
    """Stop a service process: SIGTERM and wait 30 s, then SIGKILL.

    Not ``graceful``: SIGKILL at once. A process that already ended, or ``None``, is left alone.
    """
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


CACHE_VARIABLE = "LAMINAR_CACHE_DIR"
"""Where downloaded jars, Kafka's formatted log directory and built tools are kept (default
``~/.cache/laminar``)."""


def cache_root() -> Path:
    """The kit's cache directory: ``$LAMINAR_CACHE_DIR``, else ``~/.cache/laminar``."""
    configured = os.environ.get(CACHE_VARIABLE)
    return Path(configured) if configured else Path.home() / ".cache" / "laminar"


def made_once(directory: Path, made: Path, make: Callable[[], None]) -> Path:
    """``made``, made by ``make()`` the first time any process asks for it.

    Concurrent callers (processes too) wait for one another on a lock in ``directory``; later
    ones return at once. ``make`` creates ``made`` last: its existence says the work is whole.
    """
    if made.exists():
        return made
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not made.exists():
            make()
    return made


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel's choice).

    Another process may take it before the caller binds it; services started on it fail to
    start then, with their log, rather than talk to a stranger.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
