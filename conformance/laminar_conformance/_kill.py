"""A real ``kill -9``: a sink's epochs run in a child process that SIGKILLs itself at a step.

The in-process crashes (:class:`~laminar_sdk.SimulatedCrash`) stop the runtime where a killed
process stops, but the process lives on: the dead instance is garbage-collected, which flushes
what its open files still buffered, and its threads finish their work. A sink that returns
from ``pre_commit`` while its staging sits in a Python buffer, or in a writer thread's queue,
passes them — and loses the epoch when Spark's driver really dies. So the kit also runs the
first epochs in a child process (``python -m laminar_conformance._kill SPEC``) that kills
itself with SIGKILL at a step after which the sink has promised durability; the kit then
recovers and finishes the run in its own process, on new instances, and counts the ids.

The child is given everything as data: the connector, its configuration, the extra plugin
modules to import, the checkpoint store's directory and each epoch's batches as Arrow IPC
files. Before it kills itself it writes the calls it made (its timeline) for the failure
message.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

import pyarrow as pa

from laminar_conformance._faults import Fault, FaultPlan, FaultPoint, FaultySink, TraceEvent
from laminar_conformance._stores import checkpoint_store, state_store
from laminar_sdk import EpochCoordinator, ProtocolStep, RetryPolicy

KILL_STEPS = (ProtocolStep.COMMIT, ProtocolStep.COMMITTED_MANIFEST, ProtocolStep.DONE)
"""Where the kit kills: after ``pre_commit`` returned and the manifest decided the epoch, and
after ``commit_epoch`` returned (before and after the manifest says committed)."""

CHILD_TIMEOUT_S = 120.0
"""How long a child may take to reach its kill before the check fails."""

_NOT_REACHED = 3
"""The child's exit status when its epochs ended without reaching the kill."""


def kill_in_child(
    *,
    connector: str,
    properties: dict[str, str],
    plugins: Sequence[str],
    store: Path,
    state: Path,
    epochs: Sequence[Sequence[pa.RecordBatch]],
    point: FaultPoint,
    plan: FaultPlan,
) -> None:
    """Run ``epochs`` through the coordinator in a child process killed at ``point``.

    The child's calls are added to ``plan``'s trace (as sink instance 0, followed by the
    kill), and ``point`` to the faults it fired; the next instance the plan sees is 1.

    :param plugins: extra plugin modules, imported by name in the child.
    :param store: the checkpoint store's directory.
    :param state: the directory of the sink's state store.
    :raises AssertionError: when the child fails, or ends without reaching ``point``, saying
        what it printed.
    """
    directory = Path(tempfile.mkdtemp(prefix="kill-", dir=store.parent))
    files = []
    for number, batches in enumerate(epochs):
        file = directory / f"epoch-{number}.arrow"
        schema = batches[0].schema if batches else pa.schema([])
        with pa.OSFile(str(file), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
        files.append(str(file))
    trace = directory / "trace.json"
    spec = directory / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "connector": connector,
                "properties": properties,
                "plugins": list(plugins),
                "store": str(store),
                "state": str(state),
                "epochs": files,
                "step": str(point.where.value if isinstance(point.where, ProtocolStep) else ""),
                "epoch": point.epoch,
                "trace": str(trace),
            }
        ),
        encoding="utf-8",
    )
    environment = dict(os.environ)
    # The child imports what this process imports: its plugin modules may not be installed.
    environment["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)
    try:
        child = subprocess.run(
            [sys.executable, "-m", "laminar_conformance._kill", str(spec)],
            capture_output=True,
            text=True,
            env=environment,
            timeout=CHILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise AssertionError(
            f"the child process meant to be killed at {point} did not get there within "
            f"{CHILD_TIMEOUT_S:.0f} s (is a sink call hanging?); what it printed:\n"
            f"{_tail(error.stderr)}"
        ) from None
    if child.returncode != -signal.SIGKILL:
        what = (
            "ended without reaching it"
            if child.returncode == _NOT_REACHED
            else f"failed with exit status {child.returncode}"
        )
        raise AssertionError(
            f"the child process meant to be killed at {point} {what}; what it printed:\n"
            f"{_tail(child.stderr)}"
        )
    events = json.loads(trace.read_text(encoding="utf-8"))
    plan.trace += [TraceEvent(**event) for event in events]
    plan.instance = max((event.instance for event in plan.trace), default=plan.instance)
    plan.fired.append(point)


def _tail(text: str | bytes | None) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "(nothing)").splitlines()[-30:])


async def _run_child(spec: dict[str, Any]) -> None:
    # Imported here: the kit's contexts load every installed plugin's module.
    from laminar_conformance.contexts import ConformancePlugins  # noqa: PLC0415

    plugins = ConformancePlugins.load([importlib.import_module(name) for name in spec["plugins"]])
    trace = Path(spec["trace"])
    plan: FaultPlan

    def kill(message: str) -> NoReturn:
        del message
        events = [asdict(event) for event in plan.trace]
        trace.write_text(json.dumps(events), encoding="utf-8")
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable: SIGKILL was sent")  # pragma: no cover

    point = FaultPoint(ProtocolStep(spec["step"]), Fault.KILL, int(spec["epoch"]))
    plan = FaultPlan([point], crash=kill)
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
        with pa.memory_map(file) as source:
            reader = pa.ipc.open_file(source)
            batches = [reader.get_batch(index) for index in range(reader.num_record_batches)]
        await coordinator.run_epoch(epoch, batches, {})


def main(argv: Sequence[str] | None = None) -> int:
    """Run the spec a parent wrote (see :func:`kill_in_child`); return only if not killed."""
    (spec_file,) = argv if argv is not None else sys.argv[1:]
    spec = json.loads(Path(spec_file).read_text(encoding="utf-8"))
    asyncio.run(_run_child(spec))
    print(
        f"every epoch committed without reaching step {spec['step']} of epoch {spec['epoch']}",
        file=sys.stderr,
    )
    return _NOT_REACHED


if __name__ == "__main__":
    sys.exit(main())
