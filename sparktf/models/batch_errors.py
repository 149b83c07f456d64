"""The ``DataError`` for a batch that a model or a graph rejects on an executor.

Shared by :mod:`sparktf.predictor` and :mod:`sparktf.models.frozen_graph`, so both
name the batch the same way: its partition, its records, what the model
expects per record and what the records are. TensorFlow-free.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from sparktf.errors import DataError
from sparktf.data.specs import dtype_name

__all__ = ["rejected_batch"]


def rejected_batch(
    partition: int, first_record: int, leaves: Sequence[np.ndarray], exc: BaseException, what: str, expected: str
) -> DataError:
    """A ``DataError`` saying that ``what`` rejected a batch, naming its records.

    Parameters
    ----------
    partition : int
        The batch's partition.
    first_record : int
        Index of the batch's first record within the partition.
    leaves : sequence of ndarray
        The batch as fed, one array per input (records along axis 0).
    exc : BaseException
        What the model raised.
    what : str
        ``"model"`` or ``"graph"``.
    expected : str
        The inputs ``what`` expects per record, e.g. ``"['x' float32 [4]]"``.
    """
    size = len(leaves[0]) if len(leaves) and np.ndim(leaves[0]) else 1
    got = ", ".join(f"{dtype_name(np.asarray(a).dtype)} {list(np.shape(a)[1:])}" for a in leaves)
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return DataError(
        f"partition {partition}, records {first_record}..{first_record + size - 1}: the {what} rejected the "
        f"batch ({type(exc).__name__}: {message}). The {what} expects {expected} per record; the records "
        f"are [{got}]."
    )
