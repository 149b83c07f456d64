"""How a step's gradients travel between the workers: dense and fused, or as the rows they touch.

A training step (``training.step``) hands its local gradients to this module
and gets back the global batch's. Two halves:

* :class:`GradientLayout`, in the step's graph: which gradients are dense and
  which are ``tf.IndexedSlices`` (an ``Embedding`` table's gradient holds only
  the rows the batch looked up), known when the step is traced. ``pack``
  turns the local gradients into the arrays that travel: ONE float32 buffer
  of every dense gradient, flat, followed by the exact tail (the loss and
  the compiled metrics' states), and for each sparse gradient its row
  indices (int64, each once: duplicate lookups within the batch are summed
  first) and their rows. Gradients and loss are scaled by the worker's share
  of the global batch, so that sums over the workers are the record-weighted
  means. ``unpack`` turns the arrays that come back into the global
  gradients: dense tensors and ``tf.IndexedSlices`` of the global batch's
  rows, each index once, as Keras' own train step hands the optimizer in one
  process (with repeated ids already summed, which is the gradient's true
  value; Keras 3's Adagrad and Adam would otherwise square each repeat on its
  own).
* :class:`GradientExchange`, in NumPy, called from the graph: sums those
  arrays over the ranks. The dense buffer is all-reduced (its gradient part
  in ``compression``'s wire dtype, the tail exactly). For each sparse
  gradient the ranks first all-reduce how many rows each holds, then all
  take the same decision: the rows travel as they are (an all-gather of
  indices and rows, merged by index on every rank alike) unless the table
  would move fewer bytes dense, when the rows are scattered into the table
  and all-reduced with a mask of the rows touched.

Every rank ends with the same bits, so the weights stay identical everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from sparktf.collective import WIRE_DTYPES

__all__ = ["GradientExchange", "GradientLayout", "SparseTable", "Traffic", "merge_rows"]

_INDEX_BYTES = 8


@dataclass(frozen=True)
class SparseTable:
    """A variable whose gradient is a ``tf.IndexedSlices`` (rows of a table).

    Attributes
    ----------
    position : int
        Its index among the step's trainable variables.
    shape : tuple of int
        The variable's shape: rows, then a row's shape.
    """

    position: int
    shape: Tuple[int, ...]

    @property
    def rows(self) -> int:
        """The table's number of rows."""
        return int(self.shape[0])

    @property
    def row_size(self) -> int:
        """Elements in one row."""
        return int(np.prod(self.shape[1:], dtype=np.int64))


class GradientLayout:
    """Which of a step's gradients travel dense and which as rows, and how they are packed.

    Parameters
    ----------
    variables : list of tf.Variable
        The trainable variables, in the order of ``gradients``.
    gradients : list
        Their gradients as the tape gave them while tracing (a tensor, a
        ``tf.IndexedSlices`` or None).

    Attributes
    ----------
    sparse : list of SparseTable
        The variables whose gradients travel as rows.
    gradient_size : int
        Elements of the dense gradients, the fused buffer's first part (the
        part compression applies to); the exact tail follows.
    """

    def __init__(self, variables: Sequence[Any], gradients: Sequence[Any]):
        self.shapes = [tuple(int(d) for d in v.shape) for v in variables]
        self.sparse = [SparseTable(i, self.shapes[i]) for i, g in enumerate(gradients)
                       if isinstance(g, tf.IndexedSlices) and len(self.shapes[i]) >= 1]
        sparse_positions = {table.position for table in self.sparse}
        self.dense_positions = [i for i in range(len(variables)) if i not in sparse_positions]
        self.dense_sizes = [int(np.prod(self.shapes[i], dtype=np.int64)) for i in self.dense_positions]
        self.gradient_size = sum(self.dense_sizes)

    @property
    def output_types(self) -> List[tf.DType]:
        """Dtypes of the arrays that travel: the fused buffer, then indices and rows per sparse table."""
        return [tf.float32] + [tf.int64, tf.float32] * len(self.sparse)

    def pack(self, gradients: Sequence[Any], share: tf.Tensor, tail: Sequence[tf.Tensor],
             exact_tail: Sequence[tf.Tensor] = ()) -> List[tf.Tensor]:
        """The arrays to exchange (in the graph): fused dense gradients and tail, then each table's rows.

        ``gradients`` and ``tail`` (the loss) are scaled by ``share``;
        ``exact_tail`` (the metric states) travels as it is.
        """
        dense = [tf.zeros([size], tf.float32) if gradients[i] is None
                 else tf.reshape(tf.cast(tf.convert_to_tensor(gradients[i]), tf.float32), [-1]) * share
                 for i, size in zip(self.dense_positions, self.dense_sizes)]
        fused = tf.concat(dense + [tf.reshape(tf.cast(t, tf.float32), [-1]) * share for t in tail]
                          + [tf.reshape(tf.cast(t, tf.float32), [-1]) for t in exact_tail], axis=0)
        arrays = [fused]
        for table in self.sparse:
            slices = gradients[table.position]
            indices, positions = tf.unique(tf.cast(slices.indices, tf.int64))
            rows = tf.math.unsorted_segment_sum(tf.cast(slices.values, tf.float32), positions, tf.size(indices))
            arrays += [indices, rows * share]
        return arrays

    def unpack(self, arrays: Sequence[tf.Tensor], fused_size: int) -> Tuple[tf.Tensor, List[tf.IndexedSlices]]:
        """``(fused buffer, sparse gradients)`` from the exchanged arrays (in the graph), with their static shapes."""
        fused = arrays[0]
        fused.set_shape([fused_size])
        sparse = []
        for k, table in enumerate(self.sparse):
            indices, rows = arrays[1 + 2 * k], arrays[2 + 2 * k]
            indices.set_shape([None])
            rows.set_shape([None, *table.shape[1:]])
            sparse.append(tf.IndexedSlices(rows, indices, tf.constant(table.shape, tf.int64)))
        return fused, sparse

    def gradients(self, dense_flat: tf.Tensor, sparse: Sequence[tf.IndexedSlices]) -> List[Any]:
        """Every variable's gradient, in variable order, from the dense part and the sparse ones."""
        gradients: List[Any] = [None] * len(self.shapes)
        pieces = tf.split(dense_flat, self.dense_sizes) if self.dense_sizes else []
        for position, piece in zip(self.dense_positions, pieces):
            gradients[position] = tf.reshape(piece, self.shapes[position])
        for table, slices in zip(self.sparse, sparse):
            gradients[table.position] = slices
        return gradients


