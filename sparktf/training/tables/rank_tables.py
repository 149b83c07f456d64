"""A training rank's tables for one segment, as the loop, the step and the gradient exchange ask about them.

:class:`RankTables` is the replicated kind, the identity;
:class:`~sparktf.training.tables.sharded_tables.RankShards` the sharded one. The role that makes them for a
segment is :class:`~sparktf.training.tables.worker_tables.WorkerTables`.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from sparktf.training.checkpoint import ModelState, RowRanges
from sparktf.training.clipping import GradientClipping
from sparktf.training.tables.dynamic_tables import DynamicTables

__all__ = ["RankTables"]


class RankTables:
    """A rank's tables for one segment: replicated ones, whose dynamic tables (``dynamic``, none by default) every
    rank observes alike over ``communicator`` before each step and evicts alike at the segment's end.
    :class:`RankShards` is the sharded kind.

    Attributes
    ----------
    positions : frozenset
        The tables among the model's trainable variables that their owners update (the step leaves them alone).
    """

    positions: frozenset = frozenset()

    def __init__(self, dynamic: Optional[DynamicTables] = None, communicator: Any = None):
        self._dynamic = dynamic or DynamicTables()
        self._communicator = communicator

    @property
    def lookup_phase(self) -> str:
        """The step's phase while :meth:`lookup` runs (the heartbeat's name of it)."""
        return "lookup" if self._dynamic.layers else "compute"

    def lookup(self, features: Any) -> Any:
        """The batch's features as the step takes them; the dynamic tables have observed the global batch's ids."""
        self._dynamic.observe(features, self._communicator)
        return features

    def end_segment(self, model: Any) -> int:
        """Evict from the dynamic tables, alike on every rank (between steps, with the model's optimizer); the rows
        freed."""
        return self._dynamic.evict(model.optimizer)

    def route_to_owners(self, layout: Any, parts: Any, rows: List[Any]) -> Tuple[List[int], bool]:
        """Send the step's rows of the owned tables to their owners (``rows`` gets none back for them): which of
        ``layout.sparse`` they are, and whether every owner's sum is finite."""
        return [], True

    def apply(self, clipping: GradientClipping) -> None:
        """Apply the step's rows that reached this rank's tables (after the step's own update)."""

    def finish(self, model: Any, iteration: int, rank: int, launch_secret: bytes,
               channel: bool) -> Tuple[Optional[ModelState], RowRanges]:
        """What the rank hands back at the segment's end (None: nothing) and the rows of it that are its share of
        the tables (the driver's ``channel`` joins them; without one, rank 0 hands back the whole): rank 0 the
        model's state."""
        return (ModelState.capture(model, iteration) if rank == 0 else None), {}
