"""TensorBoard summaries of training and validation, written on the driver.

The events are written as TensorBoard event files (TFRecord files of
``Event`` protocol buffers), with the iteration as step and the wall time at
which the worker finished the iteration, so TensorBoard and
:meth:`Summary.read_scalar` show the same numbers.
"""

from __future__ import annotations

import glob
import itertools
import os
import socket
import time
from typing import Dict, Optional, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import summary_pb2
from tensorflow.core.util import event_pb2

from sparktf.triggers import Trigger, TrainingProgress, check_trigger

__all__ = ["TrainSummary", "ValidationSummary"]

_file_counter = itertools.count()


class Summary:
    """Scalar summaries of one kind (``train`` or ``validation``) of one application.

    Parameters
    ----------
    log_dir : str
        Root directory of the logs.
    app_name : str
        Application name; events go to ``log_dir/app_name/<kind>``.
    """

    kind = ""

    def __init__(self, log_dir: str, app_name: str):
        self.log_dir = str(log_dir)
        self.app_name = str(app_name)
        self.path = os.path.join(self.log_dir, self.app_name, self.kind)
        self._triggers: Dict[str, Trigger] = {}
        self._writer: Optional[tf.io.TFRecordWriter] = None

    def set_summary_trigger(self, tag: str, trigger: Trigger) -> "Summary":
        """Write ``tag`` only when ``trigger`` fires (default: every time).

        Parameters
        ----------
        tag : str
            A scalar tag, e.g. ``"Loss"``.
        trigger : Trigger
            Evaluated on the training progress of the iteration being logged.

        Returns
        -------
        Summary
            ``self``.
        """
        self._triggers[tag] = check_trigger(trigger, f"the summary trigger of {tag!r}")
        return self

    def add_scalar(
        self,
        tag: str,
        value: float,
        progress: TrainingProgress,
        wall_time: Optional[float] = None,
    ) -> None:
        """Record ``value`` for ``tag`` at ``progress.iteration`` if the tag's trigger fires."""
        trigger = self._triggers.get(tag)
        if trigger is not None and not trigger(progress):
            return
        event = event_pb2.Event(
            wall_time=time.time() if wall_time is None else wall_time,
            step=progress.iteration,
            summary=summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag=tag, simple_value=float(value))]
            ),
        )
        self._open_writer().write(event.SerializeToString())

    def flush(self) -> None:
        """Make everything written so far visible to readers."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file (a later write opens a new one)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def read_scalar(self, tag: str) -> np.ndarray:
        """Read back every value written for ``tag``.

        Parameters
        ----------
        tag : str
            A scalar tag, e.g. ``"Loss"``.

        Returns
        -------
        numpy.ndarray
            Shape ``(n, 3)``: columns ``(iteration, value, wall_time)`` in
            the order written; ``n`` is 0 when nothing was written.
        """
        self.flush()
        rows = []
        for path in sorted(glob.glob(os.path.join(self.path, "events.out.tfevents.*"))):
            for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
                event = event_pb2.Event.FromString(record)
                for value in event.summary.value:
                    if value.tag == tag:
                        rows.append((event.step, value.simple_value, event.wall_time))
        return np.array(rows, dtype=np.float64).reshape(-1, 3)

    def _open_writer(self) -> tf.io.TFRecordWriter:
        if self._writer is None:
            os.makedirs(self.path, exist_ok=True)
            now = time.time()
            name = (
                f"events.out.tfevents.{now:.6f}.{socket.gethostname()}"
                f".{os.getpid()}.{next(_file_counter)}.sparktf"
            )
            self._writer = tf.io.TFRecordWriter(os.path.join(self.path, name))
            version = event_pb2.Event(wall_time=now, file_version="brain.Event:2")
            self._writer.write(version.SerializeToString())
        return self._writer

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_writer"] = None
        return state

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.log_dir!r}, {self.app_name!r})"


class TrainSummary(Summary):
    """Training summaries: ``Loss``, ``Throughput`` (records/s), ``LearningRate`` and ``Workers`` per iteration.

    Written to ``log_dir/app_name/train``; attach with
    ``TFOptimizer.set_train_summary``. ``Workers`` is the number of workers
    that ran the iteration (fewer than ``num_workers`` while elastic training
    goes on without lost executors).
    """

    kind = "train"

    def add_iterations(
        self,
        first: int,
        iterations_per_epoch: int,
        global_batch: int,
        score: Optional[float],
        columns: Sequence[Sequence[float]],
        workers: Optional[int] = None,
    ) -> None:
        """Write the scalars of consecutive iterations from ``first`` on and flush.

        ``columns`` are the per-iteration losses, learning rates, wall times
        and step seconds, in that order; ``workers``, when given, is written
        as ``Workers`` for each of them.
        """
        for offset, (loss, rate, wall_time, seconds) in enumerate(zip(*columns)):
            progress = TrainingProgress(first + offset, iterations_per_epoch, float(loss), score)
            self.add_scalar("Loss", loss, progress, wall_time)
            self.add_scalar("Throughput", global_batch / seconds, progress, wall_time)
            self.add_scalar("LearningRate", rate, progress, wall_time)
            if workers is not None:
                self.add_scalar("Workers", workers, progress, wall_time)
        self.flush()


class ValidationSummary(Summary):
    """Validation summaries: the loss and every metric, at each validation.

    Written to ``log_dir/app_name/validation``; attach with
    ``TFOptimizer.set_val_summary``.
    """

    kind = "validation"
