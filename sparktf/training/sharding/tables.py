"""A training rank's shards of the sharded tables: their rows, their optimizer's slots, looked up and updated each step.

The rank's model keeps each sharded table at its full shape, as a lookup
cache: before a step, :meth:`RankShards.fetch_rows` asks the owners for the
current rows of the batch's ids (an all-to-all) and writes them in; the
model's other rows may be stale, and the step reads none of them. The step's
row gradient of a sharded table goes to the owners (:meth:`RankShards.route`,
called by the gradient exchange), which sum it over the ranks and, once the
step's update is decided, apply it to their rows with an optimizer of their own
(:meth:`RankShards.apply`): a clone of the model's, built on the shard, whose
update of a row equals the model optimizer's (``docs/design/sharded-tables.md``,
"Measured before building"). It runs at every step, also without rows, so
its ``iterations`` (schedules, Adam's bias correction) keep pace.

At a segment's ends the state is full-shaped, as without sharding:
:meth:`RankShards.start` takes each rank's rows and slots from the model's,
:meth:`RankShards.finish` writes every rank's back into the model and its
optimizer before the state is captured. Checkpoints, resuming on another
number of workers and the driver's model after ``optimize`` are therefore
those of unsharded training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import keras
import numpy as np
import tensorflow as tf

from sparktf.training.gradient_exchange import merge_rows
from sparktf.training.sharding.plan import ShardedTable, ShardPlan
from sparktf.training.sparse_kernels import apply_rows
from sparktf.training.update_form import MIN_PADDED_ROWS, padded_rows, update_form

__all__ = ["RankShards"]


@dataclass
class _Shard:
    """One table's shard on this rank."""

    table: ShardedTable
    variable: Any  # the model's full-shaped table: the lookup cache
    position: int  # among the model's trainable variables
    start: int
    end: int
    rows: Any  # keras.Variable of the owned rows
    optimizer: Any  # the model optimizer's clone, built on ``rows``
    update: Any  # tf.function(slices) -> None
    write: Any  # tf.function(ids, rows): into the model's table, XLA-compiled
    pending: Optional[Tuple[np.ndarray, np.ndarray]] = None  # the step's summed rows: local ids, rows


