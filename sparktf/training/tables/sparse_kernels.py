"""Apply a table's row gradient with TensorFlow's sparse kernels, when that is exactly the optimizer's update.

Keras' ``optimizer.apply`` of a ``tf.IndexedSlices`` gradient runs the
optimizer's ``update_step``, which for some optimizers reads or writes the
whole table (Keras' Adagrad takes ``sqrt(accumulator + epsilon)`` of every
row at every step). For the optimizers below an update of the present rows
alone gives the same values, so :func:`apply_rows` does that:

* ``keras.optimizers.Adagrad``: gather, add ``g ** 2``, scatter, with Keras'
  formula ``w -= lr * g / sqrt(acc + epsilon)``. TensorFlow's
  ``ResourceSparseApplyAdagradV2`` computes ``lr * g / (sqrt(acc) + epsilon)``
  instead: after 100 steps it is 5e-10 off Keras with the defaults, but 0.15
  with ``initial_accumulator_value=0``, lr 0.1 and gradients of 1e-3, so it is
  not used;
* :class:`~sparktf.optimizers.RowWiseAdagrad` and
  :class:`~sparktf.optimizers.LazyAdam`: their own row update.

Plain SGD needs none of this: its exact touched-rows update is the padded,
XLA-compiled one of :mod:`sparktf.training.tables.update_form`.

An optimizer with weight decay, clipping, EMA, gradient accumulation or loss
scaling gets no kernel (:func:`sparse_kernel` is None): those act on the
whole gradient list or on every variable.

Repeated indices are summed first, as the dense gradient has them (Keras'
Adagrad given unsummed repeats adds each one's square instead: not the
dense update), the optimizer's own slot variables are updated, and ``variable.constraint``
is applied afterwards, as in Keras. :func:`apply_rows` does not increment
``optimizer.iterations``: apply every table's rows first, then the rest of
the model's gradients with ``optimizer.apply`` (which increments it once);
with no dense gradients left, increment ``optimizer.iterations`` by one
yourself. The optimizer must be built with all the model's trainable
variables. No all-reduce happens here: the rows are the final gradient.
"""

from __future__ import annotations

from typing import Any, Optional

import keras
import tensorflow as tf

from sparktf.models.keras_internals import adagrad_accumulator, optimizer_tracks
from sparktf.optimizers import LazyAdam, RowWiseAdagrad
from sparktf.optimizers.rows import native_variable, sum_duplicate_rows

__all__ = ["ADAGRAD_KERNEL", "LAZY_ADAM_KERNEL", "ROW_WISE_ADAGRAD_KERNEL", "apply_rows", "kernel_description",
           "sparse_kernel"]

ADAGRAD_KERNEL = "adagrad_gather_scatter"
ROW_WISE_ADAGRAD_KERNEL = "row_wise_adagrad_rows"
LAZY_ADAM_KERNEL = "lazy_adam_rows"

# by exact class (a subclass may change update_step): the kernel and how the log names it
_KERNELS = {
    keras.optimizers.Adagrad: (ADAGRAD_KERNEL,
                               "sparse Adagrad update (gather/scatter with Keras' formula, touched rows only)"),
    RowWiseAdagrad: (ROW_WISE_ADAGRAD_KERNEL, "RowWiseAdagrad's row update (touched rows only)"),
    LazyAdam: (LAZY_ADAM_KERNEL, "LazyAdam's row update (touched rows only)"),
}
# optimizer settings that act on the whole gradient list or on every variable
_WHOLE_MODEL_SETTINGS = ("weight_decay", "clipnorm", "clipvalue", "global_clipnorm", "loss_scale_factor")


