"""The Blocks behind ``TFDataset``'s factories: RDD records, driver arrays, DataFrame columns.

Each function checks its input and builds a cached :class:`~sparktf.data.block_sets.BlockSet`
of columnar Blocks (see :mod:`sparktf.data.columnar`) in a
:class:`~sparktf.data.columnar.RecordFormat`; :class:`sparktf.dataset.TFDataset`
adds the specs and batching options. This is where the session's kind picks
where Blocks live: an RDD in a classic session, a DataFrame in Spark Connect
(:mod:`sparktf.data.frame_blocks`).
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple, Union

import numpy as np
from pyspark import RDD
from pyspark.sql import DataFrame

from sparktf.data import arrow_io, specs
from sparktf.data.block_serializer import block_rdd, cached
from sparktf.data.block_sets import BlockSet, RddBlockSet
from sparktf.data.columnar import RecordFormat, to_leaf_column
from sparktf.data.driver_blocks import cached_driver_blocks, driver_partitions
from sparktf.data.frame_blocks import EncodedBlocks, FrameBlockSet, encoded_frame
from sparktf.data.sample_weights import checked_maker
from sparktf.errors import DataError
from sparktf.spark.remote_errors import reporting_failures

__all__ = [
    "check_is_rdd",
    "rdd_blocks",
    "tensors_element",
    "tf_dtype_of",
    "ndarray_blocks",
    "column_names",
    "check_weight_column",
    "one_or_list",
    "dataframe_blocks",
    "item_partitions",
]


def rdd_blocks(session: Any, rdd: RDD, record_format: RecordFormat, name: str) -> BlockSet:
    """The cached Blocks of an RDD of records (``name`` names the cache: "training", "validation")."""
    to_blocks = reporting_failures(session, checked_maker(record_format.to_blocks, record_format.has_weights))
    return RddBlockSet(session, cached(block_rdd(rdd.mapPartitionsWithIndex(to_blocks)), name))


def check_is_rdd(value: Any, name: str) -> None:
    if not isinstance(value, RDD):
        hint = " (use TFDataset.from_dataframe for a DataFrame)" if isinstance(value, DataFrame) else ""
        raise DataError(f"{name} must be a pyspark RDD, got {type(value).__name__}{hint}")


def tensors_element(tensors: Any, name: str) -> tuple:
    """``(features, labels)`` or ``(features,)`` of ``from_ndarrays`` input."""
    if isinstance(tensors, tuple) and not hasattr(tensors, "_fields"):
        if len(tensors) in (1, 2):
            return tensors
        raise DataError(
            f"{name} is a tuple of {len(tensors)}; give x, (x,) or (x, y), and put several "
            "feature arrays in a list: ([x1, x2], y)"
        )
    return (tensors,)


def tf_dtype_of(array: Any) -> str:
    """The spec dtype for an array: float64 -> float32, text -> string, others unchanged."""
    dtype = np.asarray(array).dtype
    if dtype.kind in "USO":
        return "string"
    return "float32" if dtype == np.float64 else dtype.name


def ndarray_blocks(session: Any, record_format: RecordFormat, element, name: str, partitions: int
                   ) -> Tuple[BlockSet, List[int]]:
    """The cached Blocks of contiguous ranges of the arrays of ``element``, and the partitions' record counts.

    ``session`` is the :class:`~sparktf.spark.session_kind.SessionKind`: the
    Blocks travel to a classic session's executors in one broadcast per
    partition, and to a Connect server in one ``createDataFrame``.
    """
    leaves = record_format.leaves
    try:
        values = specs.flatten_like(record_format.element, element, name)
        columns = tuple(to_leaf_column(value, leaf) for value, leaf in zip(values, leaves))
    except DataError as exc:
        raise DataError(f"{name}: {exc}") from None
    lengths = {leaf.path: len(column) for leaf, column in zip(leaves, columns)}
    if len(set(lengths.values())) > 1:
        raise DataError(f"{name}: the arrays have different numbers of records {lengths}; they must be equal")
    partitioned = driver_partitions(columns, leaves, partitions)
    counts = [sum(len(block[0]) for block in blocks) for blocks in partitioned]
    if session.has_rdds:
        sc = session.spark_context("TFDataset.from_ndarrays", "")
        return RddBlockSet(session, cached_driver_blocks(sc, partitioned, name)), counts
    blocks = FrameBlockSet(session, encoded_frame(session.session, partitioned), EncodedBlocks(),
                           num_partitions=partitions)
    blocks.persist(name)
    return blocks, counts


def column_names(cols: Union[str, Sequence[str]], name: str) -> List[str]:
    names = [cols] if isinstance(cols, str) else list(cols)
    if not names or not all(isinstance(col, str) for col in names):
        raise DataError(f"{name} must be a column name or a non-empty list of them, got {cols!r}")
    return names


def check_weight_column(df: DataFrame, name: Any, option: str = "weight_col") -> None:
    """Refuse a weight column (the value of ``option``) that is not a numeric column of ``df``, naming it and its
    type."""
    from pyspark.sql import types as T

    fields = {field.name: field.dataType for field in df.schema.fields}
    if not isinstance(name, str) or name not in fields:
        raise DataError(f"{option} {name!r} is not a column of the DataFrame; its columns are {df.columns}. "
                        "Name the column of the sample weights")
    numeric = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType)
    if not isinstance(fields[name], numeric):
        raise DataError(
            f"{option} {name!r} has type {fields[name].simpleString()}, but sample weights are numbers (one "
            f"per row): cast it first, e.g. df.withColumn({name!r}, F.col({name!r}).cast('double'))"
        )


def one_or_list(column_specs: list):
    return column_specs[0] if len(column_specs) == 1 else column_specs


def dataframe_blocks(session: Any, df: DataFrame, columns: List[str], record_format: RecordFormat,
                     name: str, cache: bool = True) -> BlockSet:
    """Blocks of ``columns`` of ``df``: Arrow record batches cached in the JVM, decoded when read.

    The batches stay in the JVM's cache (no round trip through Python); each
    read decodes them without per-row work (zero-copy for columns that are
    already of their leaf's dtype). A classic session caches the batches of
    ``toArrowBatchRdd``; Spark Connect persists the reduced DataFrame, and
    each ``mapInArrow`` task decodes its batches. Without ``cache`` (a stream's
    micro-batch, read a few times and then gone) every job reads ``df`` again.
    """
    ready = arrow_io.arrow_ready(df, columns, record_format.leaves)
    decoder = arrow_io.ArrowBlockDecoder(arrow_io.arrow_schema(ready), record_format.leaves, columns)
    weights = f"weight column {columns[-1]!r}"  # the last column, when the format has weights
    if session.has_rdds:
        batches = arrow_io.arrow_batch_rdd(ready)
        batches = cached(batches, f"{name} Arrow") if cache else batches
        return RddBlockSet(session, block_rdd(batches.mapPartitionsWithIndex(
            reporting_failures(session, checked_maker(decoder, record_format.has_weights, weights)))))
    blocks = FrameBlockSet(session, ready, checked_maker(decoder.blocks, record_format.has_weights, weights))
    if cache:
        blocks.persist(name)
    return blocks


def item_partitions(session: Any, items: List[Any]) -> BlockSet:
    """``items`` of the driver (e.g. file paths), one per partition, for :meth:`BlockSet.map_partitions`."""
    if session.has_rdds:
        return RddBlockSet.of_items(session, items)
    return FrameBlockSet.of_items(session, items)
