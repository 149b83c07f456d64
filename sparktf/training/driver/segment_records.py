"""What the driver records after a training segment and after a validation: ``optimize``'s history, the summaries.

``TFOptimizer`` keeps the counters and the model; these functions add a
segment's iterations (and the epochs it ended) or a validation's values to
the history dict ``optimize`` returns and to the train and validation
summaries (with each rank's mean seconds per step phase, ``StepTime/rank<r>/<phase>``), and stop training on a
non-finite loss.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from sparktf.errors import TrainingError
from sparktf.training.driver.anatomy import ANATOMY_PHASES, step_phases
from sparktf.training.metric_state import epoch_ends
from sparktf.triggers import TrainingProgress

__all__ = ["record_segment", "record_validation"]


def record_segment(result: Any, first: int, per_epoch: int, batch_size: int, history: Dict[str, Any],
                   summary: Any = None, score: Optional[float] = None) -> Optional[float]:
    """Add the segment's losses and ended epochs' metrics to ``history`` and ``summary``; return its last loss.

    Parameters
    ----------
    result : SegmentResult
        The segment, whose first iteration is ``first``.
    per_epoch, batch_size : int
        Iterations per epoch and the global batch (the summary's throughput).
    summary : TrainSummary, optional
    score : float, optional
        The last validation score (the summary writes it beside the iterations).

    Raises
    ------
    TrainingError
        The segment stopped at a non-finite loss or gradient.
    """
    history["loss"].extend(float(loss) for loss in result.losses)
    for _, metrics in epoch_ends(first, per_epoch, result.metrics):
        for name, value in metrics.items():
            history.setdefault(name, []).append(value)
    if summary is not None:
        columns = (result.losses, result.learning_rates, result.wall_times, result.step_seconds)
        summary.add_iterations(first, per_epoch, batch_size, score, columns, result.workers, result.metrics)
        at = TrainingProgress(result.iteration, per_epoch, None, score)
        for rank, steps in step_phases(result.anatomy).items():  # mean seconds per step, per rank and phase
            for phase, seconds in zip(ANATOMY_PHASES, steps.mean(axis=0) if len(steps) else ()):
                summary.add_scalar(f"StepTime/rank{rank}/{phase}", float(seconds), at)
    if result.non_finite_iteration is not None:
        raise TrainingError(
            f"the training loss or gradient is not finite at iteration {result.non_finite_iteration}: "
            "check the learning rate, the input data (NaN/inf values) and the loss "
            f"function; the model keeps the weights of iteration {result.iteration}"
        )
    return float(result.losses[-1]) if len(result.losses) else None


def record_validation(results: Dict[str, float], progress: Any, history: Dict[str, Any],
                      summary: Any = None) -> Optional[float]:
    """Add a validation's ``results`` to ``history`` (``val_<name>``) and ``summary``; return its score.

    The score (what ``MaxScore`` looks at) is the first metric that is not
    the loss, else the loss.
    """
    for name, value in results.items():
        history.setdefault(f"val_{name}", []).append(value)
        if summary is not None:
            summary.add_scalar("Loss" if name == "loss" else name, value, progress)
    if summary is not None:
        summary.flush()
    scores = [value for name, value in results.items() if name != "loss"]
    return scores[0] if scores else results.get("loss")
