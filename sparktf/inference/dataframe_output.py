"""``predict_dataframe``'s executor side: model outputs as Arrow columns of Spark types."""

from __future__ import annotations

from typing import Any, Iterator, List, Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql import types as T

from sparktf.data import arrow_io, batching
from sparktf.errors import DataError
from sparktf.inference.feeds import DICT, SINGLE, TensorInfo
from sparktf.inference.runners import flat_outputs, partition_id, run_batches, text_values

__all__ = ["DataFramePredict", "spark_output_type", "arrow_column", "spark_type"]

_SPARK_TYPES = {
    "float32": T.FloatType(),
    "float64": T.DoubleType(),
    "int8": T.ByteType(),
    "int16": T.ShortType(),
    "int32": T.IntegerType(),
    "int64": T.LongType(),
    "bool": T.BooleanType(),
    "object": T.BinaryType(),
    "str": T.StringType(),
}
# Output dtypes Spark has no type for, and what they are widened to.
_WIDENED = {"float16": "float32", "bfloat16": "float32", "uint8": "int16", "uint16": "int32", "uint32": "int64"}


def arrow_column(array: np.ndarray) -> pa.Array:
    """An ``(n, d1, d2, ...)`` array as Arrow nested lists (``list<list<...>>``)."""
    array = np.ascontiguousarray(array.astype(_WIDENED.get(array.dtype.name, array.dtype), copy=False))
    flat = array.reshape(-1)
    texts = text_values(flat)
    if texts is not None:  # generated text
        values = pa.array(texts, type=pa.string())
    else:
        values = pa.array(flat, type=pa.binary() if array.dtype == object else None)
    for depth in range(array.ndim - 1, 0, -1):  # innermost level first
        lists = int(np.prod(array.shape[:depth]))
        offsets = np.arange(lists + 1, dtype=np.int32) * array.shape[depth]
        values = pa.ListArray.from_arrays(pa.array(offsets), values)
    return values


def spark_type(info: TensorInfo) -> T.DataType:
    name = "str" if info.dtype.kind == "U" else _WIDENED.get(info.dtype.name, info.dtype.name)
    if name not in _SPARK_TYPES:
        raise DataError(f"model output {info.describe()} has a dtype Spark cannot hold")
    data_type = _SPARK_TYPES[name]
    for _ in info.shape:
        data_type = T.ArrayType(data_type, containsNull=False)
    return data_type


def spark_output_type(kind: str, outputs: Sequence[TensorInfo]) -> T.DataType:
    if kind == SINGLE:
        return spark_type(outputs[0])
    names = [info.name if kind == DICT else f"output_{i}" for i, info in enumerate(outputs)]
    return T.StructType([T.StructField(n, spark_type(info), False) for n, info in zip(names, outputs)])


class DataFramePredict:
    """``mapInArrow`` function: each record batch's kept columns plus the prediction.

    Batches of the model never span two Arrow record batches (Spark's
    ``spark.sql.execution.arrow.maxRecordsPerBatch``, 10,000 rows by default).
    """

    def __init__(self, handle, feed, leaves, feature_columns, kept_columns, batch, output_col, output_type,
                 version_col=None):
        self.handle = handle
        self.feed = feed
        self.leaves = list(leaves)
        self.feature_columns = list(feature_columns)
        self.kept_columns = list(kept_columns)
        self.batch = batch
        self.output_col = output_col
        self.output_type = output_type
        self.version_col = version_col

    def __call__(self, record_batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = partition_id()
        first_row = 0
        handle = None
        for record_batch in record_batches:
            handle = handle or self.handle.pinned()  # a published version: looked up once for the task
            block = tuple(
                arrow_io.arrow_to_numpy(record_batch.column(name), leaf, name, partition, first_row)
                for leaf, name in zip(self.leaves, self.feature_columns)
            )
            batches = batching.inference_batches([block], self.batch)
            outputs = [output for _, output in run_batches(handle, self.feed, batches, partition)]
            columns = [record_batch.column(name) for name in self.kept_columns]
            columns.append(self._prediction_column(outputs, record_batch.num_rows))
            names = self.kept_columns + [self.output_col]
            if self.version_col is not None:
                columns.append(pa.array(np.full(record_batch.num_rows, handle.version.version, np.int64)))
                names.append(self.version_col)
            yield pa.RecordBatch.from_arrays(columns, names=names)
            first_row += record_batch.num_rows

    def _prediction_column(self, outputs: List[Any], num_rows: int) -> pa.Array:
        if not outputs:
            return pa.nulls(num_rows, type=pa.float32())
        parts = [flat_outputs(output)[2] for output in outputs]
        arrays = [arrow_column(np.concatenate(pieces)) for pieces in zip(*parts)]
        if isinstance(self.output_type, T.StructType):
            return pa.StructArray.from_arrays(arrays, names=self.output_type.names)
        return arrays[0]