class RankShards:
    """The shards rank ``rank`` owns of ``plan``'s tables, for ``model`` (built, compiled) and ``communicator``."""

    def __init__(self, plan: ShardPlan, model: Any, rank: int, communicator: Any):
        self._comm = communicator
        self._rank = rank
        trainable = {id(v): i for i, v in enumerate(model.trainable_variables)}
        names = [tensor.name for tensor in model.inputs]
        layers = {layer.name: layer for layer in model._flatten_layers(include_self=False)}
        self._shards: List[_Shard] = []
        for table in plan.tables:
            variable = layers[table.layer].embeddings
            start, end = table.owned(rank)
            rows = keras.Variable(np.zeros((end - start, *table.row_shape), np.float32), dtype=variable.dtype,
                                  name=f"{table.layer}_shard")
            optimizer = type(model.optimizer).from_config(model.optimizer.get_config())
            optimizer.build([rows])
            self._shards.append(_Shard(table, variable, trainable[id(variable)], start, end, rows, optimizer,
                                       _update_function(optimizer, rows), _write_function(variable)))
        self._input_names = names

    @property
    def positions(self) -> frozenset:
        """The sharded tables' positions among the model's trainable variables (the step leaves them alone)."""
        return frozenset(shard.position for shard in self._shards)

    def start(self, model: Any) -> None:
        """Take this rank's rows, slots and iteration count from ``model`` and its optimizer (the segment's start)."""
        main = model.optimizer
        for shard in self._shards:
            shard.rows.assign(shard.variable.value[shard.start:shard.end])
            mine = _slots(shard.optimizer, shard.rows)
            for kind, slot in _slots(main, shard.variable).items():
                mine[kind].assign(slot.value[shard.start:shard.end])
            shard.optimizer.iterations.assign(main.iterations)

    def fetch_rows(self, features: Any) -> None:
        """Write the owners' current rows of the batch's ids into the model's tables (before the step)."""
        for shard in self._shards:
            ids = np.unique(np.asarray(self._ids(features, shard), np.int64))
            requests, order = _by_owner(shard.table, ids)
            asked = self._alltoallv(requests)  # ids each rank asks this one for
            rows = [np.asarray(tf.gather(shard.rows.value, part - shard.start)) if part.size else
                    np.zeros((0, *shard.table.row_shape), np.float32) for part in asked]
            answers = self._alltoallv([row.astype(np.float32, copy=False) for row in rows])
            fetched = np.concatenate(answers).reshape((ids.size, *shard.table.row_shape))
            shard.write(*_padded(ids[order], fetched))

    def route(self, position: int, indices: np.ndarray, rows: np.ndarray) -> bool:
        """Send a sharded table's row gradient to the owners; keep the sum of what reaches this rank.

        Returns whether that sum is finite (a non-finite one must stop the update on every rank).
        """
        shard = next(s for s in self._shards if s.position == position)
        requests, order = _by_owner(shard.table, indices)
        flat_rows = rows.reshape(indices.size, -1)[order]
        counts = [part.size for part in requests]
        offsets = np.concatenate(([0], np.cumsum(counts)))
        sent_rows = [flat_rows[offsets[d]:offsets[d + 1]] for d in range(len(requests))]
        received_ids = self._alltoallv(requests)
        received_rows = self._alltoallv(sent_rows)
        ids, summed = merge_rows(np.concatenate(received_ids),
                                 np.concatenate(received_rows).reshape(-1, flat_rows.shape[1]))
        shard.pending = (ids - shard.start, summed.reshape((ids.size, *shard.table.row_shape)))
        return bool(np.isfinite(summed).all())

    def apply(self, clip: Optional[Tuple[float, float]] = None) -> None:
        """Apply the step's summed rows to this rank's shards (every step, also without rows)."""
        for shard in self._shards:
            ids, rows = shard.pending if shard.pending is not None else (
                np.zeros(0, np.int64), np.zeros((0, *shard.table.row_shape), np.float32))
            if clip is not None:
                rows = np.clip(rows, *clip)
            shard.update(tf.IndexedSlices(tf.constant(rows, tf.float32), tf.constant(ids, tf.int64),
                                          tf.constant([shard.end - shard.start, *shard.table.row_shape], tf.int64)))
            shard.pending = None

    def finish(self, model: Any) -> None:
        """Write every rank's rows and slots into ``model`` and its optimizer (before the state is captured)."""
        main = model.optimizer
        for shard in self._shards:
            shard.variable.assign(self._gathered(shard, shard.rows))
            mine = _slots(shard.optimizer, shard.rows)
            for kind, slot in _slots(main, shard.variable).items():
                slot.assign(self._gathered(shard, mine[kind]))

    def _gathered(self, shard: _Shard, variable: Any) -> np.ndarray:
        """Every rank's ``variable`` (its rows of ``shard``'s table) in row order, the table's shape."""
        mine = np.asarray(variable.value, np.float32)
        per_row = int(np.prod(mine.shape[1:], dtype=np.int64))
        counts = [(shard.table.owned(r)[1] - shard.table.owned(r)[0]) * per_row
                  for r in range(shard.table.world_size)]
        full = self._comm.allgatherv(mine.reshape(-1), counts)
        return full.reshape((shard.table.rows, *mine.shape[1:]))

    def _ids(self, features: Any, shard: _Shard) -> Any:
        if isinstance(features, dict):
            return features[shard.table.input_name]
        if isinstance(features, (list, tuple)):
            return features[self._input_names.index(shard.table.input_name)]
        return features

    def _alltoallv(self, parts: List[np.ndarray]) -> List[np.ndarray]:
        """An all-to-all of ``parts`` (this rank's, by destination), their counts all-gathered first."""
        world = len(parts)
        mine = np.array([part.size for part in parts], np.int64)
        counts = self._comm.allgatherv(mine, [world] * world).reshape(world, world)
        dtype = parts[0].dtype
        return self._comm.alltoallv([np.ascontiguousarray(part, dtype).reshape(-1) for part in parts], counts)


