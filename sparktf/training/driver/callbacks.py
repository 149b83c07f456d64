"""Keras callbacks on the driver while barrier tasks train.

:class:`DriverCallbacks` runs standard ``keras.callbacks`` (and user
subclasses) on the driver with Keras' own hook names and ``logs``:

* ``on_train_begin`` / ``on_train_end`` around ``optimize``;
* ``on_epoch_begin`` / ``on_epoch_end`` (``loss``: the epoch's mean training
  loss, each compiled metric over the epoch's records, and ``val_*`` when
  there is validation data): with callbacks, segments end at epoch
  boundaries, so every callback's ``model`` is the driver's model holding
  the weights of that epoch end (without callbacks, a segment may span
  epochs: the progress display and the ``History`` still get every epoch);
* ``on_train_batch_end`` for every iteration exactly once, in order, with
  ``logs={"loss": <that iteration's loss>, <metric>: <its value over the
  epoch so far>, ...}``: live while a segment runs, as rank 0's reports
  (about once a second: calling back into the driver per iteration would
  stall the ring) bring the values of every iteration since its previous
  one, and otherwise (a report's values lost, or the last second of a
  segment) as soon as the segment's per-iteration records reach the
  driver, before that epoch's ``on_epoch_end``.

In an elastic call (``min_workers < num_workers``) every epoch's ``logs``
also hold ``workers``, the fewest workers that trained in the epoch, and
the display prints a line whenever the count changes.

``model.stop_training = True`` ends training after the epoch; changes a
callback makes to the model or its optimizer (the learning rate is an
optimizer variable) reach the workers with the next segment's state.

The same events feed the call's progress display
(:class:`~sparktf.training.driver.progress.ProgressDisplay`); each epoch is
also logged on the ``sparktf.optimizer`` logger.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from sparktf.errors import DataError
from sparktf.training.driver.progress import ProgressDisplay
from sparktf.training.worker.step_clock import STEP_PHASES
from sparktf.triggers import TrainingProgress

__all__ = ["DriverCallbacks", "default_verbose", "UNSUPPORTED_CALLBACKS"]

_LOG = logging.getLogger("sparktf.optimizer")

#: Callbacks that need ``model.fit``'s own loop, and what to use instead.
UNSUPPORTED_CALLBACKS = {
    "BackupAndRestore": "it restores model.fit's epoch loop after an interruption; sparktf checkpoints and "
    "resumes by itself: pass model_dir= to TFOptimizer (and call load_checkpoint() to resume)",
}


def default_verbose() -> int:
    """1 (a progress bar) in a terminal or notebook, else 2 (one line per epoch)."""
    terminal = hasattr(sys.stdout, "isatty") and sys.stdout.isatty()
    return 1 if terminal or _in_notebook() else 2


def _in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (IPython's ZMQ shell), not just with IPython imported."""
    ipython = sys.modules.get("IPython")
    try:
        shell = ipython.get_ipython() if ipython is not None else None
    except Exception:  # an IPython too old or half-imported: not a notebook
        return False
    return type(shell).__name__ == "ZMQInteractiveShell"


