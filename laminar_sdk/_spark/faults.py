"""A test hook that kills a Spark pipeline at a chosen step of the epoch protocol.

Set :data:`CRASH_AT_VARIABLE` to ``STEP:EPOCH`` (a :class:`ProtocolStep` value and a batch id,
e.g. ``commit:1``) in the environment of the process that starts the Spark session — Spark's
driver JVM and its Python workers inherit it. When the commit of that micro-batch reaches the
step, the worker SIGKILLs the driver JVM (found among its ancestors), then itself: the whole
pipeline stops as after ``kill -9``, with no rollback, close or Spark commit log entry (the
other Python workers exit when their connection to the JVM breaks). Restarting the query from
the same checkpoint location must then deliver every record exactly once. Linux only (the JVM
is found through ``/proc``).

:data:`KILL_WRITER_VARIABLE` kills one write task's Python worker instead, in the middle of its
write.

Both exist for the conformance kit and the SDK's own tests; nothing reads the variables unless
a laminar sink writes or commits, and a production environment never sets them.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from pathlib import Path

from laminar_sdk._coordinator import ProtocolStep, StepObserver
from laminar_sdk._errors import ConfigurationError

CRASH_AT_VARIABLE = "LAMINAR_SPARK_CRASH_AT"
"""``STEP:EPOCH``: kill the pipeline when the commit of micro-batch ``EPOCH`` reaches ``STEP``."""


KILL_WRITER_VARIABLE = "LAMINAR_SPARK_KILL_WRITER"
"""A marker file's path: the first write task to find the file absent creates it and SIGKILLs
its own Python worker in the middle of its write (a crashed executor worker, which Spark must
retry without the epoch committing anything twice)."""


def kill_writer_once(environ: Mapping[str, str] | None = None) -> None:
    """SIGKILL this Python worker if :data:`KILL_WRITER_VARIABLE` names a marker not yet made."""
    marker = (os.environ if environ is None else environ).get(KILL_WRITER_VARIABLE)
    if not marker:
        return
    try:
        descriptor = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(descriptor)
    os.kill(os.getpid(), signal.SIGKILL)


def crash_observer(environ: Mapping[str, str] | None = None) -> StepObserver | None:
    """The observer :data:`CRASH_AT_VARIABLE` asks for, or ``None`` when it is not set.

    :raises ConfigurationError: when the variable is set to something else than
        ``STEP:EPOCH``.
    """
    value = (os.environ if environ is None else environ).get(CRASH_AT_VARIABLE)
    if not value:
        return None
    step_text, _, epoch_text = value.rpartition(":")
    try:
        step, epoch = ProtocolStep(step_text), int(epoch_text)
    except ValueError:
        steps = ", ".join(step.value for step in ProtocolStep)
        raise ConfigurationError(
            f"{CRASH_AT_VARIABLE}={value!r}: expected STEP:EPOCH with STEP one of {steps}",
            key=CRASH_AT_VARIABLE,
        ) from None

    def observe(reached: ProtocolStep, reached_epoch: int) -> None:
        if reached is step and reached_epoch == epoch:
            kill_pipeline()

    return observe


def kill_pipeline() -> None:
    """SIGKILL the Spark driver JVM this Python worker descends from, then this process."""
    jvm = _java_ancestor(os.getppid())
    if jvm is not None:
        os.kill(jvm, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _java_ancestor(pid: int) -> int | None:
    while pid > 1:
        proc = Path("/proc", str(pid))
        try:
            if (proc / "comm").read_text().strip() == "java":
                return pid
            # The parent pid is the 2nd field after the parenthesised command name.
            pid = int((proc / "stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            return None
    return None
