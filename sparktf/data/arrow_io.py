"""DataFrame columns <-> Arrow record batches <-> NumPy columns.

Driver side, :func:`column_layouts` works out the dtype and per-row shape of
numeric, ``ArrayType``, MLlib ``Vector``, string and binary columns, and :func:`arrow_ready`
turns dense vectors into float arrays inside the JVM (sparse ones travel as
MLlib's own struct of indices and values); :func:`arrow_batch_rdd` gets
the JVM's Arrow record batches of a DataFrame as an RDD of bytes, so the data
crosses from the JVM to Python once. Executor side, :class:`ArrowBlockDecoder`
converts the record batches into Blocks without creating per-row Python
objects. TensorFlow-free.
"""

from __future__ import annotations

from typing import Iterable, Iterator, List, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import RDD
from pyspark.serializers import NoOpSerializer
from pyspark.sql import Column, DataFrame
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from sparktf.data import specs
from sparktf.data.batching import inference_batches
from sparktf.data.columnar import Block, records_per_block
from sparktf.data.sparse import SparseColumn
from sparktf.errors import DataError

__all__ = [
    "column_layouts",
    "column_kind",
    "arrow_ready",
    "arrow_batch_rdd",
    "arrow_schema",
    "ArrowBlockDecoder",
    "arrow_to_numpy",
    "arrow_feature",
    "is_vector_column",
]

#: NumPy dtype of each supported scalar Spark type (doubles become float32, as in from_ndarrays).
_SCALAR_DTYPES = {
    T.ByteType: "int8",
    T.ShortType: "int16",
    T.IntegerType: "int32",
    T.LongType: "int64",
    T.FloatType: "float32",
    T.DoubleType: "float32",
    T.BooleanType: "bool",
}

#: Spark types fed as scalar ``tf.string`` values (``object`` arrays of ``bytes``; strings UTF-8 encoded).
_TEXT_TYPES = (T.StringType, T.BinaryType)

_SUPPORTED = "numeric scalars, (nested) ArrayType of numbers, pyspark.ml / pyspark.mllib Vector, string or binary"


def column_layouts(df: DataFrame, columns: Sequence[str]) -> List[tuple]:
    """``(dtype name, per-row shape)`` of each of ``columns``; ``("string", ())`` for string and binary columns.

    The lengths of array and vector columns are read from the DataFrame's
    first row (one small Spark job, only when there are such columns); every
    other row must have the same lengths, which the executors check. A
    vector column whose first row is a ``SparseVector`` smaller as indices
    and values than dense is ``(dtype, shape, "sparse")``: kept sparse.

    Raises
    ------
    DataError
        For a missing column, an unsupported column type (naming the column
        and its type), or when a length cannot be read from the first row.
    """
    fields = {field.name: field for field in df.schema.fields}
    kinds = []
    for name in columns:
        if name not in fields:
            raise DataError(f"column {name!r} is not in the DataFrame; its columns are {df.columns}")
        kinds.append(column_kind(name, fields[name].dataType))
    needs_sample = [name for name, (_, depth) in zip(columns, kinds) if depth]
    sample = df.select(*needs_sample).head() if needs_sample else None
    if needs_sample and sample is None:
        raise DataError(
            f"cannot read the lengths of array/vector columns {needs_sample} from an empty DataFrame"
        )
    layouts = []
    for name, (dtype, depth) in zip(columns, kinds):
        shape = _sample_shape(name, sample[name], depth) if depth else ()
        layouts.append((dtype, shape, "sparse") if depth and _stays_sparse(sample[name]) else (dtype, shape))
    return layouts


def _stays_sparse(value) -> bool:
    """Whether an MLlib vector is a ``SparseVector`` whose int32 indices and float32 values (and a row offset) take
    fewer bytes than its dense float32s."""
    return hasattr(value, "indices") and 8 * len(value.indices) + 8 < 4 * int(value.size)


def column_kind(name: str, data_type: T.DataType) -> Tuple[str, int]:
    """``(dtype, array depth)`` of a column of type ``data_type``, from the schema alone; vectors have depth 1.

    Raises
    ------
    DataError
        For a type TensorFlow cannot be fed, naming column ``name`` and its type.
    """
    if _is_vector(data_type):
        return "float32", 1
    if isinstance(data_type, _TEXT_TYPES):
        return "string", 0
    depth, element = 0, data_type
    while isinstance(element, T.ArrayType):
        depth, element = depth + 1, element.elementType
    dtype = _SCALAR_DTYPES.get(type(element))
    if dtype is None:
        raise DataError(
            f"column {name!r} has type {data_type.simpleString()}, which TFDataset cannot feed to "
            f"TensorFlow; supported are {_SUPPORTED}. Cast or transform the column first "
            "(e.g. col.cast('double'), or to_json for structs and maps)."
        )
    return dtype, depth


