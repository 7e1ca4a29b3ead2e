"""The one place where the Spark bridge lets the crash hooks of :mod:`laminar_sdk.faults` in.

Test kits kill pipelines at chosen points by setting variables in the environment of the
process that starts Spark (:data:`~laminar_sdk.faults.CRASH_AT_VARIABLE`,
:data:`~laminar_sdk.faults.KILL_WRITER_VARIABLE`,
:data:`~laminar_sdk.faults.KILL_EPOCH_WRITER_VARIABLE`). The bridge asks this module, and only
this one, at four places: when it opens a connector (which may be wrapped), when it builds an
epoch coordinator (which may be observed; in the epoch writer, also killed), when a write task
starts (which may kill its worker after a batch) and when it explains a lost driver. Each looks
its variable up and returns at once when it is not set, as in production: no fault code runs
then, and :mod:`laminar_sdk.faults` is not even imported (it is imported, once, by the first
question a variable asks for).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from laminar_sdk._contract.connector import SinkConnector, SourceConnector
from laminar_sdk._contract.crash_points import (
    CRASH_AT_VARIABLE,
    CRASH_RECORD_VARIABLE,
    KILL_EPOCH_WRITER_VARIABLE,
    KILL_WRITER_VARIABLE,
)
from laminar_sdk._contract.errors import ConfigurationError
from laminar_sdk._runtime.coordinator import ProtocolStep, StepObserver


def _faults_asked_for(variable: str) -> ModuleType | None:
    """:mod:`laminar_sdk.faults` when ``variable`` is set, else ``None`` (and nothing imported)."""
    if not os.environ.get(variable):
        return None
    from laminar_sdk import faults  # noqa: PLC0415 - only where a test asks for a fault

    return faults


def opened_source(source: SourceConnector) -> SourceConnector:
    """The source the bridge opened, or a wrapper that kills during its reads (``source-read``)."""
    faults = _faults_asked_for(CRASH_AT_VARIABLE)
    return source if faults is None else faults.watched_source(source)


def opened_sink(sink: SinkConnector) -> SinkConnector:
    """The sink the bridge opened, or a wrapper that kills inside ``pre_commit`` / ``stage``."""
    faults = _faults_asked_for(CRASH_AT_VARIABLE)
    return sink if faults is None else faults.watched_sink(sink)


def coordinator_observer() -> StepObserver | None:
    """The observer that kills at a step of the epoch protocol; ``None`` when none is asked for."""
    faults = _faults_asked_for(CRASH_AT_VARIABLE)
    return None if faults is None else faults.crash_observer()


def epoch_writer_observer() -> StepObserver | None:
    """The epoch writer's observer: the crash hook's, and the writer's own kill if asked for."""
    observers = [
        observer
        for observer in (coordinator_observer(), _epoch_writer_killer())
        if observer is not None
    ]
    if len(observers) < 2:
        return next(iter(observers), None)

    def observe(step: ProtocolStep, epoch: int) -> None:
        for observer in observers:
            observer(step, epoch)

    return observe


def _epoch_writer_killer() -> StepObserver | None:
    faults = _faults_asked_for(KILL_EPOCH_WRITER_VARIABLE)
    return None if faults is None else faults.epoch_writer_killer()


def after_each_batch() -> Callable[[], None] | None:
    """What a write task calls after each batch it takes (a kill of its worker), or ``None``."""
    faults = _faults_asked_for(KILL_WRITER_VARIABLE)
    return None if faults is None else faults.kill_writer_once


def deliberate_kill(cause: str) -> str | None:
    """Why the driver is gone when a crash point asked for it, or ``None`` when none did.

    :param cause: the error that showed the driver gone, in words.
    """
    faults = _faults_asked_for(CRASH_AT_VARIABLE)
    if faults is None:
        return None
    try:
        point = faults.configured_crash_point()
    except ConfigurationError:
        return None
    if point is None:
        return None
    record = os.environ.get(CRASH_RECORD_VARIABLE)
    certainty = "" if record and faults.crash_recorded(point, Path(record)) else "most likely "
    return (
        f"{CRASH_AT_VARIABLE}={point} is set, so this is {certainty}the deliberate kill "
        f"it asks for: the crash hook SIGKILLs Spark's driver (its JVM) at crash point "
        f"{point.step.number} ({point.step.value!r}) of epoch {point.epoch} {cause}"
    )
