"""How one ``TFOptimizer``'s ``Embedding`` tables train, as one strategy: replicated, or sharded.

Every worker holds a **replicated** table whole, with its optimizer state,
as it holds every other variable. A **sharded** table is split among the
workers (:mod:`~sparktf.training.tables.sharded_tables`): each rank holds its
rows and their optimizer state. The driver holds the model the user built,
its full tables included, but never a sharded table's optimizer state: its
optimizer is built without the sharded tables (:meth:`TableStrategy.build_optimizer`),
the ranks keep that state in files between segments
(:mod:`~sparktf.training.tables.optimizer_state_store`) and the driver's
states and checkpoints name the folder of their iteration instead
(``ModelState.optimizer_state_folder``). After ``optimize`` the model's
optimizer therefore knows no sharded table: ``model.fit`` needs
``model.compile`` again (fresh optimizer state), while prediction, ``save``
and export need nothing.

:meth:`TableStrategy.of` picks the strategy and probes, once, how the
optimizer updates tables (:class:`~sparktf.training.tables.update_form.TableUpdates`,
shipped to the workers in every segment's spec).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Optional, Tuple

from sparktf.errors import ConfigurationError
from sparktf.models.keras_internals import tracked_variables
from sparktf.training.checkpoint import ModelState, checkpoint_iterations
from sparktf.training.tables.optimizer_state_store import (optimizer_state_root, prune_optimizer_state_folders,
                                                           read_optimizer_state_rows, remove_temporary_root)
from sparktf.training.tables.plan import ShardPlan, ShardingRequest, embedding_layers
from sparktf.training.tables.sharded_tables import apply_without_optimizer_state, optimizer_state_positions
from sparktf.training.tables.update_form import TableUpdates
from sparktf.training.tables.worker_tables import WorkerTables, worker_tables

__all__ = ["ReplicatedTables", "ShardedTables", "TableStrategy"]

_LOG = logging.getLogger("sparktf.optimizer")  # where training tells the user what happens


class TableStrategy:
    """The driver's side of one ``TFOptimizer``'s tables: how its optimizer updates them (``updates``; None for a
    model without ``Embedding`` tables), the sharded ones' plan (``plan``, empty when replicated) and where their
    optimizer state lives between segments (``root``, None when the driver's states hold it all).

    The two strategies differ only in where a table's optimizer state lives:
    :class:`ReplicatedTables` keeps it in the model's optimizer,
    :class:`ShardedTables` (with an optimizer that keeps state per row) in
    the ranks' files.
    """

    plan: ShardPlan
    updates: Optional[TableUpdates]
    root: Optional[str] = None

    @staticmethod
    def of(model: Any, session: Any, num_workers: int, model_dir: Optional[str],
           sharded_tables: Any = "session") -> "TableStrategy":
        """The strategy ``sharded_tables`` (by default the session's sharding settings) asks for ``model`` (see
        ``ShardingRequest.of_keyword``), its optimizer built.

        Raises
        ------
        ConfigurationError
            A table cannot be sharded as asked; the optimizer keeps state per row and no folder every executor
            reaches can hold it (no ``model_dir`` on a cluster); or the optimizer was built with a sharded table's
            optimizer state.
        """
        plan = ShardingRequest.of_keyword(sharded_tables, session).plan(model, num_workers)
        # a model without Embedding tables is not probed (a worker that meets rows probes for itself)
        updates = TableUpdates.probe(model.optimizer) if embedding_layers(model) else None
        if not plan.tables:
            strategy: TableStrategy = ReplicatedTables(plan, updates)
        elif updates.row_state:
            strategy = ShardedTables(plan, updates, *optimizer_state_root(model_dir, session.master))
        else:
            strategy = ShardedTables(plan, updates)  # e.g. plain SGD: no state per row, no files
        strategy.build_optimizer(model)
        return strategy

    @property
    def optimizer_state_tables(self) -> Tuple[str, ...]:
        """The layers whose optimizer state lives in files (none without a root)."""
        return tuple(table.layer for table in self.plan.tables) if self.root else ()

    def for_workers(self) -> WorkerTables:
        """The role the workers' loop, step and exchange take the tables by (:mod:`.worker_tables`)."""
        return worker_tables(self.plan, self.updates, self.root)

    def build_optimizer(self, model: Any) -> None:
        """Build ``model``'s optimizer for every trainable variable but the sharded tables.

        Raises
        ------
        ConfigurationError
            It is built already, with optimizer state of a sharded table, or without optimizer state of a variable
            this optimizer trains replicated (an earlier ``optimize`` sharded it).
        """
        layers = embedding_layers(model)
        tables = {id(layers[table.layer].embeddings) for table in self.plan.tables}
        optimizer = model.optimizer
        if not optimizer.built:
            optimizer.build([v for v in model.trainable_variables if id(v) not in tables])
            return
        known = {id(v) for v in tracked_variables(optimizer)}
        if self.root and tables & known:
            raise ConfigurationError(
                f"the model's optimizer was built (by fit, or build) with optimizer state for the sharded tables "
                f"{list(self.optimizer_state_tables)}, which the driver must not hold: compile the model again before "
                "making the TFOptimizer, or keep the tables replicated")
        unknown = [v.path for v in model.trainable_variables if id(v) not in known and id(v) not in tables]
        if unknown and any(len(v.shape) for v in optimizer.variables):
            raise ConfigurationError(
                f"the model's optimizer has no optimizer state for {unknown} (an earlier optimize sharded them), and "
                "this TFOptimizer trains them replicated: compile the model again (fresh optimizer state), or shard "
                "them again (spark.sparktf.shardTables)")

    def capture(self, model: Any, iteration: int, folder: Optional[str]) -> ModelState:
        """The driver's state: ``model``'s, with ``folder``, the folder of the sharded tables' optimizer state."""
        return ModelState.capture(model, iteration)

    def load(self, state: ModelState, model: Any) -> Optional[str]:
        """Give ``model`` a checkpoint's ``state``; return the folder of the optimizer state the next segment starts
        from.

        A checkpoint whose tables' optimizer state is in files loads into an optimizer that holds every optimizer
        variable (the tables replicated): that optimizer state is read whole from the files.

        Raises
        ------
        ConfigurationError
            The checkpoint holds optimizer state this optimizer keeps in files, or keeps others than this one does.
        StorageError
            The checkpoint's optimizer-state files cannot be read.
        """
        mine = self.optimizer_state_tables
        if set(state.optimizer_state_tables) == set(mine):
            state.apply_to(model)
            return state.optimizer_state_folder
        if mine:
            raise ConfigurationError(
                f"the checkpoint of iteration {state.iteration} holds the optimizer state of tables "
                f"{sorted(state.optimizer_state_tables) or 'in itself'}, but this TFOptimizer keeps those of "
                f"{sorted(mine)} in files: load it with the same sharded tables (spark.sparktf.shardTables, "
                "shardTableBytes) or with none sharded")
        positions = optimizer_state_positions(model, state.optimizer_state_tables)
        apply_without_optimizer_state(state, model, positions)
        for index, (layer, kind) in positions.items():
            variable = model.optimizer.variables[index - len(model.weights)]
            rows = read_optimizer_state_rows(state.optimizer_state_folder, layer, 0, int(variable.shape[0]), [kind])
            variable.assign(rows[kind])
        return None

    def prune(self, folder: Optional[str], model_dir: Optional[str]) -> None:
        """Delete the optimizer-state folders that neither ``folder`` (the current one) nor a checkpoint names."""


class ReplicatedTables(TableStrategy):
    """Every table whole on every worker, with its optimizer state: nothing on the driver's side but a checkpoint
    of sharded tables, whose optimizer state is read whole from their files (:meth:`TableStrategy.load`)."""

    def __init__(self, plan: ShardPlan, updates: Optional[TableUpdates]):
        self.plan, self.updates = plan, updates


class ShardedTables(TableStrategy):
    """The ``plan``'s tables split among the workers, their optimizer state in files under ``root`` between
    segments (None: the optimizer keeps no state per row, e.g. plain SGD).

    Parameters
    ----------
    plan : ShardPlan
        The tables sharded.
    updates : TableUpdates
        How the optimizer updates tables, as probed.
    root : str, optional
        Where the ranks write the optimizer-state folders.
    temporary : bool
        ``root`` is a temporary folder, deleted with this object.
    """

    def __init__(self, plan: ShardPlan, updates: TableUpdates, root: Optional[str] = None, temporary: bool = False):
        self.plan, self.updates, self.root = plan, updates, root
        if temporary:
            weakref.finalize(self, remove_temporary_root, root)

    def capture(self, model: Any, iteration: int, folder: Optional[str]) -> ModelState:
        state = ModelState.capture(model, iteration)
        if self.root:
            state.optimizer_state_folder, state.optimizer_state_tables = folder, self.optimizer_state_tables
        return state

    def prune(self, folder: Optional[str], model_dir: Optional[str]) -> None:
        """Delete the optimizer-state folders that neither ``folder`` (the current one) nor a checkpoint names; a
        failure only warns (the next segment's end tries again)."""
        if not self.root:
            return
        try:
            prune_optimizer_state_folders(self.root, checkpoint_iterations(model_dir) if model_dir else (), folder)
        except OSError as error:  # StorageError included
            _LOG.warning("old folders of the sharded tables' optimizer state in %s could not be deleted (%s); the "
                         "next segment's end tries again", self.root, error)

