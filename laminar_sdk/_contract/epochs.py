"""Which epoch a sink instance has open, and which of the runtime's calls its phase allows.

Every exactly-once sink answers the same sequence of calls — ``begin_epoch``, ``write_batch``
(any number), ``pre_commit``, then ``commit_epoch`` or ``rollback_epoch``, and ``close`` at
any point — and must refuse the calls that break it, skip an epoch delivered again after it
was committed, and commit an epoch another instance pre-committed. :class:`EpochTracker` is
that state machine, written once: a sink asks it at the top of each call what the call may
do, and keeps only its storage calls for itself.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Generic, TypeVar

from laminar_sdk._contract.errors import InvalidState

HeldT = TypeVar("HeldT")


class EpochPhase(enum.Enum):
    """Where the epoch open on a sink instance stands."""

    WRITING = "being written"
    """Begun; batches may be written to it."""

    PRE_COMMITTED = "pre-committed"
    """Durable and invisible; only ``commit_epoch`` or ``rollback_epoch`` may follow."""

    SKIPPED = "skipped (committed before)"
    """Delivered again after it was committed: its batches are dropped, its commit does nothing."""

    FAILED = "failed while being written"
    """A write failed in a way that lost part of the epoch: only ``rollback_epoch`` may follow."""


@dataclass(slots=True)
class OpenEpoch(Generic[HeldT]):
    """The epoch open on a sink instance: its number, its phase and what the sink holds for it."""

    number: int
    phase: EpochPhase
    held: HeldT | None
    """What the sink keeps for the epoch (a transaction, staged files); ``None`` when skipped."""


class EpochTracker(Generic[HeldT]):
    """The epoch protocol's state machine for one sink instance.

    A sink keeps one tracker and asks it at the top of each call::

        async def begin_epoch(self, epoch):
            self._epochs.check_can_begin(epoch)      # before any I/O
            if await self._committed_before(epoch):
                self._epochs.skip(epoch)
            else:
                self._epochs.begin(epoch, await self._begin_transaction())

        async def write_batch(self, batch):
            transaction = self._epochs.writing()
            if transaction is None:                  # a skipped epoch: write nothing
                return WriteResult(0)
            ...

        async def pre_commit(self, epoch):
            transaction = self._epochs.pre_committing(epoch)
            if transaction is not None:              # None: skipped, or pre-committed already
                await transaction.prepare()
                self._epochs.pre_committed(epoch)

        async def commit_epoch(self, epoch):
            open_epoch = self._epochs.committing(epoch)  # None: pre-committed elsewhere
            ...                                          # publish, unless committed already
            self._epochs.finish(epoch)

        async def rollback_epoch(self, epoch):
            open_epoch = self._epochs.finish(epoch)  # None: not open here
            ...                                      # discard what any instance staged

        async def close(self):
            open_epoch = self._epochs.abandon()      # neither commit nor roll it back

    Each refusal is an :class:`InvalidState` naming the call expected and the state found.

    :param sink: the sink's name, for messages (``kafka sink``).
    """

    def __init__(self, sink: str) -> None:
        self._sink = sink
        self._open: OpenEpoch[HeldT] | None = None

    @property
    def open_epoch(self) -> OpenEpoch[HeldT] | None:
        """The epoch open on this instance, if any."""
        return self._open

    def check_can_begin(self, epoch: int) -> None:
        """Check that ``epoch`` may begin: no other epoch is open. Call it before any I/O.

        :raises InvalidState: when an epoch is open.
        """
        if self._open is not None:
            raise InvalidState(
                f"commit_epoch or rollback_epoch of epoch {self._open.number} first",
                f"begin_epoch({epoch}) on the {self._sink} while epoch {self._open.number} "
                f"is {self._open.phase.value}",
            )

    def begin(self, epoch: int, held: HeldT) -> HeldT:
        """Open ``epoch`` for writing, holding ``held``; returns ``held``.

        :raises InvalidState: when an epoch is open.
        """
        self.check_can_begin(epoch)
        self._open = OpenEpoch(epoch, EpochPhase.WRITING, held)
        return held

    def skip(self, epoch: int) -> None:
        """Open ``epoch`` as committed before: it is delivered again after a crash.

        Its batches are dropped (:meth:`writing` returns ``None``), its pre-commit and its
        commit have nothing to do.

        :raises InvalidState: when an epoch is open.
        """
        self.check_can_begin(epoch)
        self._open = OpenEpoch(epoch, EpochPhase.SKIPPED, None)

    def writing(self) -> HeldT | None:
        """For ``write_batch``: what the sink holds for the open epoch; ``None`` when skipped.

        :raises InvalidState: when no epoch is open, or it is pre-committed or failed.
        """
        current = self._open
        if current is None:
            raise InvalidState(
                "begin_epoch before write_batch", f"no epoch open on the {self._sink}"
            )
        if current.phase is EpochPhase.SKIPPED:
            return None
        if current.phase is not EpochPhase.WRITING:
            raise InvalidState(
                f"write_batch before pre_commit({current.number})",
                f"epoch {current.number} {current.phase.value}",
            )
        return current.held

    def pre_committing(self, epoch: int) -> HeldT | None:
        """For ``pre_commit``: what the sink holds for ``epoch``; ``None`` when nothing is to do.

        Nothing is to do for a skipped epoch, or one pre-committed already (a second
        ``pre_commit`` changes nothing). Call :meth:`pre_committed` once the epoch is durable.

        :raises InvalidState: when ``epoch`` is not the open epoch, or it failed.
        """
        current = self._require(epoch, "pre_commit")
        if current.phase is EpochPhase.FAILED:
            raise InvalidState(f"rollback_epoch({epoch})", f"epoch {epoch} {current.phase.value}")
        if current.phase is not EpochPhase.WRITING:
            return None
        return current.held

    def pre_committed(self, epoch: int) -> None:
        """Record that ``epoch`` is durable and invisible: only its commit or rollback may follow.

        :raises InvalidState: when ``epoch`` is not the open epoch.
        """
        current = self._require(epoch, "pre_commit")
        if current.phase is EpochPhase.WRITING:
            current.phase = EpochPhase.PRE_COMMITTED

    def hold_pre_committed(self, epoch: int, held: HeldT) -> HeldT:
        """Hold ``held`` for pre-committed ``epoch``, opening it here if need be; returns ``held``.

        For a commit that takes up what another instance pre-committed (its transaction
        begun again on this one), so that a commit that fails may be called again.

        :raises InvalidState: when another epoch is open, or ``epoch`` is open and was not
            pre-committed.
        """
        self.committing(epoch)
        self._open = OpenEpoch(epoch, EpochPhase.PRE_COMMITTED, held)
        return held

    def failed(self, epoch: int) -> None:
        """Record that a write lost part of ``epoch``: only its rollback may follow.

        :raises InvalidState: when ``epoch`` is not the open epoch.
        """
        current = self._require(epoch, "write_batch")
        if current.phase is not EpochPhase.SKIPPED:
            current.phase = EpochPhase.FAILED

    def committing(self, epoch: int) -> OpenEpoch[HeldT] | None:
        """For ``commit_epoch``: the open epoch if it is ``epoch``; ``None`` when none is open.

        ``None`` is the runtime committing an epoch another instance (or process) pre-committed:
        the sink finds it in its storage. A returned epoch is pre-committed or skipped. The
        epoch stays open until :meth:`finish`, so that a commit that fails may be called again.

        :raises InvalidState: when another epoch is open, or ``epoch`` is open and was not
            pre-committed.
        """
        current = self._open
        if current is None:
            return None
        if current.number != epoch:
            raise InvalidState(
                f"commit_epoch({current.number}) or rollback_epoch({current.number})",
                f"commit_epoch({epoch}) on the {self._sink} while epoch {current.number} is "
                f"{current.phase.value}",
            )
        if current.phase in (EpochPhase.WRITING, EpochPhase.FAILED):
            raise InvalidState(
                f"pre_commit({epoch}) before commit_epoch({epoch})",
                f"epoch {epoch} {current.phase.value}",
            )
        return current

    def finish(self, epoch: int) -> OpenEpoch[HeldT] | None:
        """End ``epoch`` once committed or rolled back; the epoch it was, if it was open here.

        Rolling back returns it so the sink can discard what it holds; finishing an epoch
        that is not open changes nothing (rollbacks are idempotent).
        """
        current = self._open
        if current is None or current.number != epoch:
            return None
        self._open = None
        return current

    def abandon(self) -> OpenEpoch[HeldT] | None:
        """Forget the open epoch without deciding it (``close``); the epoch it was, if any.

        A pre-committed epoch stays committable by another instance; the runtime rolls back
        any other.
        """
        current, self._open = self._open, None
        return current

    def _require(self, epoch: int, call: str) -> OpenEpoch[HeldT]:
        current = self._open
        if current is None or current.number != epoch:
            found = "no epoch" if current is None else f"epoch {current.number}"
            raise InvalidState(
                f"begin_epoch({epoch}) before {call}({epoch})", f"{found} open on the {self._sink}"
            )
        return current
