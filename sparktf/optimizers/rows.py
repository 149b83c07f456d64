"""Row helpers shared by the row updates of embedding tables and the gradient exchange."""

from __future__ import annotations

from typing import Any, Tuple

import keras
import tensorflow as tf

__all__ = ["native_variable", "sum_duplicate_rows"]


def sum_duplicate_rows(indices: tf.Tensor, rows: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """``(unique indices, summed rows)``: each index once, with the sum of its rows (in a graph or eagerly).

    Parameters
    ----------
    indices : tf.Tensor
        1-D integer row indices, possibly repeated.
    rows : tf.Tensor
        The rows, ``[len(indices), ...]``.

    Returns
    -------
    tuple of tf.Tensor
        The indices in order of first appearance and, for each, the sum of its rows.
    """
    unique, positions = tf.unique(indices)
    return unique, tf.math.unsorted_segment_sum(rows, positions, tf.size(unique))


def native_variable(variable: Any) -> tf.Variable:
    """The ``tf.Variable`` behind a ``keras.Variable`` (TensorFlow backend), or ``variable`` itself."""
    return variable.value if isinstance(variable, keras.Variable) else variable
