"""Which embedding tables are split across the workers, and which rows each rank owns.

Decided on the driver before any job, from the model alone: an ``Embedding``
whose table is larger than the threshold (``spark.sparktf.shardTableBytes``)
is sharded, and a per-layer choice overrides the threshold both ways. Rank
``r`` of ``N`` owns the contiguous rows ``[r * k, (r + 1) * k)``,
``k = ceil(rows / N)`` (TorchRec's row-wise sharding): a checkpoint's shard
is a slice of the table, and re-sharding from N to M ranks reads the slices
that cover the new range.

A table can be sharded when it is trained and its layer is called once, on a
model input of integer ids or one column of one, which nothing but sharded
tables reads (:mod:`~sparktf.training.tables.lookups`): a worker reads the
batch's ids there to fetch their rows from the owners before the step.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from sparktf.errors import ConfigurationError
from sparktf.models.keras_internals import nested_layers
from sparktf.spark.cluster import size_setting
from sparktf.layers.dynamic_embedding import dynamic_embeddings
from sparktf.training.tables.lookups import Lookup, lookup_of, other_readers

__all__ = ["ShardedTable", "ShardPlan", "ShardingRequest", "SHARD_TABLE_BYTES_CONF", "SHARD_TABLES_CONF"]

SHARD_TABLE_BYTES_CONF = "spark.sparktf.shardTableBytes"
SHARD_TABLES_CONF = "spark.sparktf.shardTables"
#: ``sharded_tables="auto"``'s threshold when ``spark.sparktf.shardTableBytes`` is not set.
AUTO_SHARD_TABLE_BYTES = "256m"

logger = logging.getLogger("sparktf.training")


@dataclass(frozen=True)
class ShardedTable:
    """One sharded table.

    Attributes
    ----------
    layer : str
        The ``Embedding`` layer's name.
    input_name : str
        The model input of ids it is called on.
    rows : int
        The table's rows.
    row_shape : tuple of int
        One row's shape.
    world_size : int
        Ranks that share it.
    ids_per_record : int
        Ids one record gives it.
    column : int, optional
        The column of ``input_name`` it is looked up by (``ids[:, column]``); None: the whole input.
    """

    layer: str
    input_name: str
    rows: int
    row_shape: Tuple[int, ...]
    world_size: int
    ids_per_record: int = 1
    column: Optional[int] = None

    @property
    def rows_per_rank(self) -> int:
        """``ceil(rows / world_size)``: the rows each rank owns (the last may own fewer)."""
        return math.ceil(self.rows / self.world_size)

    def owned(self, rank: int) -> Tuple[int, int]:
        """``(start, end)``: the rows ``rank`` owns (possibly none on the last ranks of a small table)."""
        start = min(rank * self.rows_per_rank, self.rows)
        return start, min(start + self.rows_per_rank, self.rows)

    def owners(self, ids: np.ndarray) -> np.ndarray:
        """The rank owning each of ``ids`` (each in ``[0, rows)``)."""
        return np.asarray(ids, np.int64) // self.rows_per_rank


@dataclass(frozen=True)
class ShardPlan:
    """The sharded tables of a model trained by ``world_size`` ranks (none: every table is replicated)."""

    tables: Tuple[ShardedTable, ...]
    world_size: int

    @classmethod
    def of(cls, model: Any, world_size: int, threshold_bytes: Optional[int],
           choices: Optional[Mapping[str, bool]] = None) -> "ShardPlan":
        """The plan for ``model``: tables over ``threshold_bytes`` (None: no threshold), or as ``choices`` say.

        Parameters
        ----------
        model : keras.Model
            A built functional model.
        world_size : int
            The training workers.
        threshold_bytes : int, optional
            A table of more bytes is sharded, unless ``choices`` says no.
        choices : mapping of str to bool, optional
            Per ``Embedding`` layer name: shard it (True) or keep it replicated (False).

        Raises
        ------
        ConfigurationError
            ``choices`` names a layer that is not an ``Embedding`` of the model,
            or asks to shard a table that cannot be sharded (the reason is
            named). A table only the threshold picked stays replicated with a
            warning instead.
        """
        choices = dict(choices or {})
        embeddings = embedding_layers(model)
        unknown = sorted(set(choices) - set(embeddings))
        dynamic = sorted(set(unknown) & {layer.name for layer in dynamic_embeddings(model)})
        if dynamic:
            raise ConfigurationError(
                f"sharded tables: {dynamic} are DynamicEmbedding tables, which train replicated (every rank holds the "
                "whole table and admits the same ids); sharding them is not supported: leave them out of "
                "sharded_tables")
        if unknown:
            raise ConfigurationError(
                f"sharded tables: {unknown} are not Embedding layers of the model; its Embedding layers are "
                f"{sorted(embeddings)}")
        found: Dict[str, Tuple[Any, Lookup, bool, int]] = {}  # name -> layer, lookup, chosen, bytes
        for name, layer in embeddings.items():
            table_bytes = int(np.prod(layer.embeddings.shape)) * np.dtype(layer.embeddings.dtype).itemsize
            chosen = choices.get(name)
            wanted = chosen if chosen is not None else threshold_bytes is not None and table_bytes > threshold_bytes
            if not wanted:
                continue
            lookup, reason = lookup_of(model, layer)
            if reason is None and not any(variable is layer.embeddings for variable in model.trainable_variables):
                reason = "it is frozen (trainable=False): only a trained table is split with its optimizer state"
            if reason is None:
                found[name] = (layer, lookup, bool(chosen), table_bytes)
            else:
                _refuse(name, reason, bool(chosen), table_bytes)
        while True:  # a table left replicated reads its ids too: the others looked up by them cannot be sharded
            conflicts = other_readers(model, {name: entry[1] for name, entry in found.items()})
            if not conflicts:
                break
            for name, reader in conflicts.items():
                layer, lookup, chosen, table_bytes = found.pop(name)
                _refuse(name, f"its ids ({_ids_words(lookup)}) are also read by {reader!r}, which would see their "
                        "positions in the batch instead: shard every table looked up by them, or none", chosen,
                        table_bytes)
        tables = []
        for name, (layer, lookup, _, table_bytes) in found.items():
            table = ShardedTable(name, lookup.input_name, int(layer.embeddings.shape[0]),
                                 tuple(int(d) for d in layer.embeddings.shape[1:]), world_size, lookup.ids_per_record,
                                 lookup.column)
            logger.info("Embedding layer %r (%d bytes) is sharded across %d workers: each holds %d of its %d rows "
                        "and their optimizer state", name, table_bytes, world_size, table.rows_per_rank, table.rows)
            tables.append(table)
        return cls(tuple(tables), world_size)

    def on(self, world_size: int) -> "ShardPlan":
        """The same tables split among ``world_size`` ranks (a lone worker holds them whole, its optimizer state in
        files as ever)."""
        return ShardPlan(tuple(dataclasses.replace(table, world_size=world_size) for table in self.tables), world_size)

    def capacities(self, local_batch: int) -> Dict[str, int]:
        """Rows of each table's working table on a rank (by layer): the ids ``local_batch`` records hold."""
        return {table.layer: local_batch * table.ids_per_record for table in self.tables}


