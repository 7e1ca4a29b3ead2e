"""The network-fault machinery: Toxiproxy found or refused, its faults on a real connection, and
the verdicts of the checks (the checks on real sinks: tests/conformance/test_broken_variants.py
and the PostgreSQL plugin's conformance run)."""

from __future__ import annotations

import asyncio
import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest
from laminar_conformance._network import (
    NETWORK_CALL_TIMEOUT_S,
    NETWORK_FAULTS,
    CallUnderFault,
    FaultWindow,
    fault_problems,
)
from laminar_conformance.services import (
    TOXIPROXY_SERVER_VARIABLE,
    Proxy,
    ServiceError,
    resolve_toxiproxy_server,
    toxiproxy_server,
)

from laminar_sdk import ConnectionFailed, ProtocolStep, TransactionError

FAULTS = {fault.name: fault for fault in NETWORK_FAULTS}


def test_a_named_server_that_is_not_executable_is_refused_naming_the_variable(
    tmp_path, monkeypatch
):
    named = tmp_path / "toxiproxy-server"
    named.write_text("not a program")
    monkeypatch.setenv(TOXIPROXY_SERVER_VARIABLE, str(named))
    with pytest.raises(ServiceError, match=TOXIPROXY_SERVER_VARIABLE):
        resolve_toxiproxy_server()


def test_without_a_server_or_go_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.delenv(TOXIPROXY_SERVER_VARIABLE, raising=False)
    monkeypatch.setenv("LAMINAR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServiceError) as caught:
        resolve_toxiproxy_server()
    assert "install Go" in str(caught.value)
    assert TOXIPROXY_SERVER_VARIABLE in str(caught.value)


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(1024):
            self.request.sendall(data)


@pytest.fixture
def echo_proxy() -> Iterator[Proxy]:
    """A real Toxiproxy proxy in front of an echo server on loopback."""
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo) as echo:
        echo.daemon_threads = True
        threading.Thread(target=echo.serve_forever, daemon=True).start()
        proxy = toxiproxy_server().proxy(f"127.0.0.1:{echo.server_address[1]}")
        yield proxy
        proxy.delete()
        echo.shutdown()


def _connect(proxy: Proxy) -> socket.socket:
    host, _, port = proxy.listen.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=2)


@pytest.mark.slow
def test_the_proxy_blackholes_resets_and_recovers_a_real_connection(echo_proxy):
    with _connect(echo_proxy) as client:
        client.sendall(b"before")
        assert client.recv(16) == b"before"
        for toxic in FAULTS["blackhole"].toxics:
            echo_proxy.add(toxic)
        client.sendall(b"lost")
        with pytest.raises(TimeoutError):
            client.recv(16)
    echo_proxy.clear()
    with _connect(echo_proxy) as client:
        client.sendall(b"after")
        assert client.recv(16) == b"after"
        echo_proxy.add(FAULTS["reset"].toxics[0])
        client.sendall(b"reset")  # the echo's answer meets the toxic
        try:
            received = client.recv(16)  # times out (TimeoutError) if the toxic does nothing
        except ConnectionResetError:
            received = b""
        assert received == b"", f"a reset connection carried {received!r}"


class _Listening:
    """What the verdicts read of a proxy: its address."""

    listen = "127.0.0.1:40123"


def _window(fault: str, *calls: CallUnderFault) -> FaultWindow:
    window = FaultWindow(_Listening(), FAULTS[fault], ProtocolStep.COMMIT, 1)  # type: ignore[arg-type]
    window.calls.extend(calls)
    return window


def test_a_call_ended_by_the_connector_naming_the_endpoint_passes():
    error = ConnectionFailed("the server at 127.0.0.1:40123 did not answer within 5s")
    assert fault_problems(_window("blackhole", CallUnderFault("commit_epoch", error))) == []


def test_a_hung_call_is_reported_as_waiting_with_no_timeout():
    window = _window("blackhole", CallUnderFault("pre_commit", ConnectionFailed("x")))
    window.hung.set()
    (problem,) = fault_problems(window)
    assert "pre_commit did not end within" in problem
    assert "with no timeout" in problem


def test_a_call_only_the_runtime_cancelled_is_reported():
    window = _window("reset", CallUnderFault("write_batch", asyncio.CancelledError()))
    (problem,) = fault_problems(window)
    assert f"only by the runtime's call timeout ({NETWORK_CALL_TIMEOUT_S:g}s)" in problem


def test_a_retried_call_must_fail_transiently_and_name_the_endpoint():
    error = TransactionError("commit failed: server closed the connection")
    problems = fault_problems(_window("reset", CallUnderFault("commit_epoch", error)))
    assert len(problems) == 2
    assert "not transient" in problems[0]
    assert "does not name the endpoint 127.0.0.1:40123" in problems[1]


def test_a_write_may_fail_non_transiently_when_it_names_the_endpoint():
    error = TransactionError("connection to 127.0.0.1:40123 lost; the epoch's transaction is gone")
    assert fault_problems(_window("reset", CallUnderFault("pre_commit", error))) == []


def test_calls_that_all_succeed_under_a_blackhole_bypass_the_proxy():
    (problem,) = fault_problems(_window("blackhole", CallUnderFault("commit_epoch", None)))
    assert "does not connect through 127.0.0.1:40123" in problem


def test_a_call_that_fails_under_latency_is_reported():
    error = ConnectionFailed("127.0.0.1:40123: timed out after 0.1 s")
    (problem,) = fault_problems(_window("latency", CallUnderFault("write_batch", error)))
    assert "a slow network is not a broken one" in problem
