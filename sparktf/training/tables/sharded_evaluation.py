"""Evaluating a model whose tables are sharded, a batch's rows at a time: no task holds a whole table.

An evaluation task builds the model with **working tables** of one batch's
ids, as a training rank does (:func:`~sparktf.training.tables.sharded_tables.working_model`),
and fetches the start state with those tables cut to no rows. Before each
batch it replaces the batch's ids by their positions among its unique ids and
writes the rows of those ids, asked of the driver's job channel by id, into
the working tables (:meth:`BatchRows.fill`); the batch is then evaluated as
it comes. The driver already holds the whole tables (its model); the tasks
hold a batch's rows of them.
"""

from __future__ import annotations

from typing import Any, Callable, Dict

import numpy as np

from sparktf.models.cache import cached
from sparktf.models.payload import ModelPayload, payload_key
from sparktf.training.checkpoint import ModelState, RowRanges
from sparktf.training.tables.plan import ShardPlan, embedding_layers
from sparktf.training.tables.sharded_tables import table_indices, working_features, working_model

__all__ = ["BatchRows"]

#: ``rows(state array index, ids) -> rows``: a table's rows by id, from the driver (``StateSource.rows_by_id``).
RowsById = Callable[[int, np.ndarray], np.ndarray]


class BatchRows:
    """One evaluation task's model with working tables of ``batch_size`` records' ids, for ``plan``'s tables.

    Parameters
    ----------
    payload : Shared
        The model's payload (no weights), as the task got it.
    plan : ShardPlan
        The sharded tables (their number of ranks does not matter here).
    batch_size : int
        The most records of a batch.
    """

    def __init__(self, payload: Any, plan: ShardPlan, batch_size: int):
        self._plan = plan
        key = f"{payload_key(payload.value)}/evaluation/{plan!r}/{batch_size}"
        self.model = cached(key, lambda: working_model(ModelPayload.from_bytes(payload.value), plan, batch_size))
        self._indices = table_indices(self.model, plan)  # state array index -> layer
        layers = embedding_layers(self.model)
        self._working = {layer: layers[layer].embeddings for layer in self._indices.values()}

    @property
    def no_rows(self) -> RowRanges:
        """The rows of the state to fetch: none of the sharded tables, all of the rest."""
        return {index: (0, 0) for index in self._indices}

    def start(self, state: ModelState) -> None:
        """Give the model ``state`` (fetched with :attr:`no_rows`), all but its sharded tables."""
        state.apply_to(self.model, keep=frozenset(id(variable) for variable in self._working.values()))

    def fill(self, features: Any, rows: RowsById) -> Any:
        """The batch's ``features`` with the tables' ids replaced by working-table positions, the rows of those
        ids (``rows``) written into the working tables."""
        features, unique = working_features(self._plan, self.model, features)
        by_layer: Dict[str, np.ndarray] = {table.layer: ids for table, ids in zip(self._plan.tables, unique)}
        for index, layer in self._indices.items():
            working = self._working[layer]
            ids = by_layer[layer]
            values = np.zeros(tuple(int(d) for d in working.shape), np.float32)
            values[:ids.size] = rows(index, ids)
            working.assign(values)
        return features
