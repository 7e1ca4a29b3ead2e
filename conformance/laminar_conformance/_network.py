"""Network faults between a connector and the system it talks to, through Toxiproxy.

A test context that names the address its connector connects to (``network_endpoint``) and
gives a configuration pointed elsewhere (``config_through(address)``) gets a proxy put between
the two (:mod:`laminar_conformance.services._toxiproxy`). The checks turn a fault on at a
protocol step of an epoch and off when the call under it ends: a correct connector's call
ends, within the runtime's call timeout, with its answer (latency, bandwidth) or with a
:class:`~laminar_sdk.ConnectorError` naming the address (resets, a blackhole), transient for the
calls the runtime retries; the runtime then recovers and nothing is lost or duplicated.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TypeVar

import pyarrow as pa

from laminar_conformance._skips import skip
from laminar_conformance._suite import Target
from laminar_conformance.contexts import TestContext
from laminar_conformance.services import Proxy, ServiceError, Toxic, toxiproxy_server
from laminar_sdk import (
    ConnectorConfig,
    ConnectorError,
    ForwardingSink,
    ProtocolStep,
    SinkConnector,
    WriteResult,
)

NETWORK_CALL_TIMEOUT_S = 20.0
"""The runtime's call timeout in the network checks: a connector's own network timeouts must
end a call on a silent connection sooner, with an error that names where it connects."""
PATIENCE_S = NETWORK_CALL_TIMEOUT_S + 25.0
"""From the fault on, how long the kit waits for the call under it to end before it calls the
call hung and closes the proxy's connections to free it. A hung call never ends on its own, so
the margin over :data:`NETWORK_CALL_TIMEOUT_S` only has to outlast a loaded machine's delays."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class NetworkFault:
    """One kind of fault, as the toxics that make it.

    :param name: the check's parameter (``blackhole``).
    :param happens: what the connection does, for messages.
    :param answered: whether the connector's requests are still answered (only slower): its
        calls must then succeed.
    """

    name: str
    happens: str
    toxics: tuple[Toxic, ...]
    answered: bool


NETWORK_FAULTS = (
    NetworkFault(
        "latency",
        "every answer is delayed by 250 ms",
        (Toxic("latency", "latency", "downstream", {"latency": 250, "jitter": 0}),),
        answered=True,
    ),
    NetworkFault(
        "reset",
        "every connection is reset (TCP RST), and so is every new one",
        (Toxic("reset", "reset_peer", "downstream", {"timeout": 0}),),
        answered=False,
    ),
    NetworkFault(
        "blackhole",
        "the connections stay open but carry nothing either way (a partition)",
        (
            Toxic("blackhole-down", "timeout", "downstream", {"timeout": 0}),
            Toxic("blackhole-up", "timeout", "upstream", {"timeout": 0}),
        ),
        answered=False,
    ),
    NetworkFault(
        "bandwidth",
        "both directions are cut to 16 KB/s",
        (
            Toxic("bandwidth-down", "bandwidth", "downstream", {"rate": 16}),
            Toxic("bandwidth-up", "bandwidth", "upstream", {"rate": 16}),
        ),
        answered=True,
    ),
)
RETRIED_CALLS = ("commit_epoch", "rollback_epoch")
"""The calls the runtime retries on a transient error; a failed ``write_batch`` or
``pre_commit`` fails the epoch whatever the error says (it is rolled back and written again)."""
FAULTED_STEPS = (ProtocolStep.WRITE, ProtocolStep.PRE_COMMIT, ProtocolStep.COMMIT)
"""The steps a fault may start at: before ``write_batch``, ``pre_commit``, ``commit_epoch``."""


def faulted_steps(target: Target, fault: NetworkFault) -> tuple[ProtocolStep, ...]:
    """Where ``fault`` starts in this run: every step in ``full``, one seeded step otherwise."""
    if target.profile.name == "full":
        return FAULTED_STEPS
    chooser = random.Random(f"{target.seed}:{fault.name}")  # noqa: S311 - a seeded choice
    return (chooser.choice(FAULTED_STEPS),)


def proxied_config(context: TestContext) -> tuple[Proxy, ConnectorConfig]:
    """A proxy before the context's endpoint, and the configuration that connects through it.

    The proxy listens where the context's ``network_proxy_listen`` says, if it says (a system
    that tells its clients where to reconnect, such as a Kafka broker's advertised listener),
    else on a free port.

    Skips the check (category ``network``) when the context names no endpoint, or no
    Toxiproxy can be had here (saying what to install); the context is closed then, and when
    this fails.
    """
    try:
        return _proxy_before(context)
    except BaseException:
        context.close()
        raise


