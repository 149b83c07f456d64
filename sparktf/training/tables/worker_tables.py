"""The worker's side of the embedding tables, as a role: what a training rank's loop, step and gradient exchange
ask about the tables, answered once here instead of by branches in each of them.

:class:`WorkerTables` is the plan (made on the driver by :class:`~sparktf.training.tables.strategy.TableStrategy`,
carried in the segment's spec); :meth:`WorkerTables.on_rank` gives the rank's :class:`RankTables` for a segment.

* :class:`Replicated`: every table whole on every rank, updated by the step like any variable. Its rank tables
  are the identity: nothing to look up, route or apply; rank 0 hands back the model's state.
* :class:`Sharded`: the plan's tables split among the ranks (:mod:`~sparktf.training.tables.sharded_tables`): the
  step trains a working model, the rank's :class:`~sparktf.training.tables.sharded_tables.RankShards` fetch the
  batch's rows before the step, take their gradients to the owners and apply them there, and every rank hands
  back its rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

from sparktf.models.cache import cached, derived, load_cached
from sparktf.models.payload import ModelPayload, payload_key
from sparktf.training.checkpoint import ModelState, RowRanges
from sparktf.training.tables.dynamic_tables import DynamicTables, observed_by_ranks
from sparktf.training.tables.plan import ShardPlan, embedding_layers
from sparktf.training.tables.rank_tables import RankTables
from sparktf.training.tables.sharded_tables import (HeldTables, RankShards, apply_start_state, state_rows,
                                                    working_features, working_model)
from sparktf.training.tables.update_form import TableUpdates

__all__ = ["Replicated", "Sharded", "WorkerTables", "worker_tables"]


class WorkerTables:
    """How a segment's workers hold the model's tables (see the module's docstring)."""

    updates: Optional[TableUpdates] = None

    def on(self, world_size: int) -> "WorkerTables":
        """The tables of a launch on ``world_size`` workers."""
        return self

    def step_model(self, payload: Any, local_batch: int, clipping: Any) -> Any:
        """The model the process's step for ``payload`` trains (with ``clipping``), from the process's models
        cache."""
        raise NotImplementedError

    def kept_with_step(self) -> Optional[dict]:
        """What the rank's tables keep with the process's step between segments (None: nothing)."""
        return None

    def owned_positions(self, model: Any) -> frozenset:
        """The tables among ``model``'s trainable variables that their owners update (the step leaves them)."""
        return frozenset()

    def warm_up_features(self, model: Any, features: Any) -> Any:
        """A batch's features as a step's warm-up takes them (before any rank tables exist)."""
        return features

    def start_rows(self, model: Any, rank: int) -> RowRanges:
        """The rows of the start state's arrays the rank fetches (none listed: whole)."""
        return {}

    def take_start_state(self, state: ModelState, model: Any) -> Tuple[HeldTables, Optional[str]]:
        """Give ``model`` the segment's start ``state``; what the rank tables hold of it apart (their rows, the
        folder of their optimizer state)."""
        state.apply_to(model)
        return {}, None

    def on_rank(self, model: Any, rank: int, communicator: Any, kept: Optional[dict],
                held: Tuple[HeldTables, Optional[str]]) -> RankTables:
        """The rank's tables for the segment, holding its share of the start state (``held``)."""
        return RankTables(derived(model, "dynamic-tables", DynamicTables), communicator)


@dataclass(frozen=True)
class Replicated(WorkerTables):
    """Every table whole on every rank.

    Attributes
    ----------
    updates : TableUpdates, optional
        How the optimizer updates tables, probed on the driver (None: probed by the step when it meets rows).
    """

    updates: Optional[TableUpdates] = None

    def step_model(self, payload: Any, local_batch: int, clipping: Any) -> Any:
        return observed_by_ranks(load_cached(payload))


@dataclass(frozen=True)
class Sharded(WorkerTables):
    """The plan's tables split among the ranks by rows.

    Attributes
    ----------
    plan : ShardPlan
        The sharded tables, for the launch's worker count.
    updates : TableUpdates
        How the optimizer updates tables, probed on the driver.
    optimizer_state_root : str, optional
        Where the ranks write the tables' optimizer state at the segment's end (``optimizer_state_store``).
    """

    plan: ShardPlan
    updates: Optional[TableUpdates] = None
    optimizer_state_root: Optional[str] = None

    def on(self, world_size: int) -> "Sharded":
        return Sharded(self.plan.on(world_size), self.updates, self.optimizer_state_root)

    def step_model(self, payload: Any, local_batch: int, clipping: Any) -> Any:
        # the whole model is never built here: the step trains one with working tables of a local batch's ids
        return cached(f"{payload_key(payload.value)}/working/{clipping!r}/{self.plan!r}/{local_batch}",
                      lambda: observed_by_ranks(working_model(ModelPayload.from_bytes(payload.value), self.plan,
                                                              local_batch)))

    def kept_with_step(self) -> Optional[dict]:
        return {}

    def owned_positions(self, model: Any) -> frozenset:
        trainable = {id(v): i for i, v in enumerate(model.trainable_variables)}
        layers = embedding_layers(model)
        return frozenset(trainable[id(layers[table.layer].embeddings)] for table in self.plan.tables)

    def warm_up_features(self, model: Any, features: Any) -> Any:
        return working_features(self.plan, model, features)[0]

    def start_rows(self, model: Any, rank: int) -> RowRanges:
        return state_rows(model, self.plan, rank)

    def take_start_state(self, state: ModelState, model: Any) -> Tuple[HeldTables, Optional[str]]:
        return apply_start_state(state, model, self.plan), state.optimizer_state_folder

    def on_rank(self, model: Any, rank: int, communicator: Any, kept: Optional[dict],
                held: Tuple[HeldTables, Optional[str]]) -> RankTables:
        shards = RankShards(self.plan, model, rank, communicator, kept, self.updates,
                            self.optimizer_state_root)
        shards.start(*held)
        return shards


def worker_tables(plan: ShardPlan, updates: Optional[TableUpdates],
                  optimizer_state_root: Optional[str] = None) -> WorkerTables:
    """The role of ``plan``'s tables on the workers: :class:`Sharded` when it shards any, else :class:`Replicated`."""
    return Sharded(plan, updates, optimizer_state_root) if plan.tables else Replicated(updates)

