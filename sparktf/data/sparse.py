"""Sparse leaves: MLlib ``SparseVector`` columns kept as indices and values, never densified per record.

A :class:`SparseColumn` stands in a Block where a dense leaf has an ndarray:
the rows of a ``(records, width)`` float matrix in compressed-sparse-row
form, whose memory grows with the non-zeros, not the width. It slices,
gathers and concatenates like the arrays beside it (:func:`concat_columns`,
:func:`take_rows` apply to either kind), travels through Spark and the local
spill as its three arrays, and becomes a batch's ``tf.SparseTensor`` or dense
array only when the batch is fed (:func:`model_values`), as the model's
input asks (:func:`model_structure`). TensorFlow is imported only there.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np

__all__ = ["SparseColumn", "concat_columns", "take_rows", "model_structure", "model_values", "fed_value", "sparse_inputs"]


class SparseColumn:
    """Records of a sparse leaf: row ``i`` holds ``values[indptr[i]:indptr[i+1]]`` at ``indices[...]``.

    Slices are views sharing ``indices`` and ``values`` (``indptr`` need not
    start at 0); :meth:`take` and :meth:`concat` make compact copies.

    Parameters
    ----------
    indptr : numpy.ndarray
        ``records + 1`` int64 offsets into ``indices`` and ``values``.
    indices : numpy.ndarray
        Int32 column of each stored value, ascending within a row.
    values : numpy.ndarray
        The stored values (the leaf's dtype).
    width : int
        The dense width of a row.
    """

    __slots__ = ("indptr", "indices", "values", "width")
    ndim = 2

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, width: int):
        self.indptr = indptr
        self.indices = indices
        self.values = values
        self.width = int(width)

    @classmethod
    def empty(cls, width: int, dtype: Any = np.float32) -> "SparseColumn":
        """No records."""
        return cls(np.zeros(1, np.int64), np.empty(0, np.int32), np.empty(0, dtype), width)

    def __len__(self) -> int:
        return len(self.indptr) - 1

    @property
    def shape(self) -> tuple:
        """``(records, width)``, as a dense leaf's array."""
        return (len(self), self.width)

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    @property
    def nnz(self) -> int:
        """Stored values of the records."""
        return int(self.indptr[-1] - self.indptr[0])

    @property
    def nbytes(self) -> int:
        """Bytes the records take (their offsets, indices and values)."""
        return int(self.indptr.nbytes) + self.nnz * (self.indices.itemsize + self.values.itemsize)

    def __getitem__(self, key: Any) -> Any:
        """Records ``start:stop`` as a SparseColumn (views); one record (an int) as a dense row."""
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                raise IndexError("a SparseColumn slices without a step")
            return SparseColumn(self.indptr[start : max(start, stop) + 1], self.indices, self.values, self.width)
        row = range(len(self))[key]
        return self[row : row + 1].toarray()[0]

    def compact(self) -> "SparseColumn":
        """The same records with ``indptr`` from 0 and exactly their indices and values (views)."""
        first, last = int(self.indptr[0]), int(self.indptr[-1])
        return SparseColumn(self.indptr - first, self.indices[first:last], self.values[first:last], self.width)

    def take(self, rows: np.ndarray) -> "SparseColumn":
        """Records ``rows`` (an index array), in that order, as a compact copy."""
        rows = np.asarray(rows, np.int64)
        starts = self.indptr[rows]
        lengths = self.indptr[rows + 1] - starts
        indptr = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(lengths, out=indptr[1:])
        positions = np.repeat(starts - indptr[:-1], lengths) + np.arange(indptr[-1], dtype=np.int64)
        return SparseColumn(indptr, self.indices[positions], self.values[positions], self.width)

    @staticmethod
    def concat(columns: Sequence["SparseColumn"]) -> "SparseColumn":
        """One compact copy holding the records of ``columns`` in order (always a copy)."""
        parts = [column.compact() for column in columns]
        ends = np.cumsum([0] + [part.nnz for part in parts[:-1]])
        indptr = np.concatenate([[0]] + [part.indptr[1:] + end for part, end in zip(parts, ends)]).astype(np.int64)
        return SparseColumn(indptr, np.concatenate([part.indices for part in parts]),
                            np.concatenate([part.values for part in parts]), parts[0].width)

    def row_ids(self) -> np.ndarray:
        """The record (0-based in this column) of every stored value."""
        return np.repeat(np.arange(len(self), dtype=np.int64), np.diff(self.indptr))

    def toarray(self, dtype: Any = None) -> np.ndarray:
        """The records as a dense ``(records, width)`` array."""
        part = self.compact()
        dense = np.zeros(self.shape, dtype or self.dtype)
        dense[part.row_ids(), part.indices] = part.values
        return dense

    def to_tensor(self, dtype: Any = None) -> Any:
        """The records as a ``tf.SparseTensor`` of dense shape ``(records, width)``, in canonical order."""
        import tensorflow as tf

        part = self.compact()
        coordinates = np.stack([part.row_ids(), part.indices.astype(np.int64)], axis=1)
        values = part.values if dtype is None else part.values.astype(dtype, copy=False)
        return tf.SparseTensor(coordinates, values, dense_shape=[len(part), part.width])


def concat_columns(columns: Sequence[Any]) -> Any:
    """The records of several arrays (or SparseColumns) of one leaf, in order, as one new one."""
    if isinstance(columns[0], SparseColumn):
        return SparseColumn.concat(columns)
    return np.concatenate(columns)


def take_rows(column: Any, rows: np.ndarray) -> Any:
    """Records ``rows`` of an array (or SparseColumn), in that order, as a copy."""
    if isinstance(column, SparseColumn):
        return column.take(rows)
    return np.take(column, rows, axis=0)


def sparse_inputs(model: Any) -> Optional[List[bool]]:
    """Whether each declared input of a Keras model (``tf.nest`` order) is sparse; None when it declares none."""
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):  # a subclassed model
        return None
    return None if not inputs else [bool(getattr(tensor, "sparse", False)) for tensor in inputs]