def embedding_layers(model: Any) -> Dict[str, Any]:
    """The model's ``Embedding`` layers (nested models' included), by name."""
    import keras

    return {layer.name: layer for layer in nested_layers(model) if isinstance(layer, keras.layers.Embedding)}


def _refuse(name: str, reason: str, chosen: bool, table_bytes: int) -> None:
    """A table that cannot be sharded: an error when the user named it, else a warning (it stays replicated)."""
    if chosen:
        raise ConfigurationError(f"Embedding layer {name!r} cannot be sharded: {reason}. Keep it replicated (leave "
                                 "it out of the sharded tables)")
    logger.warning("Embedding layer %r (%d bytes) stays replicated on every worker: %s", name, table_bytes, reason)


def _ids_words(lookup: Lookup) -> str:
    """The ids a lookup reads, in words."""
    column = "" if lookup.column is None else f"[:, {lookup.column}]"
    return f"model input {lookup.input_name!r}{column}"


@dataclass(frozen=True)
class ShardingRequest:
    """What the session's settings ask for: a size threshold and per-layer choices.

    ``spark.sparktf.shardTableBytes`` (a size such as ``64m``; unset: no
    threshold) and ``spark.sparktf.shardTables`` (comma-separated ``Embedding``
    layer names to shard; ``-name`` keeps one replicated).
    """

    threshold_bytes: Optional[int] = None
    choices: Tuple[Tuple[str, bool], ...] = ()

    @classmethod
    def of_settings(cls, kind: Any) -> "ShardingRequest":
        """The request of ``kind``'s session settings (a ``SessionKind``)."""
        threshold = size_setting(kind, SHARD_TABLE_BYTES_CONF, "0") if kind.setting(SHARD_TABLE_BYTES_CONF, "") else None
        names = [name.strip() for name in kind.setting(SHARD_TABLES_CONF, "").split(",") if name.strip()]
        return cls(threshold, tuple((name.lstrip("-"), not name.startswith("-")) for name in names))

    @classmethod
    def of_keyword(cls, sharded_tables: Any, kind: Any) -> "ShardingRequest":
        """The request of ``TFOptimizer``'s ``sharded_tables``: ``"session"`` (the session's settings),
        ``"auto"`` (every table over ``spark.sparktf.shardTableBytes``, default 256m), a list of ``Embedding``
        layer names (exactly those), or None (none).

        Raises
        ------
        ConfigurationError
            For any other value.
        """
        if isinstance(sharded_tables, str) and sharded_tables == "session":
            return cls.of_settings(kind)
        if isinstance(sharded_tables, str) and sharded_tables == "auto":
            return cls(size_setting(kind, SHARD_TABLE_BYTES_CONF, AUTO_SHARD_TABLE_BYTES))
        if sharded_tables is None:
            return cls()
        names = [sharded_tables] if isinstance(sharded_tables, str) else sharded_tables
        if not isinstance(names, (list, tuple)) or not all(isinstance(name, str) and name for name in names):
            raise ConfigurationError(f"sharded_tables must be 'auto', a list of Embedding layer names or None; got "
                                     f"{sharded_tables!r}")
        return cls(None, tuple((name, True) for name in names))

    def plan(self, model: Any, world_size: int) -> ShardPlan:
        """The :class:`ShardPlan` of ``model`` on ``world_size`` workers (see :meth:`ShardPlan.of`)."""
        return ShardPlan.of(model, world_size, self.threshold_bytes, dict(self.choices))


def check_trainable(plan: ShardPlan, model: Any, clip_norm: Optional[float]) -> None:
    """Refuse what sharded tables cannot train yet (before any job).

    Raises
    ------
    ConfigurationError
        Clipping by the global norm (the norm would need every owner's rows),
        a loss-scaled (``mixed_float16``) optimizer, or a table that is not float32.
    """
    if not plan.tables:
        return
    names = [table.layer for table in plan.tables]
    if clip_norm is not None:
        raise ConfigurationError(f"sharded tables {names} cannot be trained with clipping by the global L2 norm yet; "
                                 "use set_constant_gradient_clipping, or keep the tables replicated")
    if hasattr(model.optimizer, "inner_optimizer"):
        raise ConfigurationError(f"sharded tables {names} cannot be trained with a loss-scaled (mixed_float16) "
                                 "optimizer yet; keep the tables replicated")
    layers = embedding_layers(model)
    other = [name for name in names if np.dtype(layers[name].embeddings.dtype) != np.float32]
    if other:
        raise ConfigurationError(f"sharded tables must be float32, {other} are not; keep them replicated")
