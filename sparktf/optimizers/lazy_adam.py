"""``LazyAdam``: Adam whose sparse updates touch only the rows present in the gradient (as TF Addons' LazyAdam)."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import keras
import tensorflow as tf
from keras import ops

from sparktf.optimizers.rows import native_variable, sum_duplicate_rows

__all__ = ["LazyAdam"]


@keras.saving.register_keras_serializable(package="sparktf")
class LazyAdam(keras.optimizers.Optimizer):
    """Adam that, for a ``tf.IndexedSlices`` gradient, updates only the rows present.

    With a dense gradient it is :class:`keras.optimizers.Adam` (same
    formulas, same slots ``momentum`` and ``velocity``, no ``amsgrad``). With
    a ``tf.IndexedSlices`` gradient (an ``Embedding`` table's), repeated
    indices are summed, then for each present row ``i``::

        m_i = m_i + (g_i - m_i) * (1 - beta_1)
        v_i = v_i + (g_i ** 2 - v_i) * (1 - beta_2)
        t   = iterations + 1              # the global step, as in Keras' Adam
        w_i -= lr * sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t) * m_i / (sqrt(v_i) + epsilon)

    How it differs from Adam: Keras' Adam densifies a sparse gradient, so
    every row's moments decay at every step and a row moves on its momentum
    even when absent from the batch. Here an absent row keeps stale moments
    and does not move; the bias correction still uses the global step. So
    it is not equivalent to Adam on sparse data, only cheaper (it reads and
    writes the batch's rows, not the whole table and its two slots). On
    MLPerf's NCF, LazyAdam did not reach the quality target (0.635 hit rate
    in 10 epochs) where Adam did (tensorflow/tensorflow#23668). Check the
    model's quality against Adam before relying on it.

    Parameters
    ----------
    learning_rate : float or keras.optimizers.schedules.LearningRateSchedule
        The step size.
    beta_1 : float
        Decay of the first moment.
    beta_2 : float
        Decay of the second moment.
    epsilon : float
        Added to ``sqrt(v_i)`` in the denominator.
    **kwargs
        The arguments of :class:`keras.optimizers.Optimizer` (``name``,
        ``clipnorm``, ``weight_decay``, ...).
    """

    def __init__(self, learning_rate: Any = 0.001, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-7, **kwargs: Any) -> None:
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon

    def build(self, var_list: List[Any]) -> None:
        """Create the ``momentum`` and ``velocity`` slots, shaped like each variable (as Keras' Adam)."""
        if self.built:
            return
        super().build(var_list)
        self._momentums, self._velocities = self.add_optimizer_variables(var_list, ["momentum", "velocity"])

    def moments(self, variable: Any) -> Tuple[keras.Variable, keras.Variable]:
        """``(momentum, velocity)`` slots of ``variable`` (the optimizer must be built with it)."""
        index = self._get_variable_index(variable)
        return self._momentums[index], self._velocities[index]

    def _alpha(self, learning_rate: Any, dtype: Any) -> tf.Tensor:
        """The bias-corrected step size at the global step ``iterations + 1`` (Keras' Adam's)."""
        lr = ops.cast(learning_rate, dtype)
        local_step = ops.cast(self.iterations + 1, dtype)
        beta_1_power = ops.power(ops.cast(self.beta_1, dtype), local_step)
        beta_2_power = ops.power(ops.cast(self.beta_2, dtype), local_step)
        return lr * ops.sqrt(1 - beta_2_power) / (1 - beta_1_power)

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        """Apply one gradient: Keras' Adam for a dense one, the lazy row update for ``tf.IndexedSlices``."""
        if isinstance(gradient, tf.IndexedSlices):
            indices, rows = sum_duplicate_rows(gradient.indices, tf.cast(gradient.values, variable.dtype))
            self.update_rows(variable, indices, rows, learning_rate)
            return
        gradient = ops.cast(gradient, variable.dtype)
        alpha = self._alpha(learning_rate, variable.dtype)
        m, v = self.moments(variable)
        self.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1 - self.beta_1))
        self.assign_add(v, ops.multiply(ops.subtract(ops.square(gradient), v), 1 - self.beta_2))
        self.assign_sub(variable, ops.divide(ops.multiply(m, alpha), ops.add(ops.sqrt(v), self.epsilon)))

    def update_rows(self, variable: Any, indices: tf.Tensor, rows: tf.Tensor, learning_rate: Any) -> None:
        """Update the rows ``indices`` (each once, not checked) of ``variable`` and of its moments.

        Only those rows are read and written (gather and scatter); the other
        rows and their moments stay as they are.
        """
        dtype = variable.dtype
        rows = tf.cast(rows, dtype)
        alpha = self._alpha(learning_rate, dtype)
        m, v = (native_variable(slot) for slot in self.moments(variable))
        m_rows = tf.gather(m, indices)
        m_rows = m_rows + (rows - m_rows) * tf.cast(1 - self.beta_1, dtype)
        v_rows = tf.gather(v, indices)
        v_rows = v_rows + (tf.square(rows) - v_rows) * tf.cast(1 - self.beta_2, dtype)
        m.scatter_update(tf.IndexedSlices(m_rows, indices))
        v.scatter_update(tf.IndexedSlices(v_rows, indices))
        step = m_rows * alpha / (tf.sqrt(v_rows) + tf.cast(self.epsilon, dtype))
        native_variable(variable).scatter_sub(tf.IndexedSlices(step, indices))

    def get_config(self) -> Dict[str, Any]:
        """The constructor's arguments."""
        config = super().get_config()
        config.update({"beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon})
        return config
