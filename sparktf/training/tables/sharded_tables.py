"""A training rank's shards of the sharded tables: their rows and optimizer state, looked up and updated each step.

The rank trains a copy of the model whose sharded tables are **working
tables** of ``capacity`` rows (:func:`working_model`): before a step,
:meth:`RankShards.lookup` replaces the batch's ids by their positions
among its unique ids, asks the owners for those rows (an all-to-all) and
writes them into the working table. The step's row gradient of a working
table goes back to the owners of the ids (:meth:`RankShards.route`, called by
the gradient exchange), which sum it over the ranks and, once the step's
update is decided, apply it to their rows with an optimizer of their own
(:meth:`RankShards.apply`): a clone of the model's, built on the shard, whose
update of a row equals the model optimizer's (``docs/design/sharded-tables.md``,
"Measured before building"). It runs at every step, also without rows, so its
``iterations`` (schedules, Adam's bias correction) keep pace.

No rank holds a whole sharded table: the rank builds its model from the
payload with working tables (:func:`working_model`), fetches only its rows of
the tables with the segment's start state (:func:`state_rows` names them;
:func:`apply_start_state` hands them to :meth:`RankShards.start`), and hands
back only those rows at the segment's end (:meth:`RankShards.captured_state`),
which the driver joins into its model's full tables
(``training.state_source``). The tables' optimizer state never reach the
driver: each rank reads its rows of them from the files the ranks of the last
segment wrote, and writes them at the segment's end
(:mod:`~sparktf.training.tables.optimizer_state_store`); the states the driver holds
and checkpoints leave them out (:func:`optimizer_state_positions`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

from sparktf.models.cache import derived
from sparktf.models.keras_internals import row_state_variables, tracked_variables
from sparktf.models.payload import ModelPayload
from sparktf.training.checkpoint import ModelState, RowRanges
from sparktf.training.clipping import GradientClipping
from sparktf.training.tables.compiled_update import MIN_PADDED_ROWS, update_in_form
from sparktf.training.tables.lookups import input_names
from sparktf.training.tables.optimizer_state_store import (optimizer_state_folder, read_optimizer_state_rows,
                                                           write_manifest, write_optimizer_state_rows)
from sparktf.training.tables.plan import ShardedTable, ShardPlan, embedding_layers
from sparktf.training.tables.dynamic_tables import DynamicTables
from sparktf.training.tables.rank_tables import RankTables
from sparktf.training.tables.row_sums import merge_rows
from sparktf.training.tables.sparse_kernels import apply_rows
from sparktf.training.tables.update_form import TableUpdates

__all__ = ["RankShards", "HeldTables", "apply_start_state", "apply_without_optimizer_state", "without_optimizer_state",
           "optimizer_state_positions", "state_rows", "table_indices", "working_features", "working_model"]

#: Per sharded layer: the rank's rows of its table, from the segment's start state.
HeldTables = Dict[str, np.ndarray]


def working_model(payload: ModelPayload, plan: ShardPlan, local_batch: int) -> Any:
    """The model of ``payload`` (one without weights) built with working tables of ``local_batch`` records' ids
    for its sharded tables: the whole tables are never built on a worker."""
    return payload.build(plan.capacities(local_batch))


def working_features(plan: ShardPlan, model: Any, features: Any) -> Tuple[Any, List[np.ndarray]]:
    """``(features with each sharded table's ids replaced by positions, each table's unique ids)``.

    Tables looked up by the same ids (an input, or one column of it) share their unique ids and positions.
    """
    names = input_names(model)
    replaced = dict(features) if isinstance(features, dict) else list(features) if isinstance(
        features, (list, tuple)) else [features]
    original = dict(replaced) if isinstance(replaced, dict) else list(replaced)
    looked_up: Dict[Tuple[str, Optional[int]], np.ndarray] = {}
    for table in plan.tables:
        if (table.input_name, table.column) in looked_up:
            continue
        key = table.input_name if isinstance(replaced, dict) else names.index(table.input_name)
        ids = np.asarray(original[key])
        if table.column is not None:
            ids = ids[:, table.column]
        values, positions = np.unique(ids.astype(np.int64), return_inverse=True)
        positions = positions.reshape(ids.shape).astype(ids.dtype)
        if table.column is None:
            replaced[key] = positions
        else:
            if replaced[key] is original[key]:  # the batch's array is the caller's: change a copy
                replaced[key] = np.array(original[key])
            replaced[key][:, table.column] = positions
        looked_up[(table.input_name, table.column)] = values
    unique = [looked_up[(table.input_name, table.column)] for table in plan.tables]
    if isinstance(features, (dict, list)):
        return replaced, unique
    return (tuple(replaced) if isinstance(features, tuple) else replaced[0]), unique


def state_rows(model: Any, plan: ShardPlan, rank: int) -> RowRanges:
    """The rows of the model state's arrays (by index among the weights) that rank ``rank`` holds of the working
    ``model``'s sharded tables; the other arrays it holds whole."""
    owned = {table.layer: table.owned(rank) for table in plan.tables}
    return {index: owned[layer] for index, layer in table_indices(model, plan).items()}


