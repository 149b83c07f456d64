"""TensorBoard summaries of training and validation, written on the driver.

The events are written as TensorBoard event files (TFRecord files of
``Event`` protocol buffers), with the iteration as step and the wall time at
which the worker finished the iteration, so TensorBoard and
:meth:`Summary.read_scalar` show the same numbers.

A log folder may be a URI. Where TensorFlow's own file system has the scheme
(local paths, ``file://``, ``gs://``) the events are written in place;
anywhere else they are written to a local file that is uploaded whole
(through :mod:`sparktf.storage`) at every flush and at close, a new file
after each, so TensorBoard opening the URI sees every flushed event and
nothing is uploaded twice.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import tempfile
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import summary_pb2
from tensorflow.core.util import event_pb2

from sparktf.storage import join, local_copy, scheme_of, store_for
from sparktf.triggers import Trigger, TrainingProgress, check_trigger

__all__ = ["TrainSummary", "ValidationSummary"]

_file_counter = itertools.count()


class Summary:
    """Scalar summaries of one kind (``train`` or ``validation``) of one application.

    Parameters
    ----------
    log_dir : str
        Root folder of the logs: a local path or a URI (see ``docs/guides/storage.md``).
    app_name : str
        Application name; events go to ``log_dir/app_name/<kind>``.
    """

    kind = ""

    def __init__(self, log_dir: str, app_name: str):
        self.log_dir = str(log_dir)
        self.app_name = str(app_name)
        self.path = join(self.log_dir, self.app_name, self.kind)
        self.in_place = _tensorflow_writes(self.path)
        if not self.in_place:
            store_for(self.path, "log folder")  # a scheme nothing can open fails here
        self._triggers: Dict[str, Trigger] = {}
        self._writer: Optional[tf.io.TFRecordWriter] = None
        self._staged: Optional[str] = None  # the local event file of a log folder written by upload

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
        """Make everything written so far visible to readers (uploaded, for a log folder TensorFlow cannot write)."""
        if self._writer is None:
            return
        if self.in_place:
            self._writer.flush()
        else:
            self.close()

    def close(self) -> None:
        """Flush and close the event file (a later write opens a new one)."""
        if self._writer is None:
            return
        self._writer.close()
        self._writer = None
        if self._staged is not None:
            staged, self._staged = self._staged, None
            try:
                store_for(self.path, "log folder").upload(staged, join(self.path, os.path.basename(staged)))
            finally:
                shutil.rmtree(os.path.dirname(staged), ignore_errors=True)

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
        pattern = join(self.path, "events.out.tfevents.*")
        rows = []
        if self.in_place:
            for path in sorted(tf.io.gfile.glob(pattern)):
                rows.extend(_scalars(path, tag))
        else:
            for path in store_for(self.path, "log folder").glob(pattern):
                with local_copy(path, "event file") as local:
                    rows.extend(_scalars(local, tag))
        return np.array(rows, dtype=np.float64).reshape(-1, 3)

    def _open_writer(self) -> tf.io.TFRecordWriter:
        if self._writer is None:
            now = time.time()
            name = (
                f"events.out.tfevents.{now:.6f}.{socket.gethostname()}"
                f".{os.getpid()}.{next(_file_counter)}.sparktf"
            )
            if self.in_place:
                tf.io.gfile.makedirs(self.path)
                path = join(self.path, name)
            else:
                path = self._staged = os.path.join(tempfile.mkdtemp(prefix="sparktf-events-"), name)
            self._writer = tf.io.TFRecordWriter(path)
            version = event_pb2.Event(wall_time=now, file_version="brain.Event:2")
            self._writer.write(version.SerializeToString())
        return self._writer

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_writer"] = state["_staged"] = None
        return state

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.log_dir!r}, {self.app_name!r})"


def _tensorflow_writes(path: str) -> bool:
    """Whether TensorFlow's own file system has the scheme of ``path`` (it then writes the events in place)."""
    return scheme_of(path) in set(tf.io.gfile.get_registered_schemes()) - {"ram"}


def _scalars(path: str, tag: str) -> List[Tuple[int, float, float]]:
    """``(step, value, wall_time)`` of every ``tag`` value in the event file ``path``."""
    rows = []
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        event = event_pb2.Event.FromString(record)
        rows.extend((event.step, value.simple_value, event.wall_time)
                    for value in event.summary.value if value.tag == tag)
    return rows


class TrainSummary(Summary):
    """Training summaries: ``Loss``, ``Throughput`` (records/s), ``LearningRate`` and ``Workers`` per iteration.

    Written to ``log_dir/app_name/train``; attach with
    ``TFOptimizer.set_train_summary``. ``Workers`` is the number of workers
    that ran the iteration (fewer than ``num_workers`` while elastic training
    goes on without lost executors). Each compiled metric (e.g. ``accuracy``)
    is written once per epoch, at the epoch's last iteration: its value over
    the epoch's records.
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
        metrics: Optional[Mapping[str, Sequence[float]]] = None,
    ) -> None:
        """Write the scalars of consecutive iterations from ``first`` on and flush.

        ``columns`` are the per-iteration losses, learning rates, wall times
        and step seconds, in that order; ``workers``, when given, is written
        as ``Workers`` for each of them. ``metrics`` holds each compiled
        metric's value over the epoch up to each iteration: written at the
        iterations that end an epoch.
        """
        for offset, (loss, rate, wall_time, seconds) in enumerate(zip(*columns)):
            progress = TrainingProgress(first + offset, iterations_per_epoch, float(loss), score)
            self.add_scalar("Loss", loss, progress, wall_time)
            self.add_scalar("Throughput", global_batch / seconds, progress, wall_time)
            self.add_scalar("LearningRate", rate, progress, wall_time)
            if workers is not None:
                self.add_scalar("Workers", workers, progress, wall_time)
            if progress.epoch_finished:
                for name, values in (metrics or {}).items():
                    self.add_scalar(name, values[offset], progress, wall_time)
        self.flush()


class ValidationSummary(Summary):
    """Validation summaries: the loss and every metric, at each validation.

    Written to ``log_dir/app_name/validation``; attach with
    ``TFOptimizer.set_val_summary``.
    """

    kind = "validation"
