"""The unopened → open → closed life of a connector instance, shared by the reference connectors."""

from __future__ import annotations

from typing import Generic, TypeVar

from laminar_sdk import Closed, InvalidState

StateT = TypeVar("StateT")


class Lifecycle(Generic[StateT]):
    """Whether a connector is unopened, open or closed, and what it holds while open.

    :param connector: the connector's name, for messages (``generator source``).
    """

    def __init__(self, connector: str) -> None:
        self._connector = connector
        self._state: StateT | None = None
        self._closed = False

    def open(self, state: StateT) -> None:
        """Enter the open state, holding ``state``.

        :raises Closed: after :meth:`close`.
        :raises InvalidState: when already open.
        """
        if self._closed:
            raise Closed(f"{self._connector}: open() called after close(); build a new instance")
        if self._state is not None:
            raise InvalidState("an unopened connector", f"{self._connector} already open")
        self._state = state

    @property
    def state(self) -> StateT | None:
        """What the connector holds while open; ``None`` when it is not open."""
        return self._state

    def require(self, operation: str) -> StateT:
        """What the open connector holds, for ``operation``.

        :raises Closed: after :meth:`close`.
        :raises InvalidState: before :meth:`open`.
        """
        if self._closed:
            raise Closed(f"{self._connector}: {operation}() called after close()")
        if self._state is None:
            raise InvalidState(f"open() before {operation}()", f"{self._connector} not opened yet")
        return self._state

    def close(self) -> None:
        """Enter the closed state for good; closing twice is harmless."""
        self._closed = True
        self._state = None