def merge_rows(indices: np.ndarray, rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Sum the rows of equal indices: ``(sorted unique indices, their summed rows)``.

    The sums run in the order the rows come (a stable sort), so every rank
    that merges the same arrays gets the same bits. Made for the rows of a
    few ranks, each holding an index at most once: an index repeats a few
    times at most, and the sum adds its k-th rows for each k in turn.
    """
    if indices.size == 0:
        return indices, rows
    order = np.argsort(indices, kind="stable")
    ordered = indices[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    lengths = np.diff(np.append(starts, ordered.size))
    summed = rows[order[starts]]
    for k in range(1, int(lengths.max())):
        repeated = lengths > k
        summed[repeated] += rows[order[starts[repeated] + k]]
    return ordered[starts], summed


@dataclass
class Traffic:
    """Bytes one rank sent over the exchanges so far, and what the dense path would have sent.

    Attributes
    ----------
    steps : int
        Exchanges counted.
    sent : float
        Bytes this rank sent.
    dense : float
        Bytes it would have sent with every gradient dense (the table too).
    sparse_tables, dense_tables : int
        Sparse gradients exchanged as rows, and densified.
    """

    steps: int = 0
    sent: float = 0.0
    dense: float = 0.0
    sparse_tables: int = 0
    dense_tables: int = 0


class GradientExchange:
    """Sums a step's packed gradients over the ranks of ``communicator`` (see the module docstring).

    Parameters
    ----------
    communicator : Communicator, optional
        The ring; None (or one rank) leaves the arrays as they are.
    compression : {None, "bf16", "fp16"}
        The wire dtype of gradient values (dense gradients and rows); the
        loss and metric states always travel exactly.

    Attributes
    ----------
    traffic : Traffic
        What this rank sent, counted over the calls.
    """

    def __init__(self, communicator: Any = None, compression: Optional[str] = None):
        self._communicator = communicator
        self._compression = compression
        self._wire = np.dtype(np.float32) if compression is None else WIRE_DTYPES[compression]
        self._tables: dict = {}  # densified tables' buffers, by position, reused across steps
        self.traffic = Traffic()

    @property
    def world_size(self) -> int:
        """The number of ranks exchanging."""
        return 1 if self._communicator is None else self._communicator.world_size

    def __call__(self, layout: GradientLayout, arrays: List[np.ndarray]) -> List[np.ndarray]:
        """The global sums of ``arrays`` (``GradientLayout.pack``'s, as NumPy): the same on every rank."""
        if self.world_size == 1:
            return arrays
        comm, world = self._communicator, self.world_size
        fused = arrays[0] if arrays[0].flags.writeable else arrays[0].copy()
        if self._compression is None:
            comm.allreduce(fused, op="sum")
        else:
            comm.allreduce(fused[:layout.gradient_size], op="sum", compression=self._compression)
            comm.allreduce(fused[layout.gradient_size:], op="sum")
        ring_share = 2 * (world - 1) / world
        exact_bytes = (fused.size - layout.gradient_size) * 4
        sent = ring_share * (layout.gradient_size * self._wire.itemsize + exact_bytes)
        dense = sent + ring_share * sum(t.rows * t.row_size for t in layout.sparse) * self._wire.itemsize
        outputs = [fused]
        if layout.sparse:
            counts = np.zeros((world, len(layout.sparse)), np.int64)
            counts[comm.rank] = [arrays[1 + 2 * k].size for k in range(len(layout.sparse))]
            comm.allreduce(counts, op="sum")
            sent += ring_share * counts.nbytes
            gathered = []
            for k, table in enumerate(layout.sparse):
                indices, rows = arrays[1 + 2 * k], arrays[2 + 2 * k]
                if self._travels_as_rows(table, int(counts[:, k].sum())):
                    gathered.append((k, table, indices, rows))
                    outputs += [None, None]
                else:
                    outputs += self._densified_sum(table, indices, rows)
                    sent += ring_share * table.rows * (table.row_size + 1) * self._wire.itemsize
            if gathered:
                sent += self._gather_rows(gathered, counts, outputs)
        self.traffic.steps += 1
        self.traffic.sent += sent
        self.traffic.dense += dense
        return outputs

    def _travels_as_rows(self, table: SparseTable, total_rows: int) -> bool:
        """Whether the rows move fewer bytes than the table (every rank decides alike from the same counts).

        The rows of all ranks go around the ring once, the table (and its
        row mask) twice.
        """
        row_bytes = table.row_size * self._wire.itemsize
        return total_rows * (row_bytes + _INDEX_BYTES) <= 2 * table.rows * (row_bytes + self._wire.itemsize)

    def _densified_sum(self, table: SparseTable, indices: np.ndarray, rows: np.ndarray) -> List[np.ndarray]:
        """All-reduce the rows scattered into the table, with a mask of the rows any rank touched."""
        size = table.rows * table.row_size
        buffer = self._tables.get(table.position)
        if buffer is None:
            buffer = self._tables[table.position] = np.empty(size + table.rows, np.float32)
        buffer.fill(0.0)
        values, touched = buffer[:size].reshape(table.rows, -1), buffer[size:]
        values[indices] = rows.reshape(len(indices), -1)
        touched[indices] = 1.0
        self._communicator.allreduce(buffer, op="sum", compression=self._compression)
        where = np.flatnonzero(touched > 0.5).astype(np.int64)
        self.traffic.dense_tables += 1
        return [where, values[where].reshape((len(where), *table.shape[1:]))]

    def _gather_rows(self, gathered: list, counts: np.ndarray, outputs: List[Any]) -> float:
        """All-gather the row tables' indices and rows in one call, merge them; the bytes this rank sent."""
        comm, world = self._communicator, self.world_size
        row_sizes = [table.row_size for _, table, _, _ in gathered]
        columns = [k for k, _, _, _ in gathered]
        # per rank, per table: its indices (int64) then its rows (wire dtype), as bytes
        part_bytes = counts[:, columns] * (_INDEX_BYTES + np.array(row_sizes) * self._wire.itemsize)
        part = np.empty(int(part_bytes[comm.rank].sum()), np.uint8)
        offset = 0
        for k, table, indices, rows in gathered:
            end = offset + indices.size * _INDEX_BYTES
            part[offset:end] = indices.astype(np.int64, copy=False).view(np.uint8)
            offset, end = end, end + rows.size * self._wire.itemsize
            part[offset:end] = np.ascontiguousarray(rows, self._wire).reshape(-1).view(np.uint8)
            offset = end
        received = comm.allgatherv(part, part_bytes.sum(axis=1))
        rank_offsets = np.concatenate(([0], np.cumsum(part_bytes.sum(axis=1))))
        for j, (k, table, _, _) in enumerate(gathered):
            all_indices, all_rows = [], []
            for rank in range(world):
                start = int(rank_offsets[rank] + part_bytes[rank, :j].sum())
                count = int(counts[rank, k])
                middle = start + count * _INDEX_BYTES
                all_indices.append(received[start:middle].view(np.int64))
                end = middle + count * table.row_size * self._wire.itemsize
                all_rows.append(received[middle:end].view(self._wire).reshape(count, table.row_size))
            indices, rows = merge_rows(np.concatenate(all_indices),
                                       np.concatenate(all_rows).astype(np.float32, copy=False))
            outputs[1 + 2 * k] = indices
            outputs[2 + 2 * k] = rows.reshape((len(indices), *table.shape[1:]))
            self.traffic.sparse_tables += 1
        right = (comm.rank + 1) % world
        return float(part_bytes.sum() - part_bytes[right].sum())