def optimizer_state_positions(model: Any, layers: Sequence[str]) -> Dict[int, Tuple[str, str]]:
    """``index -> (layer, state kind)``: where ``model``'s state (weights, then optimizer variables) has its
    optimizer state of the tables of the ``Embedding`` ``layers``, which a state without them (the driver's)
    leaves out."""
    found = embedding_layers(model)
    owners = _optimizer_state_owners(model.optimizer, {id(found[layer].embeddings): layer for layer in layers})
    offset = len(model.weights)
    return {offset + k: owners[id(v)] for k, v in enumerate(model.optimizer.variables) if id(v) in owners}


def without_optimizer_state(state: ModelState, indices: Sequence[int]) -> ModelState:
    """``state`` without the optimizer variables at ``indices`` (of ``weights + optimizer_variables``,
    :func:`optimizer_state_positions`): a model's whose sharded tables' optimizer state is in files, as the driver
    holds it."""
    count, dropped = len(state.weights), set(indices)
    kept = [value for k, value in enumerate(state.optimizer_variables) if count + k not in dropped]
    return dataclasses.replace(state, weights=list(state.weights), optimizer_variables=kept)


def _with_placeholders(state: ModelState, indices: Sequence[int]) -> ModelState:
    """The inverse of :func:`without_optimizer_state`: empty arrays at ``indices``, for ``apply_to(..., keep)`` to
    skip."""
    count, values, empty = len(state.weights), iter(state.optimizer_variables), set(indices)
    total = len(state.optimizer_variables) + len(empty)
    filled = [np.zeros(0, np.float32) if count + k in empty else next(values) for k in range(total)]
    return dataclasses.replace(state, weights=list(state.weights), optimizer_variables=filled)


def apply_without_optimizer_state(state: ModelState, model: Any, positions: Dict[int, Tuple[str, str]],
                                  keep: frozenset = frozenset()) -> Dict[int, np.ndarray]:
    """Assign a ``state`` without the optimizer state at ``positions`` (:func:`optimizer_state_positions`: the
    driver's) to ``model``, whose optimizer has it: that optimizer state is left as it is, and so are the variables
    whose ``id`` is in ``keep``, whose values are returned by ``id`` (``ModelState.apply_to``)."""
    offset = len(model.weights)
    table_state = frozenset(id(model.optimizer.variables[index - offset]) for index in positions)
    return _with_placeholders(state, list(positions)).apply_to(model, keep | table_state)


def apply_start_state(state: ModelState, model: Any, plan: ShardPlan) -> HeldTables:
    """Assign the segment's start ``state`` (the driver's: the sharded tables cut to the rank's rows, as
    :func:`state_rows` says, and without their optimizer state) to the working ``model``, but for those rows, which are
    returned (:meth:`RankShards.start` keeps them)."""
    working = _working_variables(model, plan)
    positions = optimizer_state_positions(model, [table.layer for table in plan.tables])
    kept = apply_without_optimizer_state(state, model, positions, frozenset(working))
    return {layer: kept[variable] for variable, layer in working.items()}


@dataclass
class _Shard:
    """One table's shard on this rank."""

    table: ShardedTable
    working: Any  # the working model's table: the step's rows
    position: int  # among the model's trainable variables
    start: int
    end: int
    rows: Any  # keras.Variable of the owned rows
    optimizer: Any  # the model optimizer's clone, built on ``rows``
    update: Any  # update([slices]) -> None
    gather: Any  # tf.function(local ids) -> their rows
    initial: Dict[str, np.ndarray]  # a fresh optimizer-state row, by kind
    ids: Optional[np.ndarray] = None  # the step's unique ids: working-table position -> id
    pending: Optional[Tuple[np.ndarray, np.ndarray]] = None  # the step's summed rows: local ids, rows


