"""A real ``kill -9``: a connector's epochs run in a child process that kills itself at a point.

The in-process crashes (:class:`~laminar_sdk.SimulatedCrash`) stop the runtime where a killed
process stops, but the process lives on: the dead instance is garbage-collected, which flushes
what its open files still buffered, and its threads finish their work. A sink that returns from
``pre_commit`` while its staging sits in a Python buffer, or in a writer thread's queue, passes
them — and loses the epoch when Spark's driver really dies. So the kit also runs the first
epochs in a child process that kills itself with SIGKILL at a step after which the sink has
promised durability, or at a crash point inside a call (the only way to crash a sink in a
thread of its own); the kit then recovers and finishes the run in its own process, on new
instances, and counts the ids. A source's epochs are killed the same way at points inside its
calls (:mod:`laminar_conformance._source_runs`): the child keeps what its epochs commit on
disk, and the kit goes on from there. The children are forked from a process that imported the
kit and the plugins once (``python -m laminar_conformance._kill --zygote PLUGIN...``).

The child is given everything as data: the connector, its configuration, the extra plugin
modules to import, its state store's directory and, for a sink, the checkpoint store's
directory and each epoch's batches as Arrow IPC files. Before it kills itself it writes the
calls it made (its timeline) for the failure message.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pyarrow as pa

from laminar_conformance._faults import (
    Fault,
    FaultPlan,
    FaultPoint,
    FaultySink,
    KillNotReached,
    TraceEvent,
    with_watched_threads,
)
from laminar_conformance._source_runs import (
    Committed,
    SourceSchedule,
    read_batches,
    run_source_epochs,
    write_batches,
)
from laminar_conformance._stores import checkpoint_store, state_store
from laminar_sdk import EpochCoordinator, ProtocolStep, RetryPolicy, SourceConnector

if TYPE_CHECKING:
    from laminar_conformance.contexts import ConformancePlugins

KILL_STEPS = (ProtocolStep.COMMIT, ProtocolStep.COMMITTED_MANIFEST, ProtocolStep.DONE)
"""Where the kit kills: after ``pre_commit`` returned and the manifest decided the epoch, and
after ``commit_epoch`` returned (before and after the manifest says committed)."""

CHILD_TIMEOUT_S = 120.0
"""How long a child may take to reach its kill before the check fails."""

_NOT_REACHED = 3
"""The child's exit status when its epochs ended without reaching the kill."""


@dataclass(frozen=True, slots=True)
class Child:
    """What a child process the kit kills opens: a connector, as the kit's own run opens it.

    :param plugins: extra plugin modules, imported by name in the child.
    :param state: the directory of the connector's state store.
    """

    connector: str
    properties: dict[str, str]
    plugins: Sequence[str]
    state: Path


def kill_in_child(
    child: Child,
    *,
    store: Path,
    epochs: Sequence[Sequence[pa.RecordBatch]],
    point: FaultPoint,
    plan: FaultPlan,
) -> None:
    """Run a sink's ``epochs`` through the coordinator in a child process killed at ``point``.

    The child's calls are added to ``plan``'s trace (as sink instance 0, followed by the
    kill), and ``point`` to the faults it fired; the next instance the plan sees is 1.

    :param store: the checkpoint store's directory.
    :raises AssertionError: when the child fails, or ends without reaching ``point``, saying
        what it printed.
    """
    directory = Path(tempfile.mkdtemp(prefix="kill-", dir=store.parent))
    files = []
    for number, batches in enumerate(epochs):
        file = directory / f"epoch-{number}.arrow"
        write_batches(file, list(batches))
        files.append(str(file))
    spec: dict[str, object] = {"role": "sink", "store": str(store), "epochs": files}
    _run_killed(directory, spec, child, point, plan)


def kill_source_in_child(
    child: Child,
    *,
    schedule: SourceSchedule,
    poll_timeout_s: float,
    point: FaultPoint,
    plan: FaultPlan,
) -> Committed:
    """Read a source's epochs of ``schedule`` in a child process killed at ``point``.

    As :func:`kill_in_child`, for a source (:mod:`laminar_conformance._source_runs`).

    :returns: what the child's epochs committed before the kill.
    """
    directory = Path(tempfile.mkdtemp(prefix="kill-", dir=child.state.parent))
    spec: dict[str, object] = {
        "role": "source",
        "schedule": asdict(schedule),
        "poll_timeout_s": poll_timeout_s,
        "committed": str(directory),
    }
    _run_killed(directory, spec, child, point, plan)
    return Committed.load(directory)


