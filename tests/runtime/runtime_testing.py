"""What the runtime's tests share: a crash at one step of one epoch."""

from __future__ import annotations

from laminar_sdk import ProtocolStep
from laminar_sdk.faults import SimulatedCrash


class CrashAt:
    """An observer that stops the run like ``kill -9`` the first time ``step`` is reached in
    ``epoch``."""

    def __init__(self, step: ProtocolStep, epoch: int) -> None:
        self.step, self.epoch, self.fired = step, epoch, False

    def __call__(self, step: ProtocolStep, epoch: int) -> None:
        if not self.fired and (step, epoch) == (self.step, self.epoch):
            self.fired = True
            raise SimulatedCrash(f"{step.value} of epoch {epoch}")
