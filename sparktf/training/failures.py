"""Which failures of a training worker are deterministic, and the errors that say so.

A batch the model rejects (labels out of range, label shapes that do not fit
the outputs, strings for a numeric model) fails the same way on every
relaunch, and so does a model that raises on its first batch. The worker
turns such a failure into a one-line ``DataError`` (the batch is at fault) or
``ModelError`` (the model is) naming the rank, partition and iteration and
TensorFlow's own message; the driver never relaunches those. Infrastructure
failures (a lost peer, a collective timeout, a killed process, an exhausted
resource) pass through unchanged and are relaunched.

This module runs on executors: it never imports driver-only modules.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator, Optional

import tensorflow as tf

from sparktf.errors import ConfigurationError, DataError, DriverJVMGone, ModelError, SparkTFError, StorageError
from sparktf.models.batch_errors import essential_line

__all__ = ["classified_failures", "deterministic_failure", "failure_report", "reported_failure", "relaunch_helps"]

_REPORT = "failed "
# What a rank names to the driver: deterministic failures (raised at once) and its store's (relaunched).
_REPORTABLE = {cls.__name__: cls for cls in (DataError, ModelError, StorageError)}
_TRANSIENT = " (transient)"  # after a reported StorageError's class: the store broke off, a relaunch may succeed

# What a batch that does not fit the model raises, at trace time or at run time.
_BATCH_ERRORS = (
    tf.errors.InvalidArgumentError,
    tf.errors.UnimplementedError,
    ValueError,
    TypeError,
)
# What the cluster (not the data or the model) causes: always worth a relaunch.
_INFRASTRUCTURE_ERRORS = (
    OSError,
    MemoryError,
    tf.errors.UnknownError,
    tf.errors.ResourceExhaustedError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.InternalError,
)


def deterministic_failure(
    error: BaseException, rank: int, iteration: int, warm_up: bool
) -> Optional[SparkTFError]:
    """The error to raise instead of ``error`` when relaunching cannot help, else None.

    Parameters
    ----------
    error : BaseException
        What the worker's step (or its warm-up) raised.
    rank : int
        The worker's rank, which is also its partition of the training data.
    iteration : int
        The iteration the failing step computed.
    warm_up : bool
        Whether the failure happened while loading the model and running its
        first (warm-up) step: any failure there that is not an infrastructure
        failure is the model's.

    Returns
    -------
    DataError, ModelError or None
        ``DataError`` for a batch the model rejects, ``ModelError`` for a
        model that fails on its first batch, None to relaunch.
    """
    if isinstance(error, (SparkTFError, _INFRASTRUCTURE_ERRORS)) or not isinstance(error, Exception):
        return None
    where = f"rank {rank} (partition {rank} of the training data), iteration {iteration}" + (
        " (the warm-up step on the first batch)" if warm_up else ""
    )
    cause = f"{type(error).__name__}: {essential_line(error)}"
    if isinstance(error, _BATCH_ERRORS):
        return DataError(
            f"training stopped at {where}: the model rejected the training batch ({cause}). "
            "This fails the same way on every relaunch, so it is not retried. Check the data against "
            "the model and its loss: class ids in [0, number of classes) for a sparse categorical loss, "
            "label shapes equal to the output shape (e.g. for MSE), numbers (not strings) for a "
            "numeric model. The worker's traceback is in this error's __cause__."
        )
    if warm_up:
        return ModelError(
            f"training stopped at {where}: the model failed on its first batch ({cause}). "
            "This fails the same way on every relaunch, so it is not retried: fix the model (try "
            "model.train_on_batch on a few records locally). The worker's traceback is in this "
            "error's __cause__."
        )
    return None


def relaunch_helps(error: BaseException) -> bool:
    """Whether relaunching a training segment after ``error`` may succeed (the driver's one rule).

    Not for bad data (``DataError``), a failing model (``ModelError``), a
    setting that cannot work (``ConfigurationError``), a path its store
    refuses (a ``StorageError`` that is not transient) or a dead driver JVM:
    those fail the same way again, so they are raised at once. Everything
    else (a lost worker or peer, a timeout, a store that broke off) may not.
    """
    if isinstance(error, StorageError):
        return error.transient
    return not isinstance(error, (DataError, ModelError, ConfigurationError, DriverJVMGone))


def failure_report(error: SparkTFError) -> str:
    """A rank's last heartbeat phase for a failure it knows the cause of: its class and message.

    The rank that failed sends it to the driver's job channel before its task
    ends; its peers only see a connection close, and Spark may report one of
    their errors first. A deterministic failure (``DataError``, ``ModelError``)
    is raised at once, and so is a ``StorageError`` for a path the store
    refuses; one whose store broke off (``transient``) is relaunched, named
    in the driver's warning.
    """
    transient = _TRANSIENT if getattr(error, "transient", False) else ""
    return f"{_REPORT}{type(error).__name__}{transient}: {str(error)[:4000]}"


def reported_failure(phases: Iterable[str]) -> Optional[SparkTFError]:
    """The error a rank reported with :func:`failure_report`, if any phase is one."""
    for phase in phases:
        name, _, message = phase[len(_REPORT):].partition(": ")
        transient = name.endswith(_TRANSIENT)
        name = name.removesuffix(_TRANSIENT)
        if phase.startswith(_REPORT) and name in _REPORTABLE:
            return StorageError(message, transient=transient) if name == "StorageError" else _REPORTABLE[name](message)
    return None


@contextlib.contextmanager
def classified_failures(rank: int, iteration: int, warm_up: bool) -> Iterator[None]:
    """Raise :func:`deterministic_failure`'s error for what the block raises, when it has one.

    Other exceptions pass through unchanged (the driver relaunches them).
    """
    try:
        yield
    except Exception as error:
        failure = deterministic_failure(error, rank, iteration, warm_up)
        if failure is None:
            raise
        raise failure from error