class DriverCallbacks:
    """The Keras callbacks of one ``optimize`` call, and the events its progress display shows.

    Parameters
    ----------
    callbacks : sequence of keras.callbacks.Callback
        The user's callbacks (may be empty).
    model : keras.Model
        The driver's model (every callback's ``model``).
    verbose : int
        0 silent, 1 a progress bar per epoch, 2 one line per epoch.
    iterations_per_epoch : int
    global_batch : int
        Records per iteration (for records/s).
    epochs : int, optional
        The last epoch, when the end trigger names one (for "Epoch 3/10").
    history : keras.callbacks.History
        Receives every epoch's logs.
    num_workers : int, optional
        Given for an elastic call: epochs log ``workers`` and changes of the
        worker count are shown.
    label : str, optional
        Given for a call that runs beside others (see
        :func:`sparktf.spark.calls.current_label`): every line starts
        with ``[label]`` and ``verbose=1`` shows one line per epoch, no bar.
    """

    def __init__(
        self,
        callbacks: Sequence[Any],
        model: Any,
        *,
        verbose: int,
        iterations_per_epoch: int,
        global_batch: int,
        epochs: Optional[int],
        history: Any,
        num_workers: Optional[int] = None,
        label: Optional[str] = None,
    ):
        import keras

        for callback in callbacks:
            if not isinstance(callback, keras.callbacks.Callback):
                raise DataError(f"callbacks must be keras.callbacks.Callback instances, got {callback!r}")
            reason = UNSUPPORTED_CALLBACKS.get(type(callback).__name__)
            if reason is not None:
                raise DataError(f"{type(callback).__name__} does not work with TFOptimizer: {reason}")
        if verbose not in (0, 1, 2):
            raise DataError(f"verbose must be 0, 1 or 2, got {verbose!r}")
        self._list = keras.callbacks.CallbackList(
            list(callbacks) + [history], model=model, verbose=verbose, epochs=epochs, steps=iterations_per_epoch
        )
        self._model = model
        self._display = ProgressDisplay(verbose, iterations_per_epoch, epochs, label)
        self._per_epoch = iterations_per_epoch
        self._global_batch = global_batch
        self._epoch: Optional[int] = None
        self._epoch_start = 0
        self._epoch_losses: List[float] = []
        self._epoch_seconds = 0.0
        self._reported = 0
        self._delivered = 0  # the last iteration on_train_batch_end was called for
        self._lock = threading.Lock()  # reports arrive on the watchdog's thread
        self._rate_mark = (0, time.monotonic())
        self._logs: Dict[str, float] = {}
        self._num_workers = num_workers
        self._workers: Optional[int] = None  # of the last launch
        self._epoch_workers: Optional[int] = None  # the fewest in the open epoch

    # ------------------------------------------------------------------ optimize's hooks

    def train_begin(self) -> None:
        self._model.stop_training = False
        self._list.on_train_begin()

    def segment_begins(self, progress: TrainingProgress) -> None:
        """Before a segment: opens the epoch it starts in, if not open yet."""
        if self._epoch is None:
            self._open_epoch(progress.epoch, progress.iteration % self._per_epoch)
        self._reported = self._delivered = progress.iteration
        self._rate_mark = (progress.iteration, time.monotonic())

    def launching(self, workers: int, iteration: int) -> None:
        """Before every launch (relaunches included) on ``workers`` after ``iteration``: shows a change."""
        if self._num_workers is None:
            return
        changed = workers != self._workers if self._workers is not None else workers < self._num_workers
        if changed:
            self._display.say(f"continuing on {workers} of {self._num_workers} workers from iteration {iteration + 1}")
        self._workers = workers

    def report(self, reports: Dict[int, Any]) -> None:
        """Rank 0's newest report, while a segment runs (called from the watchdog's thread).

        Its ``batches`` (the values of the iterations since its previous
        report) go to ``on_train_batch_end`` in order; the progress display
        shows where rank 0 is.
        """
        latest = reports.get(0)
        if latest is None:
            return
        shown: Dict[str, float] = {}
        with self._lock:
            for iteration, values in latest.batches:
                shown = dict(zip(latest.batch_names, values))
                if iteration == self._delivered + 1:  # in order: after a gap, the rest come with the records
                    self._delivered = iteration
                    self._list.on_train_batch_end((iteration - 1) % self._per_epoch, dict(shown))
        if latest.phase not in STEP_PHASES or latest.iteration <= self._reported or latest.loss is None:
            return
        self._reported = latest.iteration
        iteration, mark = self._rate_mark
        now = time.monotonic()
        step_seconds = max(now - mark, 1e-9) / (latest.iteration - iteration)
        self._rate_mark = (latest.iteration, now)
        metrics = [(name, value) for name, value in shown.items() if name != "loss"]
        self._display.live(latest.iteration, latest.loss, metrics, self._global_batch / step_seconds)

    def straggler(self, straggler: Any) -> None:
        """A rank was named a straggler (see :class:`sparktf.training.driver.anatomy.Straggler`): one line, below the
        bar (called from the watchdog's thread, or after a segment)."""
        with self._lock:
            self._display.say(f"straggler: {straggler.describe()}", below_bar=True)

    def segment_ends(self, first_iteration: int, losses: Sequence[float], step_seconds: Sequence[float],
                     progress: TrainingProgress, validation: Optional[Dict[str, float]],
                     workers: Optional[int] = None, metrics: Optional[Mapping[str, Sequence[float]]] = None) -> bool:
        """After a segment (and the validation that followed it): ends the epochs it completed.

        ``losses`` and ``step_seconds`` are the segment's per iteration,
        ``workers`` the workers it ran on, ``metrics`` each compiled metric's
        value over the epoch up to each iteration. Returns True when a
        callback set ``model.stop_training``.
        """
        metrics = metrics or {}
        self._display.metrics(metrics)
        for offset, (loss, seconds) in enumerate(zip(losses, step_seconds)):
            if workers is not None:
                self._epoch_workers = min(workers, self._epoch_workers or workers)
            self._epoch_losses.append(float(loss))
            self._epoch_seconds += float(seconds)
            iteration = first_iteration + offset
            values = {name: float(column[offset]) for name, column in metrics.items()}
            with self._lock:
                if iteration > self._delivered:
                    self._delivered = iteration
                    self._list.on_train_batch_end((iteration - 1) % self._per_epoch, {"loss": float(loss), **values})
            if iteration % self._per_epoch == 0:
                self._end_epoch(values, validation if iteration == progress.iteration else None)
                if iteration < progress.iteration:
                    self._open_epoch(iteration // self._per_epoch, 0)
        return bool(getattr(self._model, "stop_training", False))

    def train_end(self) -> None:
        open_epoch = self._epoch is not None and self._epoch_losses
        self._display.train_ended(len(self._epoch_losses) + self._epoch_start if open_epoch else None)
        self._list.on_train_end(self._logs)

    # ------------------------------------------------------------------ epochs

    def _open_epoch(self, epoch: int, start: int) -> None:
        self._epoch, self._epoch_start, self._epoch_losses, self._epoch_seconds = epoch, start, [], 0.0
        self._epoch_workers = None
        self._list.on_epoch_begin(epoch)
        self._display.epoch_opened(epoch, start)

    def _end_epoch(self, metrics: Dict[str, float], validation: Optional[Dict[str, float]]) -> None:
        logs = {"loss": float(np.mean(self._epoch_losses)), **metrics}
        logs.update({f"val_{name}": value for name, value in (validation or {}).items()})
        if self._num_workers is not None and self._epoch_workers is not None:
            logs["workers"] = self._epoch_workers
        self._display.epoch_ended(self._epoch, logs, self._epoch_seconds)
        _LOG.info("epoch %d: %s", self._epoch + 1, ", ".join(f"{name}={value:.4g}" for name, value in logs.items()))
        self._list.on_epoch_end(self._epoch, logs)
        self._logs, self._epoch = logs, None
