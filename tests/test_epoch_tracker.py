"""The epoch protocol's state machine every sink shares (``laminar_sdk.EpochTracker``)."""

from __future__ import annotations

import pytest

from laminar_sdk import EpochPhase, EpochTracker, InvalidState


def _tracker() -> EpochTracker[list[str]]:
    return EpochTracker("test sink")


def test_an_epoch_goes_from_begin_through_pre_commit_to_commit() -> None:
    epochs = _tracker()
    held = epochs.begin(3, ["part-0"])
    assert epochs.writing() is held
    assert epochs.pre_committing(3) is held
    epochs.pre_committed(3)
    assert epochs.pre_committing(3) is None, "a second pre_commit has nothing to do"
    committed = epochs.committing(3)
    assert committed is not None
    assert committed.phase is EpochPhase.PRE_COMMITTED
    assert committed.held is held
    assert epochs.finish(3) is committed
    assert epochs.open_epoch is None
    epochs.begin(4, [])


def test_a_skipped_epoch_drops_its_batches_and_has_nothing_to_pre_commit() -> None:
    epochs = _tracker()
    epochs.skip(2)
    assert epochs.writing() is None
    assert epochs.pre_committing(2) is None
    committed = epochs.committing(2)
    assert committed is not None
    assert committed.phase is EpochPhase.SKIPPED
    epochs.finish(2)
    assert epochs.open_epoch is None


def test_no_epoch_begins_while_another_is_open() -> None:
    epochs = _tracker()
    epochs.begin(1, [])
    with pytest.raises(InvalidState, match=r"epoch 1 first.*begin_epoch\(2\) on the test sink"):
        epochs.check_can_begin(2)
    with pytest.raises(InvalidState):
        epochs.begin(2, [])
    with pytest.raises(InvalidState):
        epochs.skip(2)
    assert epochs.open_epoch is not None
    assert epochs.open_epoch.number == 1


def test_writing_is_refused_outside_an_epoch_being_written() -> None:
    epochs = _tracker()
    with pytest.raises(InvalidState, match="no epoch open on the test sink"):
        epochs.writing()
    epochs.begin(1, [])
    epochs.pre_committed(1)
    with pytest.raises(InvalidState, match="epoch 1 pre-committed"):
        epochs.writing()


def test_pre_commit_names_the_epoch_it_expected() -> None:
    epochs = _tracker()
    with pytest.raises(InvalidState, match=r"begin_epoch\(5\) before pre_commit\(5\).*no epoch"):
        epochs.pre_committing(5)
    epochs.begin(4, [])
    with pytest.raises(InvalidState, match="epoch 4 open"):
        epochs.pre_committing(5)


def test_commit_is_refused_before_pre_commit_and_for_another_epoch() -> None:
    epochs = _tracker()
    epochs.begin(7, [])
    with pytest.raises(InvalidState, match=r"pre_commit\(7\) before commit_epoch\(7\)"):
        epochs.committing(7)
    with pytest.raises(InvalidState, match=r"commit_epoch\(6\) on the test sink while epoch 7"):
        epochs.committing(6)
    assert epochs.open_epoch is not None
    assert epochs.open_epoch.phase is EpochPhase.WRITING


def test_an_epoch_pre_committed_elsewhere_is_committed_with_none_open_here() -> None:
    epochs = _tracker()
    assert epochs.committing(9) is None
    held = epochs.hold_pre_committed(9, ["reopened transaction"])
    open_epoch = epochs.committing(9)
    assert open_epoch is not None
    assert open_epoch.held is held
    assert open_epoch.phase is EpochPhase.PRE_COMMITTED


def test_a_failed_epoch_can_only_be_rolled_back() -> None:
    epochs = _tracker()
    held = epochs.begin(2, ["half written"])
    epochs.failed(2)
    with pytest.raises(InvalidState, match="epoch 2 failed while being written"):
        epochs.writing()
    with pytest.raises(InvalidState, match=r"rollback_epoch\(2\)"):
        epochs.pre_committing(2)
    with pytest.raises(InvalidState, match=r"pre_commit\(2\) before commit_epoch\(2\)"):
        epochs.committing(2)
    rolled_back = epochs.finish(2)
    assert rolled_back is not None
    assert rolled_back.held is held


def test_rollback_of_an_epoch_not_open_here_changes_nothing() -> None:
    epochs = _tracker()
    epochs.begin(3, [])
    assert epochs.finish(2) is None
    assert epochs.open_epoch is not None
    assert epochs.open_epoch.number == 3


def test_close_abandons_the_open_epoch_undecided() -> None:
    epochs = _tracker()
    epochs.begin(1, ["staged"])
    epochs.pre_committed(1)
    abandoned = epochs.abandon()
    assert abandoned is not None
    assert abandoned.phase is EpochPhase.PRE_COMMITTED
    assert epochs.abandon() is None
    epochs.begin(2, [])