def _run_killed(
    directory: Path, spec: dict[str, object], child: Child, point: FaultPoint, plan: FaultPlan
) -> None:
    """Run ``spec`` (its role's part) in a forked child killed at ``point``; see its callers."""
    trace = directory / "trace.json"
    spec_file = directory / "spec.json"
    where = point.where.value if isinstance(point.where, ProtocolStep) else point.where
    spec |= {
        "connector": child.connector,
        "properties": child.properties,
        "plugins": list(child.plugins),
        "state": str(child.state),
        "where": where,
        "fault": point.fault.value,
        "epoch": point.epoch,
        "trace": str(trace),
    }
    spec_file.write_text(json.dumps(spec), encoding="utf-8")
    zygote = _zygote(tuple(child.plugins))
    returncode = zygote.run(spec_file, timeout_s=CHILD_TIMEOUT_S)
    printed = _tail(spec_file.with_name("stderr.txt").read_text(errors="replace"))
    if returncode is None:
        raise AssertionError(
            f"the child process meant to be killed at {point} did not get there within "
            f"{CHILD_TIMEOUT_S:.0f} s (is a connector call hanging?); what it printed:\n{printed}"
        )
    if returncode == _NOT_REACHED:
        raise KillNotReached(
            f"the child process meant to be killed at {point} ended without reaching it; what "
            f"it printed:\n{printed}"
        )
    if returncode != -signal.SIGKILL:
        if returncode < 0:
            what = f"died of signal {-returncode}, which the kit did not send (a fault in C?)"
        else:
            what = f"failed with exit status {returncode}"
        raise AssertionError(
            f"the child process meant to be killed at {point} {what}; what it printed:\n{printed}"
        )
    events = json.loads(trace.read_text(encoding="utf-8"))
    plan.trace += [TraceEvent(**event) for event in events]
    plan.instance = max((event.instance for event in plan.trace), default=plan.instance)
    plan.fired.append(point)


def _tail(text: str) -> str:
    return "\n".join((text or "(nothing)").splitlines()[-30:])


class _Zygote:
    """A process that imported the kit and the plugins once, and forks a child per kill.

    Each kill then costs a fork, not an interpreter's start and the imports of pyarrow, the
    SDK and every plugin (about 1.3 s on two cores). The zygote runs no thread of its own
    (nothing it imports starts one that holds a lock across a fork: pyarrow's allocator
    registers its fork handlers), reads one spec path a line, forks, and answers
    ``pid N`` then ``exit S`` (the child's exit status, negative for a signal).
    """

    def __init__(self, plugins: tuple[str, ...]) -> None:
        environment = dict(os.environ)
        # The zygote imports what this process imports: its plugin modules may not be
        # installed.
        environment["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)
        environment["PYTHONFAULTHANDLER"] = "1"  # a child that dies of a fault says where
        self._process = subprocess.Popen(
            [sys.executable, "-m", "laminar_conformance._kill", "--zygote", *plugins],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=environment,
        )

    def run(self, spec: Path, *, timeout_s: float) -> int | None:
        """Fork a child that runs ``spec``; its exit status (``None``: killed after the timeout)."""
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        self._process.stdin.write(f"{spec}\n")
        self._process.stdin.flush()
        pid = int(self._answer("pid", timeout_s=30.0) or "")
        status = self._answer("exit", timeout_s=timeout_s)
        if status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self._answer("exit", timeout_s=30.0)
            return None
        return int(status)

    def _answer(self, kind: str, *, timeout_s: float) -> str | None:
        stdout = self._process.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], timeout_s)
        if not ready:
            if kind == "exit":
                return None
            raise AssertionError(f"the kit's fork server did not answer ({kind})")
        line = stdout.readline()
        if not line.startswith(f"{kind} "):
            raise AssertionError(
                f"the kit's fork server stopped (exit status {self._process.poll()}): "
                f"it answered {line!r}"
            )
        return line.split(" ", 1)[1].strip()

    def close(self) -> None:
        """Stop the zygote (it ends at the end of its input) and close its pipes."""
        with self._process:  # closes its answers' pipe once it has ended
            if self._process.stdin is not None:
                self._process.stdin.close()
            self._process.wait(timeout=30)