def model_structure(model: Any, element_structure: tuple) -> tuple:
    """``element_structure`` with each leaf's spec saying how a Keras model takes it: sparse or dense.

    A feature leaf is a ``tf.SparseTensorSpec`` where the model's input is
    sparse (``keras.Input(sparse=True)``) and a ``tf.TensorSpec`` where it is
    dense; a model that declares no inputs (subclassed) keeps the data's own
    specs. Labels are always dense.
    """
    import tensorflow as tf

    from sparktf.data.specs import flatten, pack

    def spec(leaf: Any, sparse: bool) -> Any:
        kind = tf.SparseTensorSpec if sparse and leaf.dtype != tf.string else tf.TensorSpec
        return kind(leaf.shape, leaf.dtype)

    features = flatten(element_structure[0])
    flags = sparse_inputs(model)
    if flags is None or len(flags) != len(features):
        flags = [isinstance(leaf, tf.SparseTensorSpec) for leaf in features]
    structure = [pack(element_structure[0], [spec(leaf, sparse) for leaf, sparse in zip(features, flags)])]
    if len(element_structure) > 1:
        structure.append(pack(element_structure[1], [spec(leaf, False) for leaf in flatten(element_structure[1])]))
    return tuple(structure) + tuple(element_structure[2:])


def model_values(leaf_specs: Sequence[Any], arrays: Sequence[Any]) -> list:
    """A batch's leaves as their specs say (:func:`model_structure`): sparse ones as ``tf.SparseTensor``.

    A SparseColumn under a dense spec is densified (once per batch), an
    array under a ``tf.SparseTensorSpec`` made sparse; the rest are returned
    as they are.
    """
    import tensorflow as tf

    values = [fed_value(array, isinstance(spec, tf.SparseTensorSpec)) for spec, array in zip(leaf_specs, arrays)]
    return values + list(arrays[len(values):])


def fed_value(array: Any, sparse: bool, dtype: Any = None) -> Any:
    """One leaf of a batch as a model input takes it: a ``tf.SparseTensor`` when ``sparse``, else an array.

    A SparseColumn is densified (the batch's records only) for a dense input;
    an array is returned as it is (``dtype``: cast) for a dense input.
    """
    if isinstance(array, SparseColumn):
        return array.to_tensor(dtype) if sparse else array.toarray(dtype)
    if dtype is not None:
        array = array.astype(dtype, copy=False)
    if not sparse:
        return array
    import tensorflow as tf

    return tf.sparse.from_dense(array)
