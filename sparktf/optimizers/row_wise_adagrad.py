"""``RowWiseAdagrad``: Adagrad with one accumulator value per row of a table (FBGEMM's ``EXACT_ROWWISE_ADAGRAD``).

An embedding table of ``rows x dim`` keeps ``rows`` accumulator values
instead of ``rows x dim``: the optimizer state of a large table shrinks by
a factor ``dim``, and a row's elements share one step size.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import keras
import tensorflow as tf

from sparktf.optimizers.rows import native_variable, sum_duplicate_rows

__all__ = ["RowWiseAdagrad"]


def _per_row(values: tf.Tensor, ndim: int) -> tf.Tensor:
    """``values`` of shape ``[rows]`` reshaped to broadcast against ``[rows, ...]`` of rank ``ndim``."""
    for _ in range(ndim - 1):
        values = values[..., None]
    return values


@keras.saving.register_keras_serializable(package="sparktf")
class RowWiseAdagrad(keras.optimizers.Optimizer):
    """Adagrad with one accumulator value per row (FBGEMM's ``EXACT_ROWWISE_ADAGRAD``).

    For a variable of rank 2 or more, row ``i`` (a slice along the first
    axis) with gradient ``g_i`` is updated as::

        acc_i += mean(g_i ** 2)           # over the row's elements
        w_i   -= lr * g_i / (sqrt(acc_i) + epsilon)

    The accumulator of a ``[rows, ...]`` variable has shape ``[rows]``
    (initialized to zero). A 1-D variable gets the same formula element-wise
    (its accumulator has its shape, ``[rows]``), a scalar too (shape ``[]``).

    With a ``tf.IndexedSlices`` gradient only the rows present change: their
    repeated indices are summed first, so the update equals the one of the
    dense gradient (a zero row adds 0 to its accumulator and moves by 0).

    Parameters
    ----------
    learning_rate : float or keras.optimizers.schedules.LearningRateSchedule
        The step size.
    epsilon : float
        Added to ``sqrt(acc_i)`` in the denominator.
    **kwargs
        The arguments of :class:`keras.optimizers.Optimizer` (``name``,
        ``clipnorm``, ``weight_decay``, ...).
    """

    def __init__(self, learning_rate: Any = 0.01, epsilon: float = 1e-8, **kwargs: Any) -> None:
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.epsilon = epsilon

    def build(self, var_list: List[Any]) -> None:
        """Create one accumulator per variable: ``[rows]`` for rank >= 1, ``[]`` for a scalar."""
        if self.built:
            return
        super().build(var_list)
        accumulators: List[Optional[keras.Variable]] = []
        for variable in var_list:
            if self._overwrite_variable_with_gradient(variable):
                accumulators.append(None)
                continue
            name = getattr(variable, "path", variable.name).replace("/", "_").replace(":", "_")
            accumulators.append(self.add_variable(shape=tuple(variable.shape[:1]), initializer="zeros",
                                                  dtype=variable.dtype, name=f"{name}_accumulator"))
        self._accumulators = accumulators

    def accumulator(self, variable: Any) -> keras.Variable:
        """The accumulator slot of ``variable`` (the optimizer must be built with it)."""
        return self._accumulators[self._get_variable_index(variable)]

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        """Apply one gradient, dense or ``tf.IndexedSlices``, to ``variable``."""
        dtype = variable.dtype
        lr = tf.cast(learning_rate, dtype)
        if isinstance(gradient, tf.IndexedSlices):
            indices, rows = sum_duplicate_rows(gradient.indices, tf.cast(gradient.values, dtype))
            self.update_rows(variable, indices, rows, lr)
            return
        gradient = tf.cast(tf.convert_to_tensor(gradient), dtype)
        ndim = len(variable.shape)
        accumulator = native_variable(self.accumulator(variable))
        accumulator.assign_add(tf.reduce_mean(tf.square(gradient), axis=list(range(1, ndim))))
        denominator = tf.sqrt(accumulator.read_value()) + tf.cast(self.epsilon, dtype)
        native_variable(variable).assign_sub(lr * gradient / _per_row(denominator, ndim))

    def update_rows(self, variable: Any, indices: tf.Tensor, rows: tf.Tensor, learning_rate: Any) -> None:
        """Update the rows ``indices`` (each once, not checked) of ``variable`` with gradient ``rows``.

        Only those rows of the variable and of its accumulator are read and
        written (gather and scatter).
        """
        dtype = variable.dtype
        ndim = len(variable.shape)
        rows = tf.cast(rows, dtype)
        accumulator = native_variable(self.accumulator(variable))
        accumulated = tf.gather(accumulator, indices) + tf.reduce_mean(tf.square(rows), axis=list(range(1, ndim)))
        accumulator.scatter_update(tf.IndexedSlices(accumulated, indices))
        denominator = tf.sqrt(accumulated) + tf.cast(self.epsilon, dtype)
        step = tf.cast(learning_rate, dtype) * rows / _per_row(denominator, ndim)
        native_variable(variable).scatter_sub(tf.IndexedSlices(step, indices))

    def get_config(self) -> Dict[str, Any]:
        """The constructor's arguments."""
        config = super().get_config()
        config.update({"epsilon": self.epsilon})
        return config
