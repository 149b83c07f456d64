"""The driver's side of sharded tables: its optimizer without their slots, where those slots live, and the states
it holds and checkpoints without them.

The driver holds the model the user built, its full tables included, but
never a sharded table's optimizer slots: its optimizer is built without the
sharded tables (:meth:`DriverTables.build_optimizer`), the ranks keep the
slots in files between segments (:mod:`~sparktf.training.sharding.slot_store`)
and the driver's states and checkpoints name the folder of their iteration
instead (``ModelState.slots``). After ``optimize`` the model's optimizer
therefore knows no sharded table: ``model.fit`` needs ``model.compile`` again
(fresh slots), while prediction, ``save`` and export need nothing.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Optional, Tuple

import numpy as np

from sparktf.errors import ConfigurationError
from sparktf.training.checkpoint import ModelState, checkpoint_iterations
from sparktf.training.sharding.plan import ShardPlan, ShardingRequest, embedding_layers
from sparktf.training.sharding.slot_store import prune_slot_folders, read_slot_rows, remove_temporary_root, slot_root
from sparktf.training.sharding.tables import apply_without_slots, slot_positions

__all__ = ["DriverTables"]

_LOG = logging.getLogger("sparktf.optimizer")  # where training tells the user what happens


class DriverTables:
    """One ``TFOptimizer``'s sharded tables on the driver: the plan for ``num_workers`` and the slots' root folder.

    Parameters
    ----------
    plan : ShardPlan
        The tables sharded (none: every table replicated, and this does nothing).
    root : str, optional
        Where the ranks write the slots' folders; None when nothing is sharded or the optimizer has no slots
        (plain SGD).
    temporary : bool
        ``root`` is a temporary folder, deleted with this object.
    """

    def __init__(self, plan: ShardPlan, root: Optional[str] = None, temporary: bool = False):
        self.plan, self.root = plan, root
        if temporary:
            weakref.finalize(self, remove_temporary_root, root)

    @classmethod
    def of(cls, model: Any, session: Any, num_workers: int, model_dir: Optional[str],
           sharded_tables: Any = "session") -> "DriverTables":
        """``sharded_tables`` (by default the session's sharding settings) applied to ``model`` (see
        ``ShardingRequest.of_keyword``), its optimizer built.

        Raises
        ------
        ConfigurationError
            A table cannot be sharded as asked; the optimizer has slots and no folder every executor reaches
            can hold them (no ``model_dir`` on a cluster); or the optimizer was built with a sharded table's slots.
        """
        plan = ShardingRequest.of_keyword(sharded_tables, session).plan(model, num_workers)
        root, temporary = None, False
        if plan.tables and _has_slots(model.optimizer, plan.tables[0].row_shape):
            root, temporary = slot_root(model_dir, session.master)
        tables = cls(plan, root, temporary)
        tables.build_optimizer(model)
        return tables

    @property
    def slot_tables(self) -> Tuple[str, ...]:
        """The layers whose slots live in files (none without a root)."""
        return tuple(table.layer for table in self.plan.tables) if self.root else ()

    def build_optimizer(self, model: Any) -> None:
        """Build ``model``'s optimizer for every trainable variable but the sharded tables.

        Raises
        ------
        ConfigurationError
            It is built already, with slots of a sharded table, or without slots of a variable this optimizer
            trains replicated (an earlier ``optimize`` sharded it).
        """
        layers = embedding_layers(model)
        tables = {id(layers[table.layer].embeddings) for table in self.plan.tables}
        optimizer = model.optimizer
        if not optimizer.built:
            optimizer.build([v for v in model.trainable_variables if id(v) not in tables])
            return
        known = {id(v) for v in optimizer._trainable_variables}
        if self.root and tables & known:
            raise ConfigurationError(
                f"the model's optimizer was built (by fit, or build) with slots for the sharded tables "
                f"{list(self.slot_tables)}, which the driver must not hold: compile the model again before making "
                "the TFOptimizer, or keep the tables replicated")
        unknown = [v.path for v in model.trainable_variables if id(v) not in known and id(v) not in tables]
        if unknown and any(len(v.shape) for v in optimizer.variables):
            raise ConfigurationError(
                f"the model's optimizer has no slots for {unknown} (an earlier optimize sharded them), and this "
                "TFOptimizer trains them replicated: compile the model again (fresh slots), or shard them again "
                "(spark.sparktf.shardTables)")

    def capture(self, model: Any, iteration: int, slots: Optional[str]) -> ModelState:
        """The driver's state: ``model``'s, with ``slots``, the folder of the sharded tables' slots."""
        state = ModelState.capture(model, iteration)
        state.slots, state.slot_tables = (slots, self.slot_tables) if self.root else (None, ())
        return state

    def load(self, state: ModelState, model: Any) -> Optional[str]:
        """Give ``model`` a checkpoint's ``state``; return the folder of the slots the next segment starts from.

        A checkpoint whose tables' slots are in files loads into an optimizer that holds every slot (the tables
        replicated): those slots are read whole from the files.

        Raises
        ------
        ConfigurationError
            The checkpoint holds slots this optimizer keeps in files, or keeps others than this one does.
        StorageError
            The checkpoint's slot files cannot be read.
        """
        mine = self.slot_tables
        if set(state.slot_tables) == set(mine):
            state.apply_to(model)
            return state.slots
        if mine:
            raise ConfigurationError(
                f"the checkpoint of iteration {state.iteration} holds the optimizer slots of tables "
                f"{sorted(state.slot_tables) or 'in itself'}, but this TFOptimizer keeps those of {sorted(mine)} in "
                "files: load it with the same sharded tables (spark.sparktf.shardTables, shardTableBytes) or with "
                "none sharded")
        positions = slot_positions(model, state.slot_tables)
        apply_without_slots(state, model, positions)
        for index, (layer, kind) in positions.items():
            variable = model.optimizer.variables[index - len(model.weights)]
            variable.assign(read_slot_rows(state.slots, layer, 0, int(variable.shape[0]), [kind])[kind])
        return None

    def prune(self, slots: Optional[str], model_dir: Optional[str]) -> None:
        """Delete the slot folders that neither ``slots`` (the current one) nor a checkpoint names; a failure only
        warns (the next segment's end tries again)."""
        if not self.root:
            return
        try:
            prune_slot_folders(self.root, checkpoint_iterations(model_dir) if model_dir else (), slots)
        except OSError as error:  # StorageError included
            _LOG.warning("old folders of the sharded tables' optimizer slots in %s could not be deleted (%s); the "
                         "next segment's end tries again", self.root, error)


def _has_slots(optimizer: Any, row_shape: Tuple[int, ...]) -> bool:
    """Whether ``optimizer``'s kind keeps per-row state (slots) for a table of ``row_shape`` rows."""
    import keras

    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # loss-scaled: refused later, by name
    probe = type(optimizer).from_config(optimizer.get_config())
    probe.build([keras.Variable(np.zeros((1, *row_shape), np.float32))])
    return any(len(variable.shape) for variable in probe.variables)
