"""The optimizer slots of an embedding table, found generically in a Keras 3 optimizer, and their rows' reset."""

from __future__ import annotations

from typing import Any, List, Tuple

import keras
import tensorflow as tf

__all__ = ["native_variable", "reset_slot_rows", "table_slots"]


def native_variable(variable: Any) -> tf.Variable:
    """The ``tf.Variable`` behind a ``keras.Variable`` (TensorFlow backend), or ``variable`` itself."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def table_slots(optimizer: keras.optimizers.Optimizer, table: keras.Variable) -> List[Tuple[keras.Variable, float]]:
    """The slot variables ``optimizer`` keeps for the rows of ``table``, each with its initial value.

    A Keras 3 optimizer names the slots of a variable after its path
    (``add_variable_from_reference``: ``"<path with / as _>_<slot>"``, e.g.
    ``"model_dynamic_embedding_embeddings_momentum"``); sparktf's
    :class:`~sparktf.optimizers.RowWiseAdagrad` names its ``[rows]``
    accumulator the same way. A slot is an optimizer variable so named
    whose first dimension is the table's rows.

    The initial value is the optimizer's ``initial_accumulator_value`` for a
    slot named ``..._accumulator`` when the optimizer has that attribute
    (Adagrad, Ftrl), else 0 (SGD's momentum, Adam's and LazyAdam's moments,
    RowWiseAdagrad's accumulator).

    Parameters
    ----------
    optimizer : keras.optimizers.Optimizer
        A built optimizer (an unbuilt one has no slots: the list is empty).
    table : keras.Variable
        The table, ``[rows, ...]``.

    Returns
    -------
    list of (keras.Variable, float)
        The slots and their initial values.
    """
    prefix = table.path.replace("/", "_") + "_"
    slots = []
    for variable in optimizer.variables:
        if variable.name.startswith(prefix) and variable.shape[:1] == table.shape[:1]:
            initial = 0.0
            if variable.name.endswith("_accumulator"):
                initial = float(getattr(optimizer, "initial_accumulator_value", 0.0))
            slots.append((variable, initial))
    return slots


def reset_slot_rows(optimizer: keras.optimizers.Optimizer, table: keras.Variable, rows: tf.Tensor) -> None:
    """Set the rows ``rows`` (1-D int) of every slot of ``table`` in ``optimizer`` back to their initial value."""
    for slot, initial in table_slots(optimizer, table):
        shape = tf.concat([tf.shape(rows), tf.constant(slot.shape[1:], tf.int32)], axis=0)
        native_variable(slot).scatter_update(tf.IndexedSlices(tf.fill(shape, tf.cast(initial, slot.dtype)), rows))
