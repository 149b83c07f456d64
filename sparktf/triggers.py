"""Triggers: when to stop training, write a checkpoint, validate or log a summary.

A trigger is a small picklable object evaluated on a :class:`TrainingProgress`
(the absolute iteration and epoch counters, the last training loss and the
last validation score). Triggers hold no mutable state, so every barrier task
evaluates them identically from the all-reduced loss and the shared counters,
and the driver evaluates them again on the same progress.

Iterations are numbered from 1 and are absolute: they continue across
``optimize`` calls and checkpoint resumes. ``epoch`` counts *completed* epochs
(``iteration // iterations_per_epoch``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

__all__ = [
    "Trigger",
    "TrainingProgress",
    "MaxIteration",
    "MaxEpoch",
    "EveryEpoch",
    "SeveralIteration",
    "MinLoss",
    "MaxScore",
    "TriggerAnd",
    "TriggerOr",
    "check_trigger",
    "uses_score",
]


@dataclass(frozen=True)
class TrainingProgress:
    """Where training stands after an iteration.

    Parameters
    ----------
    iteration : int
        Absolute number of iterations run so far (0 before the first one).
    iterations_per_epoch : int
        ``ceil(num_records / batch_size)``.
    loss : float, optional
        Training loss of the last iteration (mean over workers).
    score : float, optional
        First validation metric of the last validation.
    """

    iteration: int
    iterations_per_epoch: int
    loss: Optional[float] = None
    score: Optional[float] = None

    @property
    def epoch(self) -> int:
        """Number of completed epochs."""
        return self.iteration // self.iterations_per_epoch

    @property
    def epoch_finished(self) -> bool:
        """True right after the last iteration of an epoch."""
        return self.iteration > 0 and self.iteration % self.iterations_per_epoch == 0


class Trigger:
    """Base class: ``trigger(progress) -> bool``."""

    def __call__(self, progress: TrainingProgress) -> bool:
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(repr(value) for value in vars(self).values())
        return f"{type(self).__name__}({args})"


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


class _CountTrigger(Trigger):
    """A trigger parameterised by a positive count ``n``."""

    def __init__(self, n: int):
        self.n = _positive_int(n, f"{type(self).__name__}(n)")


class _ThresholdTrigger(Trigger):
    """A trigger parameterised by a number ``threshold``."""

    def __init__(self, threshold: float):
        self.threshold = _number(threshold, f"{type(self).__name__}(threshold)")


class MaxIteration(_CountTrigger):
    """Fires once ``n`` iterations (absolute) have run: ``n`` is the last iteration to run."""

    def __call__(self, progress: TrainingProgress) -> bool:
        return progress.iteration >= self.n


class MaxEpoch(_CountTrigger):
    """Fires once ``n`` epochs (absolute) have completed: ``n`` is the last epoch to run."""

    def __call__(self, progress: TrainingProgress) -> bool:
        return progress.epoch >= self.n


class EveryEpoch(Trigger):
    """Fires after the last iteration of each epoch."""

    def __call__(self, progress: TrainingProgress) -> bool:
        return progress.epoch_finished


class SeveralIteration(_CountTrigger):
    """Fires after iterations ``n, 2n, 3n, ...``."""

    def __call__(self, progress: TrainingProgress) -> bool:
        return progress.iteration > 0 and progress.iteration % self.n == 0


class MinLoss(_ThresholdTrigger):
    """Fires when the last training loss is below ``threshold``."""

    def __call__(self, progress: TrainingProgress) -> bool:
        return progress.loss is not None and progress.loss < self.threshold


class MaxScore(_ThresholdTrigger):
    """Fires when the last validation score (the first validation metric) exceeds ``threshold``."""

    def __call__(self, progress: TrainingProgress) -> bool:
        return progress.score is not None and progress.score > self.threshold


class _Combination(Trigger):
    def __init__(self, first: Trigger, *others: Trigger):
        self.triggers = tuple(check_trigger(t, type(self).__name__) for t in (first, *others))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self.triggers))})"


class TriggerAnd(_Combination):
    """Fires when all the given triggers fire."""

    def __call__(self, progress: TrainingProgress) -> bool:
        return all(trigger(progress) for trigger in self.triggers)


class TriggerOr(_Combination):
    """Fires when any of the given triggers fires."""

    def __call__(self, progress: TrainingProgress) -> bool:
        return any(trigger(progress) for trigger in self.triggers)


def check_trigger(trigger: Any, name: str) -> Trigger:
    """Return ``trigger`` if it is a :class:`Trigger`, else raise ``TypeError`` naming ``name``."""
    if not isinstance(trigger, Trigger):
        raise TypeError(
            f"{name} must be a sparktf trigger (MaxIteration, MaxEpoch, EveryEpoch, "
            f"SeveralIteration, MinLoss, MaxScore, TriggerAnd, TriggerOr), "
            f"got {trigger!r} of type {type(trigger).__name__}"
        )
    return trigger


def uses_score(trigger: Trigger) -> bool:
    """Whether ``trigger`` contains a :class:`MaxScore` (which needs validation to fire)."""
    if isinstance(trigger, _Combination):
        return any(uses_score(t) for t in trigger.triggers)
    return isinstance(trigger, MaxScore)