def _proxy_before(context: TestContext) -> tuple[Proxy, ConnectorConfig]:
    endpoint = getattr(context, "network_endpoint", None)
    through = getattr(context, "config_through", None)
    if not callable(through):
        skip(
            "network",
            "the test context names no network_endpoint ('host:port') with a "
            "config_through(address) method, so the kit cannot put a proxy in between",
        )
    if not endpoint:
        skip(
            "network",
            "the test context's network_endpoint is None: its system has no address the kit "
            "can put a proxy before (a Kafka cluster named by LAMINAR_KAFKA_BOOTSTRAP without "
            "LAMINAR_KAFKA_PROXIED, a server on a Unix socket)",
        )
    listen = getattr(context, "network_proxy_listen", None) or "127.0.0.1:0"
    try:
        proxy = toxiproxy_server().proxy(str(endpoint), str(listen))
    except ServiceError as error:
        skip("network", str(error))
    config = through(proxy.listen)
    if not isinstance(config, ConnectorConfig):
        proxy.delete()
        raise AssertionError(
            f"the test context's config_through({proxy.listen!r}) returned {config!r}, not a "
            "laminar_sdk.ConnectorConfig"
        )
    return proxy, config


@dataclass(slots=True)
class CallUnderFault:
    """A call made while the fault was on: its name, and how it ended."""

    name: str
    error: BaseException | None


@dataclass(slots=True)
class FaultWindow:
    """A fault turned on, then off once a call met it (:meth:`watched`).

    On at ``step`` of ``epoch`` through the coordinator's observer, or by :meth:`turn_on`.

    Its :meth:`observe` is the coordinator's observer. A watchdog thread gives up on a call
    after :data:`PATIENCE_S`: it marks :attr:`hung`, turns the fault off and closes the
    proxy's connections, which frees a call blocked on them.
    """

    proxy: Proxy
    fault: NetworkFault
    step: ProtocolStep | None = None
    epoch: int = 1
    calls: list[CallUnderFault] = field(default_factory=list)
    hung: threading.Event = field(default_factory=threading.Event)
    _on: bool = False
    _done: bool = False
    _watchdog: threading.Timer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def on(self) -> bool:
        """Whether the fault is on now."""
        return self._on

    def observe(self, step: ProtocolStep, epoch: int) -> None:
        """Turn the fault on when the coordinator reaches ``step`` of ``epoch`` (once)."""
        if step is self.step and epoch == self.epoch:
            self.turn_on()

    def turn_on(self) -> None:
        """Turn the fault on (once), and start the watchdog."""
        if self._done:
            return
        for toxic in self.fault.toxics:
            self.proxy.add(toxic)
        self._on = self._done = True
        self._watchdog = threading.Timer(PATIENCE_S, self._give_up)
        self._watchdog.daemon = True
        self._watchdog.start()

    def _give_up(self) -> None:
        with self._lock:  # a call freed by the cut waits in off() until the proxy is back
            self.hung.set()
            self._turn_off()
            self.proxy.cut()

    def off(self) -> None:
        """Turn the fault off (idempotent); the proxy carries everything again on return."""
        with self._lock:
            self._turn_off()

    def _turn_off(self) -> None:
        if not self._on:
            return
        self._on = False
        if self._watchdog is not None:
            self._watchdog.cancel()
        self.proxy.clear()

    async def watched(self, name: str, call: Coroutine[object, object, T]) -> T:
        """Await ``call``; when it ran under the fault, record it.

        The fault ends after the first call that fails under it; a fault that leaves answers
        coming (latency, bandwidth) ends after the epoch's ``commit_epoch`` too. A call may
        have no network I/O to fail on (an upsert sink's ``commit_epoch``): a blackhole or
        reset then stays on into the next epoch, until a call meets it.
        """
        if not self._on:
            return await call
        try:
            result = await call
        except BaseException as error:
            self.calls.append(CallUnderFault(name, error))
            self.off()
            raise
        self.calls.append(CallUnderFault(name, None))
        if name == "commit_epoch" and self.fault.answered:
            self.off()
        return result


class WatchedSink(ForwardingSink):
    """A sink whose protocol calls go through :meth:`FaultWindow.watched`."""

    def __init__(self, sink: SinkConnector, window: FaultWindow) -> None:
        super().__init__(sink)
        self._window = window

    async def begin_epoch(self, epoch: int) -> None:
        """``begin_epoch``, watched."""
        await self._window.watched("begin_epoch", self.wrapped.begin_epoch(epoch))

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        """``write_batch``, watched."""
        return await self._window.watched("write_batch", self.wrapped.write_batch(batch))

    async def pre_commit(self, epoch: int) -> None:
        """``pre_commit``, watched."""
        await self._window.watched("pre_commit", self.wrapped.pre_commit(epoch))

    async def commit_epoch(self, epoch: int) -> None:
        """``commit_epoch``, watched."""
        await self._window.watched("commit_epoch", self.wrapped.commit_epoch(epoch))

    async def rollback_epoch(self, epoch: int) -> None:
        """``rollback_epoch``, watched."""
        await self._window.watched("rollback_epoch", self.wrapped.rollback_epoch(epoch))


