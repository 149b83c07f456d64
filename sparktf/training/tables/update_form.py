"""In what form an optimizer gets an ``Embedding`` table's rows, probed once on the driver on copies of it.

Keras hands an optimizer a ``tf.IndexedSlices`` for a gathered table, and
TensorFlow applies it with row updates (``scatter_*``). Those switch the
table to copy-on-read: from then on every dense read of it, such as the one
in Keras' ``Embedding.call``, copies the whole table at every step. An
XLA-compiled update writes the same rows without that switch, but XLA
compiles anew for every number of rows. So, by what :func:`update_form`
finds on copies of the optimizer:

* ``"dense"``: the optimizer moves rows no gradient touched (Adam, SGD with
  momentum: their moments decay every row), so Keras densifies the rows in
  its update anyway; it gets the same values as a dense gradient, in an
  XLA-compiled update that fuses the passes over the table;
* ``"padded"``: the optimizer keeps no slot per row and a zero gradient row
  changes nothing (SGD): its update is a row update alone, so the rows are
  padded with zero rows of untouched indices to the next power of two
  (:func:`~sparktf.training.tables.compiled_update.host_padded_rows`) and the
  compiled update sees a handful of shapes. XLA
  compiles once per combination of the tables' shapes, so a model with more
  than :data:`MAX_PADDED_TABLES` tables gets ``"rows"`` instead;
* ``"kernel"``: an optimizer that keeps a slot per row and whose exact
  update touches only the rows present (Keras' Adagrad,
  :class:`~sparktf.optimizers.LazyAdam`, :class:`~sparktf.optimizers.RowWiseAdagrad`,
  whose slot is one value a row): its row update in TensorFlow ops
  (:mod:`sparktf.training.tables.sparse_kernels`). Keras' own Adagrad computes its
  denominator over the whole accumulator at every step, and XLA's row
  updates on CPU are slower than TensorFlow's (the costs measured:
  ``docs/design/training.md``);
* ``"rows"``: anything else (or an optimizer that cannot be copied from its
  config) gets the ``tf.IndexedSlices`` as Keras would pass them.

Each form gives the update Keras' own ``optimizer.apply`` of the rows would.
The driver probes its optimizer once (:meth:`TableUpdates.probe`) and ships
the result in every segment's spec, so the workers never probe;
:func:`log_table_updates` says on the driver which form each table gets.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from sparktf.models.keras_internals import nested_layers
from sparktf.training.tables.sparse_kernels import kernel_description, sparse_kernel

__all__ = ["MAX_PADDED_TABLES", "TableUpdates", "log_table_updates"]

logger = logging.getLogger(__name__)

#: The most tables a padded update takes (each table's few shapes multiply into the compiles).
MAX_PADDED_TABLES = 4
_SHAPE = (4, 3)
_STEPS = ((0, 0.5), (1, 1.5), (2, 2.5))  # (row, value): each step touches one row


_FORM_WORDS = {
    "dense": "as a dense gradient, XLA-compiled (the optimizer moves every row, as Keras' own update does)",
    "padded": "as its rows padded to a few shapes, XLA-compiled (touched rows only)",
    "rows": "as rows, by Keras' own update",
}


@dataclass(frozen=True)
class TableUpdates:
    """How an optimizer updates ``Embedding`` tables, probed on the driver and shipped to the workers.

    Attributes
    ----------
    kind : str
        ``"dense"``, ``"padded"``, ``"kernel"`` or ``"rows"``: the form of one
        table's rows (see the module docstring).
    row_state : bool
        Whether the optimizer keeps state per row (a sharded table's lives in
        files between segments then); True when it could not be probed.
    """

    kind: str
    row_state: bool

    @classmethod
    def probe(cls, optimizer: Any) -> "TableUpdates":
        """The updates of ``optimizer``, found on copies of it (about 0.1 s; the optimizer itself is untouched)."""
        kind, row_state = _probed(optimizer)
        inner = getattr(optimizer, "inner_optimizer", None)  # loss-scaled: refused with sharded tables, by name
        return cls(kind, _probed(inner)[1] if inner is not None else row_state)

    def form(self, tables: int = 1) -> str:
        """The form of the rows of a model's ``tables`` tables updated together: padded tables compile once per
        combination of their shapes, so more than :data:`MAX_PADDED_TABLES` get ``"rows"``."""
        return "rows" if self.kind == "padded" and tables > MAX_PADDED_TABLES else self.kind


def _probed(optimizer: Any) -> Tuple[str, bool]:
    """``(kind, row_state)`` of ``optimizer`` (see :class:`TableUpdates`)."""
    try:
        sliced = _probe(optimizer, lambda row, value: _slices([(row, value)]))
        dense = _probe(optimizer, lambda row, value: tf.convert_to_tensor(_slices([(row, value)])))
        # the zero row is one an earlier step touched (its optimizer state are no longer zero), row 3 at the first step
        padded = _probe(optimizer, lambda row, value: _slices([(row, value), (3 if row == 0 else 0, 0.0)]))
    except Exception as error:  # a custom optimizer without a usable config: keep its own sparse update
        logger.debug("could not probe %s's update of rows (%r); it gets IndexedSlices",
                     type(optimizer).__name__, error)
        return "rows", True
    (first, last), (_, dense_last), (_, padded_last) = sliced, dense, padded
    moved = not np.array_equal(first[0][0], last[0][0])  # row 0, touched by the first step only
    row_state = any(slot.shape[:1] == _SHAPE[:1] for slot in last[1:])  # per row: (rows, ...) or (rows,)
    if moved and all(np.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(last, dense_last)):
        return "dense", row_state
    if not moved and not row_state and all(np.array_equal(a, b) for a, b in zip(last, padded_last)):
        return "padded", row_state
    return ("kernel" if sparse_kernel(optimizer) is not None else "rows"), row_state


def log_table_updates(model: Any, updates: Optional[TableUpdates]) -> None:
    """Log at INFO, once, how ``model``'s optimizer updates each ``Embedding`` table (``updates``: as probed;
    nothing without tables)."""
    import keras

    tables = [layer.embeddings.path for layer in nested_layers(model, include_self=True)
              if isinstance(layer, keras.layers.Embedding) and layer.trainable]
    if not tables or model.optimizer is None or updates is None:
        return
    form = updates.form(len(tables))
    words = kernel_description(model.optimizer) if form == "kernel" else _FORM_WORDS[form]
    for path in tables:
        logger.info("embedding table %s gets its %s update %s", path, type(model.optimizer).__name__, words)


def _slices(rows: List[Tuple[int, float]]) -> tf.IndexedSlices:
    values = tf.stack([tf.fill([_SHAPE[1]], value) for _, value in rows])
    indices = tf.constant([row for row, _ in rows], tf.int64)
    return tf.IndexedSlices(values, indices, tf.constant(_SHAPE, tf.int64))


def _probe(optimizer: Any, gradient: Any) -> tuple:
    """The table and slot values after the first step and after all ``_STEPS`` of a copy of ``optimizer``."""
    import keras

    copy = type(optimizer).from_config(optimizer.get_config())
    table = keras.Variable(np.arange(12, dtype=np.float32).reshape(_SHAPE) / 10.0)
    copy.build([table])
    snapshots = []
    for row, value in _STEPS:
        copy.apply([gradient(row, value)], [table])
        snapshots.append([np.array(table.numpy())] + [np.array(v.numpy()) for v in copy.variables])
    return snapshots[0], snapshots[-1]