def _refusal(optimizer: Any) -> Optional[str]:
    """Why ``optimizer`` gets no sparse kernel, or None when it gets one."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return "loss scaling"
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        return f"{type(optimizer).__name__} is not a Keras 3 optimizer"
    for setting in _WHOLE_MODEL_SETTINGS:
        if getattr(optimizer, setting, None) is not None:
            return f"{setting} is set"
    if getattr(optimizer, "use_ema", False):
        return "use_ema is set"
    if getattr(optimizer, "gradient_accumulation_steps", None):
        return "gradient_accumulation_steps is set"
    if type(optimizer) not in _KERNELS:
        return f"no exact sparse kernel for {type(optimizer).__name__}"
    return None


def sparse_kernel(optimizer: Any) -> Optional[str]:
    """The name of the exact sparse update for ``optimizer``, or None.

    Parameters
    ----------
    optimizer : keras.optimizers.Optimizer
        The model's optimizer.

    Returns
    -------
    str or None
        One of :data:`ADAGRAD_KERNEL`, :data:`ROW_WISE_ADAGRAD_KERNEL`,
        :data:`LAZY_ADAM_KERNEL`, or None when only Keras' own update is exact.
    """
    return None if _refusal(optimizer) is not None else _KERNELS[type(optimizer)][0]


def kernel_description(optimizer: Any) -> str:
    """A short human name of the update :func:`apply_rows` would use for ``optimizer``, for a log line."""
    reason = _refusal(optimizer)
    return f"Keras' own update ({reason})" if reason is not None else _KERNELS[type(optimizer)][1]


def apply_rows(optimizer: Any, variable: Any, slices: tf.IndexedSlices, learning_rate: Any = None, *,
               unique_indices: bool = False) -> None:
    """Apply the row gradient ``slices`` of ``variable`` with the optimizer's exact sparse update.

    Only the rows present in ``slices`` (and their optimizer-state rows) are read and
    written. Call it in a ``tf.function`` (or eagerly), before the
    ``optimizer.apply`` of the model's other gradients, which increments
    ``optimizer.iterations`` once for the whole step; this function does not.

    Parameters
    ----------
    optimizer : keras.optimizers.Optimizer
        An optimizer for which :func:`sparse_kernel` is not None, built with
        ``variable`` (``optimizer.build(model.trainable_variables)``).
    variable : keras.Variable
        The table.
    slices : tf.IndexedSlices
        Its gradient rows; repeated indices are summed.
    learning_rate : optional
        The learning rate of this step; by default ``optimizer.learning_rate``,
        read before ``iterations`` is incremented, as Keras does.
    unique_indices : bool
        True when every index is present once: skips summing repeated ones.

    Raises
    ------
    ValueError
        If the optimizer has no sparse kernel or was not built with ``variable``.
    """
    kernel = sparse_kernel(optimizer)
    if kernel is None:
        raise ValueError(f"{type(optimizer).__name__} has no exact sparse kernel ({_refusal(optimizer)})")
    if not optimizer_tracks(optimizer, variable):
        raise ValueError(f"the optimizer was not built with {getattr(variable, 'path', variable.name)}: call "
                         "optimizer.build(model.trainable_variables) before applying rows")
    if learning_rate is None:
        learning_rate = optimizer.learning_rate
    dtype = native_variable(variable).dtype
    indices, rows = slices.indices, tf.cast(slices.values, dtype)
    if not unique_indices:
        indices, rows = sum_duplicate_rows(indices, rows)
    lr = tf.cast(learning_rate, dtype)
    if kernel == ADAGRAD_KERNEL:
        _adagrad_rows(optimizer, variable, indices, rows, lr)
    else:
        optimizer.update_rows(variable, indices, rows, lr)
    constraint = getattr(variable, "constraint", None)
    if constraint is not None:
        variable.assign(constraint(variable))


def _adagrad_rows(optimizer: Any, variable: Any, indices: tf.Tensor, rows: tf.Tensor, lr: tf.Tensor) -> None:
    """Keras' Adagrad on the rows ``indices`` only: ``acc += g ** 2; w -= lr * g / sqrt(acc + epsilon)``.

    A row with no gradient is unchanged by Keras' dense update too (``acc +=
    0``, ``w -= 0``), so updating the present rows alone is exact.
    """
    accumulator = native_variable(adagrad_accumulator(optimizer, variable))
    accumulated = tf.gather(accumulator, indices) + tf.square(rows)
    accumulator.scatter_update(tf.IndexedSlices(accumulated, indices))
    step = lr * rows / tf.sqrt(accumulated + tf.cast(optimizer.epsilon, rows.dtype))
    native_variable(variable).scatter_sub(tf.IndexedSlices(step, indices))