def judged(window: FaultWindow, run: Callable[[], T], *, must_fail: bool = True) -> T:
    """``run()``, then what the connector did under the fault: an assertion naming it.

    A run that raises after a call hung (or otherwise failed the fault's demands) fails with
    that diagnosis rather than with the later error it caused.

    :raises AssertionError: listing :func:`fault_problems`.
    """
    try:
        result = run()
    except Exception as error:
        problems = fault_problems(window, must_fail=must_fail)
        if problems:
            raise AssertionError("; ".join(problems)) from error
        raise
    problems = fault_problems(window, must_fail=must_fail)
    assert not problems, "; ".join(problems)
    return result


def fault_problems(window: FaultWindow, *, must_fail: bool = True) -> list[str]:
    """What the connector did wrong under the fault, in words (empty: nothing).

    :param must_fail: whether a call must fail under a fault that leaves no answers (a sink
        cannot commit without its system; a source's poll may return nothing, or what it
        holds, instead).
    """
    fault, proxy = window.fault, window.proxy
    since = "" if window.step is None else f" (from {window.step.value} of epoch {window.epoch} on)"
    under = f"while {fault.happens}{since}"
    if window.hung.is_set():
        name = window.calls[-1].name if window.calls else "a call"
        return [
            f"{name} did not end within {PATIENCE_S:g}s {under}: the connector waits on "
            f"{proxy.listen} with no timeout, and blocks the runtime's own timeout "
            f"({NETWORK_CALL_TIMEOUT_S:g}s) too (blocking I/O in a coroutine, or a call that "
            "ignores its cancellation). Give every network wait a timeout (a socket timeout, "
            "a driver's timeout option) and run blocking calls off the event loop"
        ]
    if not window.calls:
        return [f"no call ran under the fault ({under}): the kit could not test it"]
    failed = [call for call in window.calls if call.error is not None]
    if fault.answered:
        return [
            f"{call.name} failed {under}, though every request was still answered: "
            f"{_described(call.error)}; a slow network is not a broken one — do not set "
            "network timeouts that tight"
            for call in failed
        ]
    if failed:
        return _error_problems(failed[0], proxy.listen, under)
    if not must_fail:
        return []
    names = ", ".join(sorted({call.name for call in window.calls}))
    return [
        f"every call to the end of the run ({names}) returned normally {under}: the connector "
        f"does not connect through {proxy.listen}, the address config_through() gave it (a "
        "Kafka broker must advertise the proxy's address; a client must not reconnect "
        "elsewhere)"
    ]


def _error_problems(call: CallUnderFault, endpoint: str, under: str) -> list[str]:
    """What is wrong with how ``call`` failed under the fault."""
    error = call.error
    if isinstance(error, asyncio.CancelledError | TimeoutError):
        return [
            f"{call.name} was ended only by the runtime's call timeout "
            f"({NETWORK_CALL_TIMEOUT_S:g}s) {under}: the connector has no timeout of its own, "
            "and where nothing bounds its call (a Spark task) it waits forever. Give every "
            "network wait a timeout shorter than the runtime's, and raise a ConnectorError "
            "naming the endpoint"
        ]
    problems = []
    if not isinstance(error, ConnectorError):
        problems.append(
            f"{call.name} raised {_described(error)} {under}: not a laminar_sdk.ConnectorError, "
            "so the runtime cannot tell whether to retry; raise ConnectionFailed (transient)"
        )
    elif call.name in RETRIED_CALLS and not error.is_transient:
        problems.append(
            f"{call.name} raised {_described(error)} {under}: not transient, so the runtime "
            f"does not retry it, though {call.name} is idempotent and a retry after the "
            "network recovers would succeed; raise laminar_sdk.ConnectionFailed (or any "
            "ConnectorError whose is_transient is True)"
        )
    host, _, port = endpoint.rpartition(":")
    if port not in str(error) or host not in str(error):
        problems.append(
            f"{call.name}'s error {under} does not name the endpoint {endpoint} (host and "
            f"port): {_described(error)}; say where the connector connects, so that whoever "
            "reads it knows which link failed"
        )
    return problems


def _described(error: BaseException | None) -> str:
    return f"{type(error).__name__}: {error}"[:500]