class RankShards(RankTables):
    """The shards rank ``rank`` owns of ``plan``'s tables, for the working ``model`` and ``communicator``; their
    optimizer state goes to folders under ``optimizer_state_root`` at the segment's end (None: nowhere).

    ``kept`` (a dict that lives as long as the working model) keeps the shards' variables, optimizers and
    compiled functions by table, for the next segment with the same plan, whichever rank this process then is
    (Spark may give the ranks each other's Python workers): every rank's shard has the same rows, so only their
    values change, and a process never holds two ranks' shards.
    """

    lookup_phase = "lookup"

    def __init__(self, plan: ShardPlan, model: Any, rank: int, communicator: Any, kept: Optional[dict] = None,
                 updates: Optional[TableUpdates] = None, optimizer_state_root: Optional[str] = None):
        super().__init__(derived(model, "dynamic-tables", DynamicTables), communicator)
        self._comm = communicator
        self._optimizer_state_root = optimizer_state_root
        self._plan = plan
        self._model = model
        updates = updates or TableUpdates.probe(model.optimizer)  # given: as the driver probed them
        self._shards = _shards(plan, model, rank, {} if kept is None else kept, updates.form())
        self._by_layer = {shard.table.layer: shard for shard in self._shards}

    @property
    def positions(self) -> frozenset:
        """The working tables' positions among the model's trainable variables (the step leaves them alone)."""
        return frozenset(shard.position for shard in self._shards)

    def start(self, held: HeldTables, folder: Optional[str]) -> None:
        """Keep this rank's rows of the segment's start state (``held``) and read its rows of their optimizer state
        from ``folder`` (None: fresh optimizer state); give each shard's optimizer the model optimizer's own
        variables (its iteration count, a learning rate set between segments, e.g. by a
        ``LearningRateScheduler``), which the start state gave the model.

        Raises
        ------
        StorageError
            The folder lacks some of the rank's rows.
        """
        own = {variable.name: variable for variable in self._model.optimizer.variables if len(variable.shape) == 0}
        for shard in self._shards:
            count = shard.table.rows_per_rank
            shard.rows.assign(_padded(held[shard.table.layer], count))
            variables = row_state_variables(shard.optimizer, shard.rows)
            stored = read_optimizer_state_rows(folder, shard.table.layer, shard.start, shard.end,
                                               sorted(variables)) if folder and shard.end > shard.start else {}
            for kind, state_variable in variables.items():
                state_variable.assign(_padded(stored[kind], count) if kind in stored else
                                      np.broadcast_to(shard.initial[kind], (count, *shard.table.row_shape)))
            for variable in shard.optimizer.variables:
                if len(variable.shape) == 0:  # the shard is 2-D: its optimizer's scalars are its own, not per-row state
                    variable.assign(own[variable.name])

    def lookup(self, features: Any) -> Any:
        """The batch's features with working-table positions for ids; the owners' rows written into the working
        tables (before the step), and the dynamic tables' global ids observed."""
        features = super().lookup(features)
        features, unique = working_features(self._plan, self._model, features)
        grouped = [_by_owner(shard.table, ids) for shard, ids in zip(self._shards, unique)]
        asked, counts = self._alltoallv([requests for requests, _ in grouped])  # the ids each rank asks this one
        widths = np.array([math.prod(shard.table.row_shape) for shard in self._shards], np.int64)
        answers, _ = self._alltoallv([[_gathered_rows(shard, part - shard.start) for part in parts]
                                      for shard, parts in zip(self._shards, asked)],
                                     counts.transpose(1, 0, 2) * widths)  # a row for each id asked, back
        for shard, ids, (_, order), rows in zip(self._shards, unique, grouped, answers):
            shard.ids = ids
            working = np.zeros(tuple(int(d) for d in shard.working.shape), np.float32)
            working[order] = np.concatenate(rows).reshape((ids.size, *shard.table.row_shape))
            shard.working.assign(working)
        return features

    def route(self, gradients: Sequence[Tuple[int, np.ndarray, np.ndarray]]) -> bool:
        """Send the working tables' row gradients ``(position, indices, rows)`` to the owners of their ids; keep
        the sums of what reaches this rank.

        Returns whether those sums are finite (a non-finite one must stop the update on every rank).
        """
        shards = {shard.position: shard for shard in self._shards}
        sent_ids, sent_rows, widths = [], [], []
        for position, indices, rows in gradients:
            shard = shards[position]
            ids = shard.ids[indices]
            requests, order = _by_owner(shard.table, ids)
            flat = rows.reshape(ids.size, -1)[order]
            offsets = np.concatenate(([0], np.cumsum([part.size for part in requests])))
            sent_ids.append(requests)
            sent_rows.append([flat[offsets[d]:offsets[d + 1]] for d in range(len(requests))])
            widths.append(flat.shape[1])
        finite = True
        received_ids, counts = self._alltoallv(sent_ids)
        received_rows, _ = self._alltoallv(sent_rows, counts * np.array(widths, np.int64))  # a row for each id
        for (position, _, _), ids, rows, width in zip(gradients, received_ids, received_rows, widths):
            shard = shards[position]
            owned, summed = merge_rows(np.concatenate(ids), np.concatenate(rows).reshape(-1, width))
            shard.pending = (owned - shard.start, summed.reshape((owned.size, *shard.table.row_shape)))
            finite = finite and bool(np.isfinite(summed).all())
        return finite

    def route_to_owners(self, layout: Any, parts: Any, rows: List[Any]) -> Tuple[List[int], bool]:
        """Send the sharded tables' rows of the step (``parts.rows``, as ``layout.sparse`` lists the tables) to
        their owners; ``rows`` gets none back for them. Which they are, and whether every owner's sum is finite
        (on every rank)."""
        sharded = [k for k, table in enumerate(layout.sparse) if table.position in self.positions]
        finite = np.array([self.route([(layout.sparse[k].position, *parts.rows[k]) for k in sharded])
                           if sharded else True], np.int32)
        self._comm.allreduce(finite, op="sum")
        for k in sharded:
            rows[k] = (np.zeros(0, np.int64), np.zeros((0, *layout.sparse[k].shape[1:]), np.float32))
        return sharded, bool(finite[0] == self._comm.world_size)

    def apply(self, clipping: GradientClipping = GradientClipping()) -> None:
        """Apply the step's summed rows, clipped, to this rank's shards (every step, also without rows)."""
        for shard in self._shards:
            ids, rows = shard.pending if shard.pending is not None else (
                np.zeros(0, np.int64), np.zeros((0, *shard.table.row_shape), np.float32))
            rows = clipping.apply_to_rows(rows)
            shard.update([tf.IndexedSlices(tf.constant(rows, tf.float32), tf.constant(ids, tf.int64),
                                           tf.constant([shard.table.rows_per_rank, *shard.table.row_shape], tf.int64))])
            shard.pending = None

    def finish(self, model: Any, iteration: int, rank: int, launch_secret: bytes,
               channel: bool) -> Tuple[Optional[ModelState], RowRanges]:
        """Every rank writes its rows of the tables' optimizer state to a new folder (the state names it) and hands
        back its rows of the tables, which the job ``channel`` joins; without a channel, the ranks gather them
        through the ring for rank 0's."""
        folder = self.save_optimizer_state(self._optimizer_state_root, iteration, launch_secret)
        if channel:
            state, rows = self.captured_state(iteration)
        else:
            state, rows = self.gathered_state(iteration), {}  # a collective: every rank takes part
        state.optimizer_state_folder = folder  # the driver's next state names it (its own capture says which tables)
        return (state if rank == 0 or channel else None), rows

    def save_optimizer_state(self, root: Optional[str], iteration: int, launch_secret: bytes) -> Optional[str]:
        """Write this rank's rows of the tables' optimizer state to the launch's folder of ``iteration`` under
        ``root`` (the segment's end), rank 0 the folder's manifest once every rank has, and return the folder
        (None: no ``root``, the optimizer keeps no state per row)."""
        if root is None:
            return None
        folder = optimizer_state_folder(root, iteration, launch_secret)
        pieces = []
        for shard in self._shards:
            pieces += write_optimizer_state_rows(folder, shard.table.layer, shard.start, shard.end, {
                kind: np.asarray(variable.value, np.float32)[:shard.end - shard.start]
                for kind, variable in row_state_variables(shard.optimizer, shard.rows).items()})
        everyone = self._comm.allgather_object(pieces)  # returns once every rank has written its pieces
        if self._comm.rank == 0:
            write_manifest(folder, iteration, [piece for rank_pieces in everyone for piece in rank_pieces])
        return folder

    def captured_state(self, iteration: int) -> Tuple[ModelState, RowRanges]:
        """The model's state as the driver holds it (without the sharded tables' optimizer state) with this rank's
        rows of each sharded table in place of the working tables, and those arrays' rows (:func:`state_rows`)."""
        state = without_optimizer_state(ModelState.capture(self._model, iteration),
            optimizer_state_positions(self._model, [table.layer for table in self._plan.tables]))
        ranges = {}
        for index, layer in table_indices(self._model, self._plan).items():
            shard = self._by_layer[layer]
            state.set_array(index, np.asarray(shard.rows.value, np.float32)[:shard.end - shard.start])
            ranges[index] = (shard.start, shard.end)
        return state, ranges

    def gathered_state(self, iteration: int) -> ModelState:
        """The driver's state, every rank's rows of the tables gathered on every rank (a collective; without a job
        channel to take each rank's)."""
        state, _ = self.captured_state(iteration)
        for index, layer in table_indices(self._model, self._plan).items():
            state.set_array(index, self._gathered(self._by_layer[layer], state.array(index)))
        return state

    def _gathered(self, shard: _Shard, mine: np.ndarray) -> np.ndarray:
        """Every rank's ``mine`` (its rows of ``shard``'s table or slot) in row order, the table's shape."""
        per_row = int(np.prod(mine.shape[1:], dtype=np.int64))
        counts = [(shard.table.owned(r)[1] - shard.table.owned(r)[0]) * per_row
                  for r in range(shard.table.world_size)]
        return self._comm.allgatherv(mine.reshape(-1), counts).reshape((shard.table.rows, *mine.shape[1:]))

    def _alltoallv(self, parts: Sequence[Sequence[np.ndarray]],
                   counts: Optional[np.ndarray] = None) -> Tuple[List[List[np.ndarray]], np.ndarray]:
        """One all-to-all for several tables: ``parts[t][d]``, this rank's of table ``t`` for rank ``d`` (one dtype).

        Returns ``received[t][s]``, rank ``s``'s of table ``t`` for this one, flat, and ``counts[s, d, t]``, the
        elements rank ``s`` sent rank ``d`` of table ``t``: all-gathered first, unless every rank knows them
        already from an earlier message (a row for each id) and passes them.
        """
        world, tables, rank = self._comm.world_size, len(parts), self._comm.rank
        if counts is None:
            mine = np.array([[table[d].size for table in parts] for d in range(world)], np.int64)  # [to, table]
            counts = self._comm.allgatherv(mine.reshape(-1), [world * tables] * world).reshape(world, world, tables)
        dtype = np.asarray(parts[0][0]).dtype
        received = self._comm.alltoallv(
            [np.concatenate([np.ascontiguousarray(table[d], dtype).reshape(-1) for table in parts])
             for d in range(world)], counts.sum(axis=2))
        out: List[List[np.ndarray]] = [[] for _ in range(tables)]
        for source in range(world):
            bounds = np.concatenate(([0], np.cumsum(counts[source, rank])))
            for t in range(tables):
                out[t].append(received[source][bounds[t]:bounds[t + 1]])
        return out, counts


