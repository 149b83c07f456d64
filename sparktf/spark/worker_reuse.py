"""Ending the Python worker that runs this Spark task once the task is over, instead of leaving it for reuse.

PySpark keeps a Python worker for the executor's next task unless the worker,
at the end of its task, answers the JVM's finish signal with "do not reuse
me" (what it does when that signal is malformed). Spark then closes it and
starts a fresh one for a later task. sparktf asks for this when a worker's
TensorFlow is bound to GPUs that the next task on that executor may not get
(:mod:`sparktf.spark.task_devices`).
"""

from __future__ import annotations

import logging

__all__ = ["end_worker_after_task"]

_LOG = logging.getLogger(__name__)


class _EndThisWorker(Exception):
    """Raised after the finish signal is read: PySpark then tells the JVM not to reuse the worker and exits."""


def end_worker_after_task() -> bool:
    """Make this Python worker exit after its current task (PySpark 4.3 or later).

    The task itself ends normally; only its worker is not kept. Idempotent.

    Returns
    -------
    bool
        False where this PySpark has no way to ask for it (the worker stays).
    """
    try:
        from pyspark.messages.spark_message_receiver import SparkMessageReceiver
    except ImportError:
        return False
    read_finish_signal = SparkMessageReceiver.get_finish_signal_from_stream
    if getattr(read_finish_signal, "ends_worker", False):
        return True

    def read_finish_signal_then_end(receiver: SparkMessageReceiver) -> None:
        read_finish_signal(receiver)
        raise _EndThisWorker("sparktf: this Python worker's TensorFlow is bound to its task's GPUs")

    read_finish_signal_then_end.ends_worker = True  # type: ignore[attr-defined]
    SparkMessageReceiver.get_finish_signal_from_stream = read_finish_signal_then_end
    _LOG.debug("this Python worker ends after its task")
    return True
