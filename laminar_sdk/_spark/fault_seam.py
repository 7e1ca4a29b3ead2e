"""The one place where the Spark bridge lets the crash hooks of :mod:`laminar_sdk.faults` in.

Test kits kill pipelines at chosen points by setting variables in the environment of the
process that starts Spark (:data:`~laminar_sdk.faults.CRASH_AT_VARIABLE`,
:data:`~laminar_sdk.faults.KILL_WRITER_VARIABLE`). The bridge asks this module, and only this
one, at four places: when it opens a connector (which may be wrapped), when it builds an epoch
coordinator (which may be observed), when a write task starts (which may kill its worker after
a batch) and when it explains a lost driver. Each looks its variable up and returns at once
when it is not set, as in production: no fault code runs then.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from laminar_sdk import faults
from laminar_sdk._contract.connector import SinkConnector, SourceConnector
from laminar_sdk._contract.errors import ConfigurationError
from laminar_sdk._runtime.coordinator import StepObserver


def _crash_configured() -> bool:
    return bool(os.environ.get(faults.CRASH_AT_VARIABLE))


def opened_source(source: SourceConnector) -> SourceConnector:
    """The source the bridge opened, or a wrapper that kills during its reads (``source-read``)."""
    return faults.watched_source(source) if _crash_configured() else source


def opened_sink(sink: SinkConnector) -> SinkConnector:
    """The sink the bridge opened, or a wrapper that kills inside ``pre_commit`` / ``stage``."""
    return faults.watched_sink(sink) if _crash_configured() else sink


def coordinator_observer() -> StepObserver | None:
    """The observer that kills at a step of the epoch protocol; ``None`` when none is asked for."""
    return faults.crash_observer() if _crash_configured() else None


def after_each_batch() -> Callable[[], None] | None:
    """What a write task calls after each batch it takes (a kill of its worker), or ``None``."""
    return faults.kill_writer_once if os.environ.get(faults.KILL_WRITER_VARIABLE) else None


def deliberate_kill(cause: str) -> str | None:
    """Why the driver is gone when a crash point asked for it, or ``None`` when none did.

    :param cause: the error that showed the driver gone, in words.
    """
    if not _crash_configured():
        return None
    try:
        point = faults.configured_crash_point()
    except ConfigurationError:
        return None
    if point is None:
        return None
    record = os.environ.get(faults.CRASH_RECORD_VARIABLE)
    certainty = "" if record and faults.crash_recorded(point, Path(record)) else "most likely "
    return (
        f"{faults.CRASH_AT_VARIABLE}={point} is set, so this is {certainty}the deliberate kill "
        f"it asks for: the crash hook SIGKILLs Spark's driver (its JVM) at crash point "
        f"{point.step.number} ({point.step.value!r}) of epoch {point.epoch} {cause}"
    )