def _shards(plan: ShardPlan, model: Any, rank: int, kept: dict, form: str) -> List[_Shard]:
    """Rank ``rank``'s shards of the plan's tables: their variables, optimizer clones built on them and functions
    (updates in the ``form`` of :mod:`~sparktf.training.tables.update_form`) taken from ``kept`` (by table) or made
    there. Every rank's shard has ``rows_per_rank`` rows (a last rank that
    owns fewer leaves the rest zero and untouched), so that one set serves whichever rank the process is."""
    trainable = {id(v): i for i, v in enumerate(model.trainable_variables)}
    layers = embedding_layers(model)
    shards = []
    for table in plan.tables:
        working = layers[table.layer].embeddings
        start, end = table.owned(rank)
        key = table.layer
        if key not in kept:
            rows = keras.Variable(np.zeros((table.rows_per_rank, *table.row_shape), np.float32),
                                  name=f"{table.layer}_shard")
            optimizer = type(model.optimizer).from_config(model.optimizer.get_config())
            optimizer.build([rows])
            initial = {kind: np.asarray(variable.value[0], np.float32)
                       for kind, variable in row_state_variables(optimizer, rows).items()}
            kept[key] = (rows, optimizer, _update_function(optimizer, rows, form), _gather_function(rows, form),
                         initial)
        shards.append(_Shard(table, working, trainable[id(working)], start, end, *kept[key]))
    return shards


