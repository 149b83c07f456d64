"""Whether an optimizer's update of an ``Embedding`` table is dense anyway, probed on a copy of it.

Keras hands an optimizer a ``tf.IndexedSlices`` for a gathered table. SGD
and Adagrad then update only the rows the batch touched; Adam, RMSprop or
SGD with momentum move every row at every step (their moments decay), so
Keras densifies the slices inside their update and runs it over the whole
table as unfused ops. For those, the training step hands the same values as
a dense gradient to an XLA-compiled update instead: the result is the same
(:func:`updates_every_row` checks that too) and XLA fuses the element-wise
passes over the table into one.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import tensorflow as tf

__all__ = ["updates_every_row"]

logger = logging.getLogger(__name__)

_PROBE_STEPS = 3


def updates_every_row(optimizer: Any) -> bool:
    """Whether ``optimizer`` moves table rows that no gradient touched, and a dense gradient updates alike.

    Two fresh copies of the optimizer (from its config) update a small
    table for a few steps, each step's gradient touching one row: one gets
    ``tf.IndexedSlices``, the other the same gradient dense. True when an
    untouched row moved and both tables ended equal; False otherwise, or when
    the optimizer cannot be copied from its config.
    """
    try:
        sliced, dense = (_probe(optimizer, as_slices) for as_slices in (True, False))
    except Exception as error:  # a custom optimizer without a usable config: keep its own sparse update
        logger.debug("could not probe %s's sparse update (%r); it gets IndexedSlices", type(optimizer).__name__, error)
        return False
    (after_first, last), (_, dense_last) = sliced, dense
    moved = not np.array_equal(after_first[0], last[0])  # row 0, touched by the first step only
    return bool(moved and np.allclose(last, dense_last, rtol=1e-6, atol=1e-7))


def _probe(optimizer: Any, as_slices: bool) -> tuple:
    """The table after the first and after ``_PROBE_STEPS`` updates by a copy of ``optimizer``, step ``k``
    touching row ``k``."""
    import keras

    copy = type(optimizer).from_config(optimizer.get_config())
    table = keras.Variable(np.arange(12, dtype=np.float32).reshape(4, 3) / 10.0)
    copy.build([table])
    tables = []
    for step in range(_PROBE_STEPS):
        values = tf.fill([1, 3], 0.5 + step)
        indices = tf.constant([step], tf.int64)
        slices = tf.IndexedSlices(values, indices, tf.constant([4, 3], tf.int64))
        copy.apply([slices if as_slices else tf.convert_to_tensor(slices)], [table])
        tables.append(np.array(table.numpy()))
    return tables[0], tables[-1]
