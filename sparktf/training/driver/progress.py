"""What one ``optimize`` call shows while it trains: the progress display, a callback of its own.

:class:`~sparktf.training.driver.callbacks.DriverCallbacks` tells it when an
epoch opens and ends, where rank 0 is (live, from its reports) and what else
the user must see (a change of the worker count, a straggler):

* ``verbose=1``: a ``keras.utils.Progbar`` per epoch, fed by rank 0's reports
  (iteration in the epoch, running mean loss, the metrics so far, records/s,
  ETA);
* ``verbose=2``: one line per epoch, as Keras' ``fit(verbose=2)`` prints it;
* an epoch that ended before any report showed it (a segment can finish
  several epochs between two reports) gets that line too, its time the
  epoch's measured step time, not the time since it was drawn;
* a labelled call (one of several running from threads of the driver: model
  selection) shows no bar: one line per epoch,
  ``[label] Epoch 2/5 - 1.3s - loss: ...``, written whole, so the lines of
  concurrent calls never interleave.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple

__all__ = ["ProgressDisplay", "epoch_line"]


def epoch_line(steps: int, seconds: float, logs: Dict[str, float]) -> str:
    """An epoch's line as Keras' ``Progbar(verbose=2)`` ends it: ``4/4 - 1s - 250ms/step - loss: 0.1234``."""
    per_step = seconds / max(steps, 1)
    if per_step >= 1 or per_step == 0:
        step_time = f"{per_step:.0f}s/step"
    elif per_step >= 1e-3:
        step_time = f"{per_step * 1e3:.0f}ms/step"
    else:
        step_time = f"{per_step * 1e6:.0f}us/step"
    values = "".join(f" - {name}: {value:.4f}" if abs(value) > 1e-3 else f" - {name}: {value:.4e}"
                     for name, value in logs.items())
    return f"{steps}/{steps} - {seconds:.0f}s - {step_time}{values}"


class ProgressDisplay:
    """The progress one ``optimize`` call prints (see the module's docstring).

    Parameters
    ----------
    verbose : int
        0 silent, 1 a progress bar per epoch, 2 one line per epoch.
    iterations_per_epoch : int
    epochs : int, optional
        The last epoch, when the end trigger names one (for "Epoch 3/10").
    label : str, optional
        The call's label when it runs beside others: every line starts with
        ``[label]``, one line per epoch, no bar.
    """

    def __init__(self, verbose: int, iterations_per_epoch: int, epochs: Optional[int], label: Optional[str]):
        self._verbose = verbose
        self._per_epoch = iterations_per_epoch
        self._epochs = epochs
        self._label = label
        self._bar = verbose == 1 and label is None  # a live Progbar
        self._progbar: Any = None
        self._shown_epoch = -1  # the last epoch whose header is printed
        self._metric_names: set = set()  # running epoch values: shown as they are, not averaged again

    def metrics(self, names: Iterable[str]) -> None:
        """The compiled metrics' names: the bar shows their values as they come (values over the epoch so far)."""
        self._metric_names.update(names)

    def epoch_opened(self, epoch: int, start: int) -> None:
        """An epoch opens at iteration ``start`` of it (a resumed call may start mid-epoch)."""
        if epoch > self._shown_epoch:  # the live bar may have shown it already
            self._show_epoch(epoch, start)

    def live(self, iteration: int, loss: float, values: Sequence[Tuple[str, float]], rate: float) -> None:
        """Rank 0 is at ``iteration`` (counted from the call's start), its running ``loss`` and metric ``values``,
        training ``rate`` records a second."""
        if not self._bar:
            return
        epoch, in_epoch = divmod(iteration - 1, self._per_epoch)
        while self._shown_epoch < epoch:  # the segment went on into the next epoch
            self._progbar.update(self._per_epoch, finalize=True)
            self._show_epoch(self._shown_epoch + 1, 0)
        self._metric_names.update(name for name, _ in values)
        self._progbar.stateful_metrics.update(self._metric_names)
        self._progbar.update(in_epoch + 1, [("loss", loss), *values, ("records/s", rate)])

    def epoch_ended(self, epoch: int, logs: Dict[str, float], seconds: float) -> None:
        """Epoch ``epoch`` ended with ``logs`` after ``seconds`` of its steps."""
        if not self._verbose:
            return
        if self._label is not None:
            shown = " - ".join(f"{name}: {value:.4g}" for name, value in logs.items())
            self.say(f"Epoch {epoch + 1}{self._of_epochs()} - {seconds:.1f}s - {shown}")
            return
        if self._shown_epoch > epoch:  # the live bar closed the epochs it moved past
            return
        fell_behind = self._shown_epoch < epoch  # no report came in this epoch
        if fell_behind:
            self._show_epoch(epoch, 0)
        if fell_behind or not self._bar:  # drawn after the fact: its time from the step times
            self.say(epoch_line(self._per_epoch, seconds, logs))
        else:
            self._progbar.update(self._per_epoch, list(logs.items()), finalize=True)

    def train_ended(self, done_in_epoch: Optional[int]) -> None:
        """The call ended ``done_in_epoch`` iterations into an open epoch (None: at an epoch's end)."""
        if self._bar and done_in_epoch:
            self._progbar.update(done_in_epoch, finalize=True)

    def say(self, text: str, below_bar: bool = False) -> None:
        """Print one line when not silent, ``[label] `` first when labelled, in one write (threads' lines do not
        interleave); ``below_bar``: on a line of its own under a live bar."""
        if not self._verbose:
            return
        prefix = f"[{self._label}] " if self._label is not None else ""
        sys.stdout.write(f"{chr(10) if below_bar and self._bar else ''}{prefix}{text}\n")
        sys.stdout.flush()

    def _show_epoch(self, epoch: int, start: int) -> None:
        """Print the epoch's header and open its bar at ``start``."""
        self._shown_epoch = epoch
        if self._label is not None or not self._verbose:  # a labelled call: one line at the epoch's end instead
            return
        self.say(f"Epoch {epoch + 1}{self._of_epochs()}")
        if self._bar:
            import keras

            self._progbar = keras.utils.Progbar(self._per_epoch, verbose=1,
                                                stateful_metrics=["records/s", "workers", *self._metric_names])
            if start:
                self._progbar.update(start)

    def _of_epochs(self) -> str:
        return f"/{self._epochs}" if self._epochs else ""