def table_indices(model: Any, plan: ShardPlan) -> Dict[int, str]:
    """``index among the weights -> layer name`` of the working ``model``'s sharded tables."""
    working = _working_variables(model, plan)
    return {k: working[id(v)] for k, v in enumerate(model.weights) if id(v) in working}


def _working_variables(model: Any, plan: ShardPlan) -> Dict[int, str]:
    """``id(working table) -> layer name`` of the model's sharded tables."""
    layers = embedding_layers(model)
    return {id(layers[table.layer].embeddings): table.layer for table in plan.tables}


def _optimizer_state_owners(optimizer: Any, working: Dict[int, str]) -> Dict[int, Tuple[str, str]]:
    """``id(slot) -> (layer, kind)`` of the optimizer state of the working tables."""
    owners = {}
    for variable in tracked_variables(optimizer):
        if id(variable) in working:
            for kind, slot in row_state_variables(optimizer, variable).items():
                owners[id(slot)] = (working[id(variable)], kind)
    return owners


def _padded(rows: np.ndarray, count: int) -> np.ndarray:
    """``rows`` with zero rows after them up to ``count`` (a shard that owns fewer rows than the others)."""
    if len(rows) == count:
        return rows
    padded = np.zeros((count, *rows.shape[1:]), rows.dtype)
    padded[:len(rows)] = rows
    return padded


