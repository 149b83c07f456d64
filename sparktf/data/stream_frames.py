"""A streaming DataFrame behind a ``TFDataset``: its columns' specs from the schema, its micro-batches' Blocks.

A Structured Streaming DataFrame cannot be read outside its query, so a
streaming dataset holds no Blocks: :class:`StreamFrames` keeps the stream
and its columns, refuses what needs records now (an RDD, counts), and makes
each micro-batch's Blocks (:meth:`StreamFrames.micro_batch`) in the stream's
record format. The specs come from the schema alone (:func:`stream_layouts`);
a length the schema does not tell is None until the model tells it.
TensorFlow-free.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from pyspark.sql import DataFrame

from sparktf.data import arrow_io
from sparktf.data.block_sets import BlockSet
from sparktf.data.columnar import RecordFormat
from sparktf.data.sources import dataframe_blocks
from sparktf.errors import ConfigurationError, DataError

__all__ = ["StreamFrames", "stream_layouts"]

_USE_OPTIMIZE_STREAM = (
    "it is a streaming dataset (TFDataset.from_dataframe of a streaming DataFrame), whose records exist only inside "
    "its query: train with TFOptimizer.optimize_stream, score with TFPredictor.predict_dataframe on the stream")


def stream_layouts(df: DataFrame, columns: Sequence[str]) -> List[Tuple[str, Tuple[Optional[int], ...]]]:
    """``(dtype, per-row shape)`` of each of ``columns`` from ``df``'s schema; a length it does not tell is None.

    A vector column's size is what ``VectorAssembler`` records in its metadata.

    Raises
    ------
    DataError
        For a missing or unsupported column.
    """
    missing = [name for name in columns if name not in df.columns]
    if missing:
        raise DataError(f"columns {missing} are not in the streaming DataFrame; its columns are {df.columns}")
    layouts = []
    for name in columns:
        field = df.schema[name]
        dtype, depth = arrow_io.column_kind(name, field.dataType)
        shape: Tuple[Optional[int], ...] = (None,) * depth
        size = field.metadata.get("ml_attr", {}).get("num_attrs")
        if arrow_io.is_vector_column(df, name) and isinstance(size, int):
            shape = (size,)
        layouts.append((dtype, shape))
    return layouts


class StreamFrames:
    """The streaming DataFrame of a streaming dataset (in place of its Blocks).

    Parameters
    ----------
    kind : SessionKind
        The session.
    frame : pyspark.sql.DataFrame
        The streaming DataFrame.
    columns : list of str
        The columns of the records, features first (then labels, then the weight).
    """

    def __init__(self, kind: Any, frame: DataFrame, columns: Sequence[str]):
        self.kind = kind
        self.frame = frame
        self.columns = list(columns)

    @property
    def num_partitions(self) -> int:
        """The session's default parallelism: a stream's micro-batches have partitions of their own."""
        return self.kind.default_parallelism()

    def micro_batch(self, batch: DataFrame, record_format: RecordFormat) -> BlockSet:
        """The Blocks of one micro-batch (``foreachBatch``'s DataFrame), read by each job that uses them."""
        return dataframe_blocks(self.kind, batch, self.columns, record_format, "micro-batch", cache=False)

    def _refuse(self, what: str) -> Any:
        raise ConfigurationError(f"{what} needs the dataset's records, but {_USE_OPTIMIZE_STREAM}")

    @property
    def rdd(self) -> Any:
        return self._refuse("an RDD of the dataset")

    def count_records(self) -> List[int]:
        return self._refuse("counting records")