def _is_vector(data_type: T.DataType) -> bool:
    return isinstance(data_type, T.UserDefinedType) and data_type.simpleString() == "vector"


def _sample_shape(name: str, value, depth: int) -> Tuple[int, ...]:
    if value is None:
        raise DataError(f"column {name!r} is null in the first row; fill or drop nulls first (df.na.drop())")
    if hasattr(value, "size") and not isinstance(value, (list, tuple)):  # an MLlib vector
        return (int(value.size),)
    try:
        shape = np.asarray(value, dtype=np.float64).shape
    except (TypeError, ValueError) as exc:
        raise DataError(f"column {name!r}: the nested arrays of the first row are ragged ({exc})") from None
    if len(shape) != depth:
        raise DataError(
            f"column {name!r}: cannot read {depth} array lengths from the first row {value!r:.80} "
            "(an empty inner array?)"
        )
    return shape


def is_vector_column(df: DataFrame, name: str) -> bool:
    """Whether column ``name`` of ``df`` holds MLlib vectors."""
    return _is_vector(df.schema[name].dataType)


def arrow_feature(df: DataFrame, name: str, sparse: bool = False) -> Column:
    """Column ``name`` as Arrow can carry it: vectors become float32 arrays, unless ``sparse``.

    The conversion of vectors runs in the JVM (``vector_to_array``), so no
    Python object is created per row; other columns, and the vectors of a
    ``sparse`` leaf (MLlib's struct of size, indices and values in Arrow),
    are returned as they are.
    """
    if sparse or not is_vector_column(df, name):
        return df[name]
    from pyspark.ml.functions import vector_to_array

    return vector_to_array(df[name], "float32")


def arrow_ready(df: DataFrame, columns: Sequence[str], leaves: Sequence[specs.LeafSpec] = ()) -> DataFrame:
    """``df`` reduced to ``columns`` in order (named ``_0, _1, ...``), vectors as float32 arrays but for sparse
    ``leaves`` (one per column)."""
    sparse = [leaf.sparse for leaf in leaves] or [False] * len(columns)
    return df.select(*(arrow_feature(df, name, flag).alias(f"_{i}") for i, (name, flag) in enumerate(zip(columns, sparse))))


def arrow_batch_rdd(df: DataFrame) -> RDD:
    """The Arrow record batches of ``df``'s partitions, made by the JVM, as an RDD of ``bytes``.

    Calls ``Dataset.toArrowBatchRdd`` (``private[sql]`` in Scala, public in
    the bytecode) through Py4J: the JVM turns rows into Arrow record batches
    of at most ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows, and
    each batch crosses to Python once, as one serialized record-batch IPC
    message (no schema message; read it with :func:`arrow_schema`). The RDD
    keeps ``df``'s partitions. Like ``df.rdd``, this plans ``df`` and may run
    the jobs of its shuffles (adaptive query execution).
    """
    session = df.sparkSession
    java_rdd = df._jdf.toArrowBatchRdd().toJavaRDD()
    return RDD(java_rdd, session.sparkContext, NoOpSerializer())


def arrow_schema(df: DataFrame) -> pa.Schema:
    """The Arrow schema of the record batches of :func:`arrow_batch_rdd` for ``df`` (a vector as MLlib's struct)."""
    fields = [T.StructField(field.name, field.dataType.sqlType(), field.nullable)
              if isinstance(field.dataType, T.UserDefinedType) else field for field in df.schema.fields]
    return to_arrow_schema(T.StructType(fields))


class ArrowBlockDecoder:
    """Serialized Arrow record batches of one partition -> Blocks (a ``mapPartitionsWithIndex`` function).

    Each batch becomes NumPy columns without per-row Python objects; the
    columns are then cut or joined into Blocks of about
    :data:`~sparktf.data.columnar.TARGET_BLOCK_BYTES`.

    Parameters
    ----------
    schema : pyarrow.Schema
        Schema of the batches (:func:`arrow_schema`).
    leaves : list of LeafSpec
        One per column of ``schema``, in order.
    column_names : list of str
        The user's names of the columns, for error messages.
    """

    def __init__(self, schema: pa.Schema, leaves: Sequence[specs.LeafSpec], column_names: Sequence[str]):
        self.schema = schema
        self.leaves = list(leaves)
        self.column_names = list(column_names)

    def __call__(self, partition: int, messages: Iterable[bytes]) -> Iterator[Block]:
        batches = (pa.ipc.read_record_batch(pa.py_buffer(message), self.schema) for message in messages)
        return self.blocks(partition, batches)

    def blocks(self, partition: int, batches: Iterable[pa.RecordBatch]) -> Iterator[Block]:
        """The Blocks of a partition's record batches (``mapInArrow``'s input in Spark Connect)."""
        capacity = records_per_block(self.leaves)
        for arrays in inference_batches(self._batch_columns(partition, batches), capacity):
            yield tuple(arrays)

    def _batch_columns(self, partition: int, batches: Iterable[pa.RecordBatch]) -> Iterator[Block]:
        first_row = 0
        for batch in batches:
            yield tuple(
                arrow_to_numpy(batch.column(i), leaf, name, partition, first_row)
                for i, (leaf, name) in enumerate(zip(self.leaves, self.column_names))
            )
            first_row += batch.num_rows


