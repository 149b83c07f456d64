"""The ``DataError`` for a batch that a model or a graph rejects on an executor.

Shared by :mod:`sparktf.predictor` and :mod:`sparktf.models.frozen_graph`, so both
name the batch the same way: its partition, its records, what the model
expects per record and what the records are. TensorFlow-free.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from sparktf.errors import DataError
from sparktf.data.specs import dtype_name

__all__ = ["rejected_batch", "essential_line"]

_NOISE = ("Graph execution error", "Detected at node", "in user code:", "[[", "File ")
_MAX_LINE = 400
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


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
    got = ", ".join(f"{dtype_name(a.dtype if hasattr(a, 'dtype') else np.asarray(a).dtype)} {list(np.shape(a)[1:])}"
                    for a in leaves)  # a SparseColumn: its values' dtype and dense shape
    message = essential_line(exc)
    return DataError(
        f"partition {partition}, records {first_record}..{first_record + size - 1}: the {what} rejected the "
        f"batch ({type(exc).__name__}: {message}). The {what} expects {expected} per record; the records "
        f"are [{got}]."
    )


def essential_line(error: BaseException) -> str:
    """TensorFlow's own message in ``error``, one line, without graph and traceback noise.

    For a graph execution error this is the line after the "Detected at
    node" trace; for a trace-time error ("in user code:") the last line.
    """
    text = _ANSI.sub("", getattr(error, "message", None) or str(error))
    text = text.split("Arguments received by")[0]  # Keras' notes on a failed layer call
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if ("in user code:" in text or "Exception encountered when calling" in text) and lines:
        line = lines[-1]
    else:
        kept = [line for line in text.splitlines() if line.strip() and not line[0].isspace()]
        kept = [line for line in kept if not line.startswith(_NOISE)]
        line = kept[0] if kept else (lines[0] if lines else type(error).__name__)
    line = " ".join(line.split())
    return line if len(line) <= _MAX_LINE else line[: _MAX_LINE - 3] + "..."
