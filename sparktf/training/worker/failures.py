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
from typing import Iterator, Optional

import tensorflow as tf

from sparktf.errors import CollectiveError, DataError, InternalError, ModelError, SparkTFError
from sparktf.models.batch_errors import essential_line

__all__ = ["classified_failures", "deterministic_failure", "exchange_failure"]

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
    error: BaseException, rank: int, shard: Optional[int], iteration: int, warm_up: bool
) -> Optional[SparkTFError]:
    """The error to raise instead of ``error`` when relaunching cannot help, else None.

    Parameters
    ----------
    error : BaseException
        What the worker's step (or its warm-up) raised.
    rank : int
        The worker's rank.
    shard : int or None
        The partition of the training data it read (its rank's, unless it
        took over a shard whose stream its process held open); None before
        it knows.
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
    read = f" (partition {shard} of the training data)" if shard is not None else ""
    where = f"rank {rank}{read}, iteration {iteration}" + (
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


@contextlib.contextmanager
def classified_failures(rank: int, shard: Optional[int], iteration: int, warm_up: bool) -> Iterator[None]:
    """Raise :func:`deterministic_failure`'s error for what the block raises, when it has one.

    The block is the model's own work (loading, its forward pass, loss and
    gradient): sparktf's errors (a ``CollectiveError`` or ``InternalError``
    from the gradient exchange) and other exceptions pass through unchanged.
    """
    try:
        yield
    except Exception as error:
        failure = deterministic_failure(error, rank, shard, iteration, warm_up)
        if failure is None:
            raise
        raise failure from error


def exchange_failure(error: BaseException) -> SparkTFError:
    """The error a step raises when its gradient exchange raised ``error``: never the data's or the model's.

    A ``CollectiveError`` (a lost, silent or unauthenticated peer) or any
    other sparktf error as it is; a connection's ``OSError`` as a
    ``CollectiveError`` (both relaunched); anything else is a bug of
    sparktf's: an ``InternalError``, never relaunched.
    """
    if isinstance(error, SparkTFError):
        return error
    if isinstance(error, OSError):
        return CollectiveError(f"the gradient exchange lost its connection: {type(error).__name__}: {error}")
    return InternalError(
        f"sparktf's gradient exchange failed ({type(error).__name__}: {error}). This is a bug of sparktf's, not of "
        "the data or the model, and is not retried: please report it with the traceback in this error's __cause__")
