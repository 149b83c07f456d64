"""An XLA-compiled update of tables' rows, called with flat tensors and its rows padded on the host.

The ``"dense"`` and ``"padded"`` forms of :mod:`sparktf.training.tables.update_form`
run the optimizer's update XLA-compiled. How it is called costs more than
the update itself on a small model (measured on NCF with SGD, four tables of
about 1,000 rows a step, one thread):

* padding the rows in graph ops (sort, search, mask, concat per table):
  3.0 ms a step; in NumPy on the host (:func:`host_padded_rows`): tens of
  microseconds a table;
* ``tf.function``'s dispatch of ``tf.IndexedSlices`` arguments: 1.4 ms a call
  doing nothing; its concrete function called with plain tensors: 0.4 ms
  (with NumPy arrays, which it converts itself, several times that).

So :class:`CompiledUpdate` pads on the host and calls one concrete function
whose arguments are flat tensors (each table's values and indices, or its
dense gradient), rebuilding the ``tf.IndexedSlices`` inside. Its input
signature leaves the rows' count open; XLA compiles once per padded shape.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from sparktf.models.batch_errors import essential_line

__all__ = ["MIN_PADDED_ROWS", "CompiledUpdate", "host_padded_rows", "lowers_to_hlo", "update_in_form"]

_LOG = logging.getLogger("sparktf.optimizer")

#: The smallest number of rows a padded update takes.
MIN_PADDED_ROWS = 64


def host_padded_rows(rows: tf.IndexedSlices, table_rows: int) -> Tuple[np.ndarray, np.ndarray]:
    """``(values, indices)`` of ``rows`` (each index once) and zero rows of untouched indices, to the next power
    of two: at least :data:`MIN_PADDED_ROWS` rows and at most ``table_rows``."""
    values, indices = np.asarray(rows.values), np.asarray(rows.indices, np.int64)
    count = len(indices)
    target = min(max(1 << max(count - 1, 0).bit_length(), MIN_PADDED_ROWS), table_rows)
    if target <= count:
        return values, indices
    free = np.ones(target, bool)  # of 0 .. target - 1, at most count are rows already
    free[indices[indices < target]] = False
    extra = np.flatnonzero(free)[:target - count]
    zeros = np.zeros((target - count, *values.shape[1:]), values.dtype)
    return np.concatenate([values, zeros]), np.concatenate([indices, extra])


def lowers_to_hlo(function: Any, *sample: Any) -> bool:
    """Whether XLA lowers the ``jit_compile`` ``function`` of ``sample`` to HLO (checked without running it)."""
    try:
        function.experimental_get_compiler_ir(*sample)(stage="hlo")
    except (ValueError, tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as error:
        _LOG.info("the optimizer's update runs as TensorFlow ops, not XLA-compiled: %s", essential_line(error))
        return False
    return True


class CompiledUpdate:
    """``update(*leading, rows)`` XLA-compiled, where ``rows`` holds one ``tf.IndexedSlices`` per table.

    Parameters
    ----------
    update : callable
        ``update(*leading, rows) -> tensor``: ``rows`` are ``tf.IndexedSlices``
        (``as_dense`` False: padded) or dense gradients of the tables.
    leading : sequence of tf.TensorSpec
        The arguments before the rows (e.g. the dense gradients, flat).
    tables : sequence of tuple
        Each table's shape.
    as_dense : bool
        Whether the tables' rows reach ``update`` as dense gradients
        (``"dense"`` form) or padded (``"padded"`` form).
    """

    def __init__(self, update: Callable[..., Any], leading: Sequence[tf.TensorSpec],
                 tables: Sequence[Tuple[int, ...]], as_dense: bool):
        self._tables = [tuple(int(d) for d in shape) for shape in tables]
        self._leading = len(leading)
        self._as_dense = as_dense

        def flat(*arguments: tf.Tensor) -> Any:
            parts = list(arguments[self._leading:])
            rows = parts if as_dense else [
                tf.IndexedSlices(parts[2 * i], parts[2 * i + 1], tf.constant(shape, tf.int64))
                for i, shape in enumerate(self._tables)]
            return update(*arguments[:self._leading], rows)

        table_specs: List[tf.TensorSpec] = []
        for shape in self._tables:
            table_specs += [tf.TensorSpec(shape, tf.float32)] if as_dense else [
                tf.TensorSpec([None, *shape[1:]], tf.float32), tf.TensorSpec([None], tf.int64)]
        self._function = tf.function(flat, input_signature=[*leading, *table_specs], jit_compile=True,
                                     autograph=False)
        self._concrete: Any = None

    def compiles(self) -> bool:
        """Whether XLA can compile the update (lowered to HLO with zeros, not run)."""
        sample = [tf.zeros(spec.shape, spec.dtype) for spec in self._function.input_signature[:self._leading]]
        for shape in self._tables:
            if self._as_dense:
                sample.append(tf.zeros(shape))
            else:
                count = min(MIN_PADDED_ROWS, shape[0])
                sample += [tf.zeros([count, *shape[1:]]), tf.range(count, dtype=tf.int64)]
        return lowers_to_hlo(self._function, *sample)

    def __call__(self, *arguments: Any) -> Any:
        """Run the update on ``(*leading, rows)`` (``rows``: one ``tf.IndexedSlices`` per table)."""
        *leading, rows = arguments
        parts: List[Any] = []
        for slices, shape in zip(rows, self._tables):
            if self._as_dense:
                parts.append(tf.convert_to_tensor(slices))
            else:  # tensors: a concrete function converts NumPy arguments far more slowly (2.9 against 0.8 ms)
                parts += [tf.convert_to_tensor(part) for part in host_padded_rows(slices, shape[0])]
        if self._concrete is None:
            self._concrete = self._function.get_concrete_function()
        return self._concrete(*leading, *parts)


def update_in_form(form: str, update: Callable[..., Any], row_kernels: Callable[..., Any],
                   leading: Sequence[tf.TensorSpec], tables: Sequence[Tuple[int, ...]],
                   compile_now: bool = True) -> Tuple[Any, bool]:
    """``(function, compiled)``: an update ``(*leading, rows) -> ...`` of ``tables`` (one ``tf.IndexedSlices`` each)
    in the ``form`` ``update_form`` finds for the optimizer; the one dispatch on that form, for the step's update and
    for a shard's.

    ``"kernel"``: ``row_kernels``, the optimizer's exact row update of the touched rows alone. ``"dense"`` (Adam,
    momentum: every row moves) and ``"padded"`` (SGD): ``update`` XLA-compiled, which fuses the passes over the
    table (when ``compile_now`` and XLA lowers it). Otherwise (``"rows"`` too): ``update`` as TensorFlow ops.
    """
    rows = [tf.IndexedSlicesSpec(shape, tf.float32, tf.int64, tf.int64, [None]) for shape in tables]
    signature = [*leading, rows]
    if form == "kernel":
        return tf.function(row_kernels, input_signature=signature, autograph=False), False
    if form != "rows" and compile_now:
        compiled = CompiledUpdate(update, leading, tables, as_dense=form == "dense")
        if compiled.compiles():
            return compiled, True
    return tf.function(update, input_signature=signature, autograph=False), False
