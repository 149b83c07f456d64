"""How a step's gradients travel between the workers: dense and fused, or as the rows they touch.

A training step (``training.worker.step``) hands its local gradients to this module
and gets back the global batch's. Two halves:

* :class:`GradientLayout`, in the step's graph: which gradients are dense and
  which are ``tf.IndexedSlices`` (an ``Embedding`` table's gradient holds only
  the rows the batch looked up), known when the step is traced. ``pack``
  turns the local gradients into what travels, :class:`ExchangedParts`: ONE
  float32 buffer of every dense gradient, flat, followed by the exact tail
  (the loss and the compiled metrics' states), and for each sparse gradient
  its row indices (int64, each once: duplicate lookups within the batch are
  summed first) and their rows. Gradients and loss are scaled by the
  worker's share of the global batch, so that sums over the workers are the
  record-weighted means. ``received``, ``dense_gradients``, ``loss``,
  ``metric_states`` and ``sparse_gradients`` read the global sums that come
  back: dense tensors and ``tf.IndexedSlices`` of the global batch's rows,
  each index once, as Keras' own train step hands the optimizer in one
  process (with repeated ids already summed, which is the gradient's true
  value; Keras 3's Adagrad and Adam would otherwise square each repeat on its
  own). The parts are a flat list only at ``tf.numpy_function``'s edge.
* :class:`GradientExchange`, in NumPy, called from the graph: sums those
  parts over the ranks. The dense buffer is all-reduced (its gradient part
  in ``compression``'s wire dtype, the tail exactly). For each sparse
  gradient the ranks first all-reduce how many rows each holds, then all
  take the same decision: the rows travel as they are (an all-gather of
  indices and rows, merged by index on every rank alike) unless the table
  would move fewer bytes dense, when the rows are scattered into the table
  and all-reduced with a mask of the rows touched. :func:`wire_bytes` counts
  what a rank sent.

Every rank ends with the same bits, so the weights stay identical everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from sparktf.collective import WIRE_DTYPES
from sparktf.collective.link import WireSeconds
from sparktf.optimizers.rows import sum_duplicate_rows
from sparktf.training.tables.rank_tables import RankTables
from sparktf.training.tables.row_sums import merge_rows

__all__ = ["ExchangedParts", "GradientExchange", "GradientLayout", "SparseTable", "Traffic", "wire_bytes"]

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
        """Dtypes of :meth:`ExchangedParts.flat`: the fused buffer, indices and rows per table, the finite flag."""
        return [tf.float32] + [tf.int64, tf.float32] * len(self.sparse) + [tf.float32]

    def pack(self, gradients: Sequence[Any], share: tf.Tensor, loss: tf.Tensor,
             metric_states: Sequence[tf.Tensor] = ()) -> "ExchangedParts":
        """What this worker sends (in the graph): its dense gradients, loss and metric states fused, its tables' rows.

        Gradients and loss are scaled by ``share``; the metric states travel
        as they are. A table's repeated indices are summed, so each index
        appears once.
        """
        dense = [tf.zeros([size], tf.float32) if gradients[i] is None
                 else tf.reshape(tf.cast(tf.convert_to_tensor(gradients[i]), tf.float32), [-1]) * share
                 for i, size in zip(self.dense_positions, self.dense_sizes)]
        fused = tf.concat(dense + [tf.reshape(tf.cast(loss, tf.float32), [1]) * share]
                          + [tf.reshape(tf.cast(t, tf.float32), [-1]) for t in metric_states], axis=0)
        rows = []
        for table in self.sparse:
            slices = gradients[table.position]
            indices, summed = sum_duplicate_rows(tf.cast(slices.indices, tf.int64), tf.cast(slices.values, tf.float32))
            rows.append((indices, summed * share))
        return ExchangedParts(fused, rows, tf.constant(1.0, tf.float32))

    def received(self, arrays: Sequence[tf.Tensor], fused_size: int) -> "ExchangedParts":
        """The global sums as they come back through the graph's edge (:meth:`ExchangedParts.flat`), with their
        static shapes."""
        parts = ExchangedParts.of_flat(arrays)
        parts.fused.set_shape([fused_size])
        for (indices, rows), table in zip(parts.rows, self.sparse):
            indices.set_shape([None])
            rows.set_shape([None, *table.shape[1:]])
        parts.finite.set_shape([])
        return parts

    def dense_gradients(self, fused: Any) -> Any:
        """The dense gradients' part of a fused buffer."""
        return fused[: self.gradient_size]

    def loss(self, fused: Any) -> Any:
        """The loss in a fused buffer."""
        return fused[self.gradient_size]

    def metric_states(self, fused: Any) -> Any:
        """The metric states' part of a fused buffer."""
        return fused[self.gradient_size + 1 :]

    def sparse_gradients(self, parts: "ExchangedParts") -> List[tf.IndexedSlices]:
        """Each table's global rows as the ``tf.IndexedSlices`` Keras hands an optimizer."""
        return [tf.IndexedSlices(rows, indices, tf.constant(table.shape, tf.int64))
                for (indices, rows), table in zip(parts.rows, self.sparse)]

    def gradients(self, dense_flat: tf.Tensor, sparse: Sequence[tf.IndexedSlices]) -> List[Any]:
        """Every variable's gradient, in variable order, from the dense part and the sparse ones."""
        gradients: List[Any] = [None] * len(self.shapes)
        pieces = tf.split(dense_flat, self.dense_sizes) if self.dense_sizes else []
        for position, piece in zip(self.dense_positions, pieces):
            gradients[position] = tf.reshape(piece, self.shapes[position])
        for table, slices in zip(self.sparse, sparse):
            gradients[table.position] = slices
        return gradients


