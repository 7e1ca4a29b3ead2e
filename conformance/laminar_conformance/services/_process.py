"""What every service process started by the kit shares: errors, and dying with its parent."""

from __future__ import annotations

import ctypes
import signal
import sys

from laminar_sdk import LaminarError

_PR_SET_PDEATHSIG = 1


class ServiceError(LaminarError):
    """A test service could not be provisioned, started or stopped."""


def die_with_parent(signal_number: signal.Signals = signal.SIGKILL) -> None:
    """Ask the kernel to send ``signal_number`` to this process when its parent dies.

    Called in a service process (or between fork and exec) so that a test run killed with
    ``kill -9`` leaves no broker or server behind. Linux only; elsewhere it does nothing.
    """
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal_number)