@functools.cache
def _zygote(plugins: tuple[str, ...]) -> _Zygote:
    zygote = _Zygote(plugins)
    atexit.register(zygote.close)
    return zygote


def _point(spec: dict[str, Any]) -> FaultPoint:
    """The point a child is killed at: a protocol step, or a crash point inside a call."""
    fault = Fault(spec["fault"])
    where = ProtocolStep(spec["where"]) if fault is Fault.KILL else spec["where"]
    return FaultPoint(where, fault, int(spec["epoch"]))


async def _run_child(spec: dict[str, Any], plugins: ConformancePlugins) -> None:
    trace = Path(spec["trace"])
    plan: FaultPlan

    def kill(message: str) -> NoReturn:
        del message
        events = [asdict(event) for event in plan.trace]
        trace.write_text(json.dumps(events), encoding="utf-8")
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable: SIGKILL was sent")  # pragma: no cover

    plan = FaultPlan([_point(spec)], crash=kill)
    if spec["role"] == "source":
        await _read_source(spec, plugins, plan)
    else:
        await _write_sink(spec, plugins, plan)


async def _write_sink(spec: dict[str, Any], plugins: ConformancePlugins, plan: FaultPlan) -> None:
    state = state_store(Path(spec["state"]), "sink", spec["connector"])
    opened, _ = await plugins.registry.open_sink(
        spec["connector"], spec["properties"], state_store=state
    )
    sink = FaultySink(opened, plan)
    policy = RetryPolicy(call_timeout_s=60.0, attempts=1, backoff_s=0.0)
    store = checkpoint_store(Path(spec["store"]))
    coordinator = EpochCoordinator(store, {"sink": sink}, policy=policy, observer=plan.observe)
    await coordinator.recover()
    for epoch, file in enumerate(spec["epochs"]):
        await coordinator.run_epoch(epoch, read_batches(Path(file)), {})


async def _read_source(spec: dict[str, Any], plugins: ConformancePlugins, plan: FaultPlan) -> None:
    state = state_store(Path(spec["state"]), "source", spec["connector"])

    async def open_source() -> SourceConnector:
        source, _ = await plugins.registry.open_source(
            spec["connector"], spec["properties"], state_store=state
        )
        return source

    committed = Committed(Path(spec["committed"]))
    schedule = SourceSchedule(**spec["schedule"])
    timeout_s = float(spec["poll_timeout_s"])
    await run_source_epochs(open_source, plan, schedule, committed, poll_timeout_s=timeout_s)


def _serve(plugin_names: Sequence[str]) -> int:
    """Be a zygote (see :class:`_Zygote`) until the end of standard input."""
    # Imported here: the kit's contexts load every installed plugin's module.
    from laminar_conformance.contexts import ConformancePlugins  # noqa: PLC0415

    plugins = ConformancePlugins.load([importlib.import_module(name) for name in plugin_names])
    for line in sys.stdin:
        spec_file = Path(line.strip())
        pid = os.fork()
        if pid == 0:  # the child: run the spec, with its own standard error
            with spec_file.with_name("stderr.txt").open("w") as output:
                os.dup2(output.fileno(), 1)  # the zygote's standard output is its answers
                os.dup2(output.fileno(), 2)
            try:
                spec = json.loads(spec_file.read_text(encoding="utf-8"))
                inside = Fault(spec["fault"]) is not Fault.KILL  # a point inside a call
                asyncio.run(with_watched_threads(_run_child(spec, plugins), own_threads=inside))
                print(f"every epoch committed without reaching {_point(spec)}", file=sys.stderr)
                status = _NOT_REACHED
            except BaseException:  # noqa: BLE001 - a child reports everything, then exits
                traceback.print_exc()
                status = 1
            sys.stderr.flush()
            os._exit(status)
        print(f"pid {pid}", flush=True)
        _, wait_status = os.waitpid(pid, 0)
        print(f"exit {os.waitstatus_to_exitcode(wait_status)}", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``--zygote PLUGIN...``: serve kills for a parent (see :func:`kill_in_child`)."""
    arguments = list(argv if argv is not None else sys.argv[1:])
    if arguments[:1] != ["--zygote"]:
        print("usage: python -m laminar_conformance._kill --zygote [PLUGIN ...]", file=sys.stderr)
        return 2
    return _serve(arguments[1:])


if __name__ == "__main__":
    sys.exit(main())