@dataclass
class ExchangedParts:
    """What a step exchanges, in the graph (tensors) or in NumPy (arrays).

    Attributes
    ----------
    fused : tensor or array
        1-D float32: the dense gradients (``GradientLayout.gradient_size``
        values, the part compression applies to), then the exact tail: the
        loss, then the compiled metrics' states.
    rows : list of (indices, rows)
        Per table of ``GradientLayout.sparse``: its row indices (int64, each
        once) and their rows.
    finite : scalar
        1.0, or 0.0 when a sum the step does not see is not finite (a
        sharded table's rows, summed by their owners): then no rank applies
        the step.
    """

    fused: Any
    rows: List[Tuple[Any, Any]]
    finite: Any

    def flat(self) -> list:
        """The parts as one list, for ``tf.numpy_function``'s edge: ``fused``, indices and rows per table,
        ``finite``."""
        return [self.fused] + [part for pair in self.rows for part in pair] + [self.finite]

    @classmethod
    def of_flat(cls, arrays: Sequence[Any]) -> "ExchangedParts":
        """The parts from :meth:`flat`'s list."""
        return cls(arrays[0], [(arrays[k], arrays[k + 1]) for k in range(1, len(arrays) - 1, 2)], arrays[-1])


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
    sharded_tables : int
        Sharded tables' gradients sent to their owners.
    """

    steps: int = 0
    sent: float = 0.0
    dense: float = 0.0
    sparse_tables: int = 0
    dense_tables: int = 0
    sharded_tables: int = 0


class GradientExchange:
    """Sums a step's packed gradients over the ranks of ``communicator`` (see the module docstring).

    Parameters
    ----------
    communicator : Communicator, optional
        The ring; None (or one rank) leaves the arrays as they are.
    compression : {None, "bf16", "fp16"}
        The wire dtype of gradient values (dense gradients and rows); the
        loss and metric states always travel exactly.
    tables : RankTables, optional
        The rank's tables (``training.tables.rank_tables``; None: replicated):
        the rows of the tables their owners update go to the owners, exactly,
        and come back to the step as no rows; when an owner's sum is not
        finite, the result's ``finite`` is 0 on every rank, so that no rank
        applies the step.

    Attributes
    ----------
    traffic : Traffic
        What this rank sent, counted over the calls.
    """

    def __init__(self, communicator: Any = None, compression: Optional[str] = None,
                 tables: Optional[RankTables] = None):
        self._communicator = communicator
        self._rank_tables = tables or RankTables()
        self._compression = compression
        self._wire = np.dtype(np.float32) if compression is None else WIRE_DTYPES[compression]
        self._densified: dict = {}  # densified tables' buffers, by position, reused across steps
        self.traffic = Traffic()

    @property
    def world_size(self) -> int:
        """The number of ranks exchanging."""
        return 1 if self._communicator is None else self._communicator.world_size

    @property
    def wire_seconds(self) -> WireSeconds:
        """Seconds of this rank's ring traffic so far (see ``Communicator.wire_seconds``)."""
        return WireSeconds(0.0, 0.0, 0.0) if self._communicator is None else self._communicator.wire_seconds

    def __call__(self, layout: GradientLayout, parts: ExchangedParts) -> ExchangedParts:
        """The global sums of ``parts`` (``GradientLayout.pack``'s, in NumPy): the same on every rank."""
        if self.world_size == 1 and not self._rank_tables.positions:  # a lone owner of tables still routes their rows
            return parts
        comm = self._communicator
        fused = parts.fused if parts.fused.flags.writeable else parts.fused.copy()
        if self._compression is None:
            comm.allreduce(fused, op="sum")
        else:
            comm.allreduce(fused[:layout.gradient_size], op="sum", compression=self._compression)
            comm.allreduce(fused[layout.gradient_size:], op="sum")
        counts = np.zeros((self.world_size, len(layout.sparse)), np.int64)
        rows: List[Any] = [None] * len(layout.sparse)
        as_rows: List[int] = []
        sharded: List[int] = []
        finite = True
        if layout.sparse:
            counts[comm.rank] = [indices.size for indices, _ in parts.rows]
            comm.allreduce(counts, op="sum")
            sharded, finite = self._rank_tables.route_to_owners(layout, parts, rows)
            self.traffic.sharded_tables += len(sharded)
            for k, table in enumerate(layout.sparse):
                if k in sharded:
                    continue
                if self._travels_as_rows(table, int(counts[:, k].sum())):
                    as_rows.append(k)
                else:
                    rows[k] = self._densified_sum(table, *parts.rows[k])
            if as_rows:
                self._gather_rows(layout, parts, counts, as_rows, rows)
        sent, dense = wire_bytes(layout, fused.size, counts, sorted(as_rows + sharded), self._wire.itemsize, comm.rank)
        self.traffic.steps += 1
        self.traffic.sent += sent
        self.traffic.dense += dense
        return ExchangedParts(fused, rows, np.float32(finite))

    def _travels_as_rows(self, table: SparseTable, total_rows: int) -> bool:
        """Whether the rows move fewer bytes than the table (every rank decides alike from the same counts).

        The rows of all ranks go around the ring once, the table (and its
        row mask) twice.
        """
        row_bytes = table.row_size * self._wire.itemsize
        return total_rows * (row_bytes + _INDEX_BYTES) <= 2 * table.rows * (row_bytes + self._wire.itemsize)

    def _densified_sum(self, table: SparseTable, indices: np.ndarray, rows: np.ndarray) -> Tuple[np.ndarray,
                                                                                              np.ndarray]:
        """All-reduce the rows scattered into the table, with a mask of the rows any rank touched."""
        size = table.rows * table.row_size
        buffer = self._densified.get(table.position)
        if buffer is None:
            buffer = self._densified[table.position] = np.empty(size + table.rows, np.float32)
        buffer.fill(0.0)
        values, touched = buffer[:size].reshape(table.rows, -1), buffer[size:]
        values[indices] = rows.reshape(len(indices), -1)
        touched[indices] = 1.0
        self._communicator.allreduce(buffer, op="sum", compression=self._compression)
        where = np.flatnonzero(touched > 0.5).astype(np.int64)
        self.traffic.dense_tables += 1
        return where, values[where].reshape((len(where), *table.shape[1:]))

    def _gather_rows(self, layout: GradientLayout, parts: ExchangedParts, counts: np.ndarray, as_rows: List[int],
                     rows: List[Any]) -> None:
        """All-gather the indices and rows of the tables ``as_rows`` in one call and merge them into ``rows``."""
        comm, world, itemsize = self._communicator, self.world_size, self._wire.itemsize
        # per rank, per table: its indices (int64) then its rows (wire dtype), as bytes
        part_bytes = _row_part_bytes(layout, counts, as_rows, itemsize)
        part = np.empty(int(part_bytes[comm.rank].sum()), np.uint8)
        offset = 0
        for k in as_rows:
            indices, table_rows = parts.rows[k]
            end = offset + indices.size * _INDEX_BYTES
            part[offset:end] = indices.astype(np.int64, copy=False).view(np.uint8)
            offset, end = end, end + table_rows.size * itemsize
            part[offset:end] = np.ascontiguousarray(table_rows, self._wire).reshape(-1).view(np.uint8)
            offset = end
        received = comm.allgatherv(part, part_bytes.sum(axis=1))
        rank_offsets = np.concatenate(([0], np.cumsum(part_bytes.sum(axis=1))))
        for j, k in enumerate(as_rows):
            table = layout.sparse[k]
            all_indices, all_rows = [], []
            for rank in range(world):
                start = int(rank_offsets[rank] + part_bytes[rank, :j].sum())
                count = int(counts[rank, k])
                middle = start + count * _INDEX_BYTES
                all_indices.append(received[start:middle].view(np.int64))
                end = middle + count * table.row_size * itemsize
                all_rows.append(received[middle:end].view(self._wire).reshape(count, table.row_size))
            indices, merged = merge_rows(np.concatenate(all_indices),
                                         np.concatenate(all_rows).astype(np.float32, copy=False))
            rows[k] = (indices, merged.reshape((len(indices), *table.shape[1:])))
            self.traffic.sparse_tables += 1


