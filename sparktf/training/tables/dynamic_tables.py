"""A training rank's dynamic embedding tables (:class:`sparktf.layers.DynamicEmbedding`): every rank admits, counts
and evicts alike.

In ``model.fit`` a ``DynamicEmbedding`` observes its own ids in its call. A
sparktf rank's call sees only the rank's share of the global batch: ranks
would give different ids the same rows. So on the ranks the layers'
``admits_in_call`` is off (:func:`observed_by_ranks`, before the step is
traced), and before each step :meth:`DynamicTables.observe` gathers every
rank's ids of each dynamic table (one all-gather, in rank order: the global
batch's order) and every rank observes all of them, alike. At a segment's end
(a stream's micro-batch's) every rank evicts alike
(:meth:`DynamicTables.evict`), with the model's optimizer, whose slots of the
freed rows are reset. The tables are replicated: their rows' gradients are
exchanged as any table's, and the rows of ids first seen in the step are the
step's own, as in ``fit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from sparktf.errors import ConfigurationError
from sparktf.layers.dynamic_embedding import DynamicEmbedding, dynamic_embeddings
from sparktf.training.tables.lookups import Lookup, input_names, lookup_of

__all__ = ["DynamicTables", "observed_by_ranks"]


def observed_by_ranks(model: Any) -> Any:
    """``model``, its ``DynamicEmbedding`` layers' ``admits_in_call`` off: the rank's :class:`DynamicTables` observe
    the global batch's ids for them."""
    for layer in dynamic_embeddings(model):
        layer.admits_in_call = False
    return model


@dataclass(frozen=True)
class _Table:
    """One dynamic table, where its ids come from in a batch, and its traced ``observe``."""

    layer: DynamicEmbedding
    lookup: Lookup
    observe: Any  # tf.function(int64 keys) -> None


class DynamicTables:
    """The ``DynamicEmbedding`` tables of a rank's ``model`` (None, or a model without any: every call does nothing).

    Raises
    ------
    ConfigurationError
        A dynamic table's ids are not a model input or a column of one (they are computed inside the model).
    """

    def __init__(self, model: Any = None):
        self._names = input_names(model)
        self._tables: List[_Table] = []
        for layer in dynamic_embeddings(model) if model is not None else ():
            lookup, reason = lookup_of(model, layer, strings=True)
            if lookup is None:
                raise ConfigurationError(
                    f"the DynamicEmbedding {layer.name!r} cannot train on sparktf's workers: {reason}. Every rank "
                    "observes the global batch's ids of a dynamic table before each step, so its ids must be a model "
                    "input, or one column of a 2-D one (ids[:, i]), and it must be called once")
            observe = tf.function(layer.observe, input_signature=[tf.TensorSpec([None], tf.int64)], autograph=False)
            self._tables.append(_Table(layer, lookup, observe))

    @property
    def layers(self) -> Tuple[DynamicEmbedding, ...]:
        """The dynamic tables."""
        return tuple(table.layer for table in self._tables)

    def observe(self, features: Any, communicator: Optional[Any]) -> None:
        """Observe the global batch's ids of every table on this rank: its own ``features``' ids and, through
        ``communicator`` (None: a lone rank), every other rank's, in rank order."""
        if not self._tables:
            return
        mine = [table.layer.keys_of(self._ids(features, table.lookup)).numpy() for table in self._tables]
        for table, keys in zip(self._tables, _gathered(mine, communicator)):
            table.observe(tf.constant(keys, tf.int64))

    def evict(self, optimizer: Any) -> int:
        """Free rows of every table by its policy (between steps); ``optimizer``'s slots of them are reset. The rows
        freed."""
        return sum(table.layer.evict(optimizer) for table in self._tables)

    def _ids(self, features: Any, lookup: Lookup) -> Any:
        """The ids of ``lookup`` in a batch's ``features`` (a dict by input name, a list or one array)."""
        if isinstance(features, dict):
            ids = features[lookup.input_name]
        elif isinstance(features, (list, tuple)):
            ids = features[self._names.index(lookup.input_name)]
        else:
            ids = features
        return ids if lookup.column is None else np.asarray(ids)[:, lookup.column]


def _gathered(mine: Sequence[np.ndarray], communicator: Optional[Any]) -> List[np.ndarray]:
    """Every rank's keys of each table, concatenated in rank order (one all-gather for all tables)."""
    if communicator is None or communicator.world_size == 1:
        return list(mine)
    world, rank = communicator.world_size, communicator.rank
    counts = np.zeros((world, len(mine)), np.int64)
    counts[rank] = [keys.size for keys in mine]
    communicator.allreduce(counts, op="sum")
    flat = communicator.allgatherv(np.concatenate(mine).astype(np.int64), counts.sum(axis=1).tolist())
    ends = np.cumsum(counts.reshape(-1)).reshape(world, len(mine))
    starts = ends - counts
    return [np.concatenate([flat[starts[r, t]:ends[r, t]] for r in range(world)]) for t in range(len(mine))]

