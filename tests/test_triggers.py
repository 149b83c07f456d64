"""Triggers evaluated on training progress (no Spark needed)."""

import pickle

import pytest

from sparktf.triggers import (
    EveryEpoch,
    MaxEpoch,
    MaxIteration,
    MaxScore,
    MinLoss,
    SeveralIteration,
    TrainingProgress,
    TriggerAnd,
    TriggerOr,
    check_trigger,
    uses_score,
)


def at(iteration, per_epoch=4, loss=None, score=None):
    return TrainingProgress(iteration, per_epoch, loss, score)


def fired(trigger, iterations, **kwargs):
    return [i for i in iterations if trigger(at(i, **kwargs))]


def test_max_iteration_fires_from_n_on():
    assert fired(MaxIteration(7), range(10)) == [7, 8, 9]


def test_max_epoch_counts_completed_epochs():
    assert fired(MaxEpoch(2), range(12)) == [8, 9, 10, 11]
    assert at(9).epoch == 2


def test_every_epoch_fires_after_last_iteration_of_each_epoch():
    assert fired(EveryEpoch(), range(13)) == [4, 8, 12]


def test_several_iteration_fires_on_multiples():
    assert fired(SeveralIteration(3), range(10)) == [3, 6, 9]


def test_min_loss_and_max_score_need_a_value():
    assert not MinLoss(0.5)(at(3))
    assert MinLoss(0.5)(at(3, loss=0.4))
    assert not MinLoss(0.5)(at(3, loss=0.5))
    assert not MaxScore(0.9)(at(3))
    assert MaxScore(0.9)(at(3, score=0.95))


def test_and_or_combine():
    both = TriggerAnd(MaxIteration(5), SeveralIteration(2))
    either = TriggerOr(MaxIteration(9), SeveralIteration(4))
    assert fired(both, range(10)) == [6, 8]
    assert fired(either, range(10)) == [4, 8, 9]


def test_triggers_survive_pickling():
    trigger = TriggerOr(MaxEpoch(2), TriggerAnd(MinLoss(0.1), SeveralIteration(3)))
    copy = pickle.loads(pickle.dumps(trigger))
    assert fired(copy, range(12), loss=0.05) == fired(trigger, range(12), loss=0.05) == [3, 6, 8, 9, 10, 11]
    assert repr(copy) == repr(trigger)


@pytest.mark.parametrize("bad", [5, "MaxEpoch(1)", None, lambda progress: True])
def test_non_triggers_raise_type_error(bad):
    with pytest.raises(TypeError, match="end_trigger must be a sparktf trigger"):
        check_trigger(bad, "end_trigger")
    with pytest.raises(TypeError, match="TriggerOr"):
        TriggerOr(MaxEpoch(1), bad)


@pytest.mark.parametrize(
    "make", [lambda: MaxIteration(0), lambda: MaxEpoch(-1), lambda: SeveralIteration(1.5)]
)
def test_bad_counts_raise_value_error(make):
    with pytest.raises(ValueError, match="positive integer"):
        make()


def test_uses_score_finds_max_score_in_combinations():
    assert uses_score(TriggerOr(MaxEpoch(1), TriggerAnd(MinLoss(1.0), MaxScore(0.5))))
    assert not uses_score(TriggerOr(MaxEpoch(1), MinLoss(1.0)))