def arrow_to_numpy(
    array: pa.Array, leaf: specs.LeafSpec, column: str, partition: int, first_row: int
) -> np.ndarray:
    """An Arrow column as a C-contiguous array of ``leaf``'s dtype, shape ``(rows,) + leaf.shape``.

    Nested list columns are flattened level by level; each level must have
    the leaf's length in every row. String and binary columns of a
    ``tf.string`` leaf become ``object`` arrays of ``bytes``, the MLlib
    vectors of a sparse leaf a :class:`~sparktf.data.sparse.SparseColumn`.

    Raises
    ------
    DataError
        For a null or a row of another length, naming the column, the
        partition and the row's index within the partition.
    """
    if leaf.is_string:
        _check_no_nulls(array, column, partition, first_row, 1)
        as_bytes = array.cast(pa.large_binary() if pa.types.is_large_string(array.type) else pa.binary())
        return as_bytes.to_numpy(zero_copy_only=False).astype(object, copy=False)
    if leaf.sparse:
        return _sparse_vectors(array, leaf, column, partition, first_row)
    rows = len(array)
    values = array
    elements_per_row = 1
    for level, length in enumerate(leaf.shape):
        _check_no_nulls(values, column, partition, first_row, elements_per_row)
        lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
        wrong = np.flatnonzero(lengths != length)
        if wrong.size:
            row = first_row + int(wrong[0]) // elements_per_row
            raise DataError(
                f"column {column!r}, partition {partition}, row {row} (0-based within the partition): "
                f"an array of length {int(lengths[wrong[0]])} at nesting level {level}, expected {length} "
                f"(the column's shape {list(leaf.shape)}: a DataFrame's first row's, a stream's from the model's "
                "inputs or the schema). Pad or truncate the arrays to one length.", bad_row=(partition, row)
            )
        values = values.flatten()
        elements_per_row *= length
    _check_no_nulls(values, column, partition, first_row, elements_per_row)
    flat = values.to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(flat.astype(leaf.dtype, copy=False).reshape((rows,) + leaf.shape))


def _check_no_nulls(values: pa.Array, column: str, partition: int, first_row: int, elements_per_row: int) -> None:
    if values.null_count:
        position = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        row = first_row + position // max(elements_per_row, 1)
        raise DataError(
            f"column {column!r}, partition {partition}, row {row} (0-based within the partition) holds a "
            "null; fill or drop nulls first (df.na.fill / df.na.drop).", bad_row=(partition, row)
        )


def _sparse_vectors(array: pa.Array, leaf: specs.LeafSpec, column: str, partition: int, first_row: int) -> SparseColumn:
    """MLlib vectors (Arrow structs of type, size, indices, values) as a SparseColumn, without per-row work.

    A ``DenseVector`` row keeps all its values (indices ``0..width-1``).
    """
    _check_no_nulls(array, column, partition, first_row, 1)
    kinds, sizes, indices, values = array.flatten()
    lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False).astype(np.int64)
    sparse_rows = kinds.to_numpy(zero_copy_only=False) == 0
    widths = np.where(sparse_rows, pc.fill_null(sizes, -1).to_numpy(zero_copy_only=False), lengths)
    (width,) = leaf.shape
    wrong = np.flatnonzero(widths != width)
    if wrong.size:
        row = first_row + int(wrong[0])
        raise DataError(
            f"column {column!r}, partition {partition}, row {row} (0-based within the "
            f"partition): a vector of size {int(widths[wrong[0]])}, expected {width} (a DataFrame's first row's, a "
            "stream's from the model's inputs or the schema). "
            "Every vector of a column must have one size.", bad_row=(partition, row)
        )
    indptr = np.zeros(len(array) + 1, np.int64)
    np.cumsum(lengths, out=indptr[1:])
    stored = indices.flatten().to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    if not sparse_rows.all():  # dense rows: every position
        positions = np.arange(indptr[-1], dtype=np.int64) - np.repeat(indptr[:-1], lengths)
        column_indices = positions.astype(np.int32)
        column_indices[np.repeat(sparse_rows, lengths)] = stored
        stored = column_indices
    flat = values.flatten().to_numpy(zero_copy_only=False).astype(leaf.dtype, copy=False)
    return SparseColumn(indptr, np.ascontiguousarray(stored), np.ascontiguousarray(flat), width)