def _by_owner(table: ShardedTable, ids: np.ndarray) -> Tuple[List[np.ndarray], np.ndarray]:
    """``ids`` grouped by owner rank (each group in ``ids``' order), and the order that groups them."""
    owners = table.owners(ids)
    order = np.argsort(owners, kind="stable")
    grouped = ids[order]
    bounds = np.searchsorted(owners[order], np.arange(table.world_size + 1))
    return [grouped[bounds[r]:bounds[r + 1]] for r in range(table.world_size)], order


def _gathered_rows(shard: _Shard, ids: np.ndarray) -> np.ndarray:
    """The shard's rows of local ``ids``; asked for padded to a power of two (at least ``MIN_PADDED_ROWS``, as the
    padded updates), so that a compiled gather sees a handful of shapes."""
    if ids.size == 0:
        return np.zeros((0, *shard.table.row_shape), np.float32)
    padded = np.full(max(MIN_PADDED_ROWS, 1 << int(np.ceil(np.log2(ids.size)))), ids[0], np.int64)
    padded[:ids.size] = ids
    return np.asarray(shard.gather(padded), np.float32)[:ids.size]


def _gather_function(rows: Any, form: str) -> Any:
    """``gather(local ids)``: the shard's rows. XLA-compiled where the shard's update is: TensorFlow's own row
    read switches the shard to copy-on-read, and each compiled update would then copy it whole (``update_form``)."""
    spec = [tf.TensorSpec([None], tf.int64)]
    return tf.function(lambda ids: tf.gather(rows.value, ids), input_signature=spec, autograph=False,
                       jit_compile=form in ("dense", "padded"))


def _update_function(optimizer: Any, rows: Any, form: str) -> Any:
    """``update([slices])``: the optimizer's step on the shard, in the form ``update_form`` finds for it
    (:func:`~sparktf.training.tables.compiled_update.update_in_form`)."""
    def row_kernels(sparse: List[tf.IndexedSlices]) -> None:
        apply_rows(optimizer, rows, sparse[0], unique_indices=True)
        optimizer.iterations.assign_add(1)

    return update_in_form(form, lambda sparse: optimizer.apply(sparse, [rows]), row_kernels, [],
                          [tuple(int(d) for d in rows.shape)])[0]