def _by_owner(table: ShardedTable, ids: np.ndarray) -> Tuple[List[np.ndarray], np.ndarray]:
    """``ids`` grouped by owner rank (each group in ``ids``' order), and the order that groups them."""
    owners = table.owners(ids)
    order = np.argsort(owners, kind="stable")
    grouped = ids[order]
    bounds = np.searchsorted(owners[order], np.arange(table.world_size + 1))
    return [grouped[bounds[r]:bounds[r + 1]] for r in range(table.world_size)], order


def _slots(optimizer: Any, variable: Any) -> Dict[str, Any]:
    """The optimizer's slot variables of ``variable``, by kind (``"momentum"``, ``"velocity"``, ...)."""
    prefix = variable.path.replace("/", "_") + "_"
    return {slot.name[len(prefix):]: slot for slot in optimizer.variables
            if slot.name.startswith(prefix) and slot.shape and slot.shape[0] == variable.shape[0]}


def _update_function(optimizer: Any, rows: Any) -> Any:
    """``update(slices)``: the optimizer's step on the shard, in the form ``update_form`` finds for it.

    ``"dense"`` (Adam, momentum: every row moves) and ``"padded"`` (SGD) are
    XLA-compiled, which fuses the passes over the shard; ``"kernel"`` is the
    optimizer's exact row update; anything else Keras' own update of the rows.
    """
    form = update_form(optimizer)
    shape = tuple(int(d) for d in rows.shape)
    slices_spec = tf.IndexedSlicesSpec([None, *shape[1:]], tf.float32, tf.int64, tf.int64, [None])
    if form == "kernel":
        def update(slices: tf.IndexedSlices) -> None:
            apply_rows(optimizer, rows, slices, unique_indices=True)
            optimizer.iterations.assign_add(1)

        return tf.function(update, input_signature=[slices_spec], autograph=False)
    if form == "rows":
        return tf.function(lambda slices: optimizer.apply([slices], [rows]), input_signature=[slices_spec],
                           autograph=False)
    dense = form == "dense"
    spec = tf.TensorSpec(shape, tf.float32) if dense else slices_spec
    compiled = tf.function(lambda gradient: optimizer.apply([gradient], [rows]), input_signature=[spec],
                           jit_compile=True, autograph=False)
    return tf.function(lambda slices: compiled(tf.convert_to_tensor(slices) if dense else padded_rows(slices, shape[0])),
                       input_signature=[slices_spec], autograph=False)


def _write_function(variable: Any) -> Any:
    """``write(ids, rows)`` into ``variable``, XLA-compiled: TensorFlow's own row writes would switch the table
    to copy-on-read, and the model's every lookup would then copy it whole (see ``update_form``)."""
    shape = tuple(int(d) for d in variable.shape)
    return tf.function(lambda ids, rows: variable.value.scatter_update(tf.IndexedSlices(rows, ids)),
                       input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, *shape[1:]], tf.float32)],
                       jit_compile=True, autograph=False)


def _padded(ids: np.ndarray, rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``ids`` and ``rows`` repeated from the first to the next power of two (at least ``MIN_PADDED_ROWS``):
    the compiled write sees a handful of shapes, and writing a row twice changes nothing."""
    if ids.size == 0:
        return ids, rows
    target = max(MIN_PADDED_ROWS, 1 << int(np.ceil(np.log2(ids.size))))
    extra = target - ids.size
    return (np.concatenate([ids, np.full(extra, ids[0], ids.dtype)]),
            np.concatenate([rows, np.repeat(rows[:1], extra, axis=0)]))