def _row_part_bytes(layout: GradientLayout, counts: np.ndarray, as_rows: List[int], itemsize: int) -> np.ndarray:
    """Bytes each rank (row) sends of each table travelling as rows (column): its indices and its rows."""
    row_sizes = np.array([layout.sparse[k].row_size for k in as_rows], np.int64)
    return counts[:, as_rows] * (_INDEX_BYTES + row_sizes * itemsize)


def wire_bytes(layout: GradientLayout, fused_size: int, counts: np.ndarray, as_rows: List[int], itemsize: int,
               rank: int) -> Tuple[float, float]:
    """``(sent, dense)``: the bytes ``rank`` sends in one exchange, and what it would send with every table dense.

    Parameters
    ----------
    layout : GradientLayout
        The step's gradients.
    fused_size : int
        Values in the fused buffer (dense gradients, then the exact tail).
    counts : ndarray
        Rows per rank (row) and table (column).
    as_rows : list of int
        The tables (indices into ``layout.sparse``) that travelled as rows;
        the others were all-reduced dense with their row mask.
    itemsize : int
        Bytes of a gradient value on the wire.
    rank : int
        This rank.

    A ring all-reduce sends ``2 (world - 1) / world`` of its buffer from each
    rank; an all-gather sends every part but the right neighbour's.
    """
    world = counts.shape[0]
    ring_share = 2 * (world - 1) / world
    gradients, exact = layout.gradient_size, fused_size - layout.gradient_size
    sent = ring_share * (gradients * itemsize + exact * 4)
    dense = sent + ring_share * sum(t.rows * t.row_size for t in layout.sparse) * itemsize
    if layout.sparse:
        sent += ring_share * counts.nbytes
        sent += sum(ring_share * layout.sparse[k].rows * (layout.sparse[k].row_size + 1) * itemsize
                    for k in range(len(layout.sparse)) if k not in as_rows)
    if as_rows:
        part_bytes = _row_part_bytes(layout, counts, as_rows, itemsize)
        sent += float(part_bytes.sum() - part_bytes[(rank + 1) % world].sum())
    return sent, dense
