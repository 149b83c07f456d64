"""The checkpoints of one ``optimize`` call: a write the store fails does not stop training.

The driver's model holds the training state in memory; a checkpoint is its
copy on storage. When a write fails after the store's own retries (and those
of :mod:`sparktf.storage.faults`), training goes on: the failure is logged
as a warning with the path and the error, and the next checkpoint trigger
writes the newer state. Training stops with the ``StorageError`` only when

* ``checkpoint_failures`` checkpoints in a row could not be written, or
* ``optimize`` ends while its last checkpoint was never written (its final
  state is tried once more first).

Deleting older checkpoints (``keep_checkpoints``) that fails only warns: the
next complete checkpoint deletes them.
"""

from __future__ import annotations

import logging
import numbers
from typing import Any, Callable, Optional

from sparktf.errors import StorageError
from sparktf.training.checkpoint import ModelState, checkpoint_path, prune_checkpoints, write_checkpoint

__all__ = ["CheckpointWriter"]

_LOG = logging.getLogger("sparktf.optimizer")  # where training tells the user what happens


class CheckpointWriter:
    """Writes a checkpoint whenever ``trigger`` fires; survives up to ``failures`` - 1 failed writes in a row.

    Parameters
    ----------
    model_dir : str or None
        Where checkpoints go (None: no checkpoints, the writer does nothing).
    keep : int or None
        ``keep_checkpoints``: how many of the newest checkpoints stay.
    trigger : Trigger
        The checkpoint trigger.
    failures : int
        ``checkpoint_failures``: failed writes in a row after which training
        stops with the ``StorageError``.
    """

    def __init__(self, model_dir: Optional[str], keep: Optional[int], trigger: Any, failures: int = 3):
        if not (isinstance(failures, numbers.Integral) and failures >= 1):
            raise ValueError(f"checkpoint_failures must be an integer >= 1, got {failures!r}")
        self.model_dir, self.keep, self.trigger, self.failures = model_dir, keep, trigger, int(failures)
        self.failed_in_a_row = 0
        self.last_error: Optional[OSError] = None  # of the latest write, when it failed

    def after_segment(self, progress: Any, state: Callable[[], ModelState]) -> None:
        """Write ``state()`` when the trigger fires at ``progress``.

        Raises
        ------
        StorageError
            When this is the ``failures``-th failed write in a row.
        """
        if self.model_dir and self.trigger(progress):
            self._write(state())

    def finish(self, state: Callable[[], ModelState]) -> None:
        """At the end of ``optimize``: when the last checkpoint was not written, write ``state()`` or raise.

        Raises
        ------
        StorageError
            When the final state cannot be written either.
        """
        if self.last_error is None:
            return
        final = state()
        if not self._write(final, last_try=True):
            raise StorageError(
                f"the last checkpoint of this optimize call was never written: "
                f"{checkpoint_path(self.model_dir, final.iteration)} failed too ({self.last_error}). The driver's "
                "model holds the trained weights (iteration "
                f"{final.iteration}): save them elsewhere, or call optimize again once the store answers"
            ) from self.last_error

    def _write(self, state: ModelState, last_try: bool = False) -> bool:
        """Write ``state``; True when it was written. A failure warns, or raises after ``failures`` in a row."""
        assert self.model_dir is not None
        try:
            path = write_checkpoint(state, self.model_dir)
        except OSError as error:  # StorageError included: the store's and the seam's retries are spent
            self.failed_in_a_row += 1
            self.last_error = error
            if self.failed_in_a_row >= self.failures and not last_try:
                raise StorageError(
                    f"{self.failed_in_a_row} checkpoints in a row could not be written to {self.model_dir!r} "
                    f"(checkpoint_failures={self.failures}); the last one: {error}. The driver's model holds the "
                    f"weights of iteration {state.iteration}: fix the store, then resume or save them elsewhere"
                ) from error
            if not last_try:
                _LOG.warning(
                    "checkpoint %s could not be written (%s); training goes on and the next checkpoint trigger "
                    "tries again (%d of %d failures in a row allowed)",
                    checkpoint_path(self.model_dir, state.iteration), error, self.failed_in_a_row, self.failures - 1)
            return False
        self.failed_in_a_row, self.last_error = 0, None
        try:
            prune_checkpoints(self.model_dir, self.keep)
        except OSError as error:
            _LOG.warning("checkpoint %s was written, but older ones could not be deleted (%s); the next "
                         "checkpoint tries again", path, error)
        return True
