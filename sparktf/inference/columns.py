"""Feature columns of a DataFrame against a model's inputs, from the schema alone (no Spark job).

Each column's rank, kind (text vs numbers) and the vector size ``VectorAssembler``
records are checked against the input it feeds; the result is the per-row
spec each column must have. Used by ``TFPredictor.predict_dataframe`` (a
streaming DataFrame's columns cannot be sampled) and by :mod:`sparktf.ml`.
Each error is a ``DataError`` naming the column, the option it came from and
what was expected.

:func:`stream_leaves` is the one resolver of a streaming DataFrame's column
lengths (a stream cannot be read before its query runs), for a streaming
``TFDataset`` (``streaming.stream_dataset.resolved_for``) and for
``TFPredictor.predict_dataframe`` of a stream.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
from pyspark.sql import DataFrame

from sparktf.data.arrow_io import column_kind, is_vector_column
from sparktf.data.specs import LeafSpec
from sparktf.data.stream_frames import stream_layouts
from sparktf.errors import DataError
from sparktf.inference.feeds import TensorInfo

__all__ = ["check_columns_exist", "feature_leaves", "stream_leaves"]


def check_columns_exist(df: DataFrame, columns: Sequence[str], parameter: str) -> None:
    """Refuse a column that ``df`` does not have, naming the Param that named it."""
    for name in columns:
        if name not in df.columns:
            raise DataError(f"{parameter} column {name!r} is not in the DataFrame; its columns are {df.columns}")


def feature_leaves(
    df: DataFrame, columns: Sequence[str], inputs: Optional[Sequence[TensorInfo]], parameter: str
) -> Optional[List[LeafSpec]]:
    """Check ``columns`` against the model's ``inputs``; the per-row spec each column must have.

    Columns match inputs by name when all names match, else by position (as
    :func:`sparktf.inference.feeds.plan_feed` does).

    Returns
    -------
    list of LeafSpec or None
        One per column (the column's dtype, the input's shape; sparse for
        a Vector column of a ``sparse=True`` input); None when
        the model declares no inputs or an input has a dimension of any
        size (the rows' lengths then come from the data).

    Raises
    ------
    DataError
        For a missing or unsupported column, another number of columns than
        inputs, or a column whose rank, kind (text vs numbers) or recorded
        vector size does not fit its input.
    """
    check_columns_exist(df, columns, parameter)
    kinds = [column_kind(name, df.schema[name].dataType) for name in columns]
    if inputs is None:
        return None
    if len(inputs) != len(columns):
        raise DataError(
            f"the model takes {len(inputs)} input(s) [{_described(inputs)}] but {parameter} names "
            f"{len(columns)} column(s) {list(columns)}: give one column per input (featureCols=[...] for several)"
        )
    by_name = {info.name: info for info in inputs}
    matched = [by_name[c] for c in columns] if set(columns) == set(by_name) else list(inputs)
    leaves = []
    for name, (dtype, depth), info in zip(columns, kinds, matched):
        _check_feature(df, name, dtype, depth, info, parameter)
        sparse = info.sparse and is_vector_column(df, name)  # read as MLlib's indices and values
        leaves.append(LeafSpec(name, np.dtype(object if dtype == "string" else dtype), tuple(info.shape), sparse))
    return None if any(None in leaf.shape for leaf in leaves) else leaves


def stream_leaves(
    df: DataFrame, columns: Sequence[str], declared: Optional[Sequence[TensorInfo]],
    fallback: Sequence[Optional[Tuple[Optional[int], ...]]] = (), features: Optional[int] = None, advice: str = "",
) -> List[LeafSpec]:
    """The dtype and per-row shape of each of a streaming DataFrame's ``columns``, from the schema and the model.

    The first ``features`` columns (default: all) feed the model's ``declared`` inputs: when these tell every
    length, they give the features' specs (checked as :func:`feature_leaves` does). Every other length comes from
    the schema (the vector size ``VectorAssembler`` records), else from ``fallback``, a shape per column (None: no
    fallback) of the column's rank: the model's output for a label, or the specs of a predictor's dataset.

    Parameters
    ----------
    df : pyspark.sql.DataFrame
        The streaming DataFrame (nothing is read).
    columns : list of str
        Its columns, the features first.
    declared : list of TensorInfo, optional
        The inputs the model declares (None: none).
    fallback : list of tuple, optional
        Per column, a shape to take where the schema does not tell a length.
    features : int, optional
        How many of ``columns`` feed ``declared``.
    advice : str
        What else the caller could give, appended to the error's advice.

    Raises
    ------
    DataError
        For a missing or unsupported column, columns that do not fit ``declared``, or a length nothing tells,
        naming the columns.
    """
    features = len(columns) if features is None else features
    known = feature_leaves(df, columns[:features], declared, "feature_cols") or []
    leaves, layouts = list(known), stream_layouts(df, columns)
    for index in range(len(known), len(columns)):
        (dtype, shape), other = layouts[index], fallback[index] if index < len(fallback) else None
        if None in shape and other is not None and len(other) == len(shape):
            shape = other
        leaves.append(LeafSpec(columns[index], np.dtype(object if dtype == "string" else dtype), tuple(shape)))
    unknown = [leaf.path for leaf in leaves if None in leaf.shape]
    if unknown:
        raise DataError(
            f"the lengths of the array or vector columns {unknown} of the streaming DataFrame are not known: a "
            "stream cannot be read before its query runs, and neither its schema nor the model tells them. Give "
            "the model inputs (and output) of fixed shapes, e.g. keras.Input((n,)), or assemble the columns with "
            f"VectorAssembler{advice}")
    return leaves


def _check_feature(df: DataFrame, name: str, dtype: str, depth: int, info: TensorInfo, parameter: str) -> None:
    data_type = df.schema[name].dataType.simpleString()
    wants_text = info.dtype == np.dtype(object)
    if (dtype == "string") != wants_text:
        raise DataError(
            f"{parameter} column {name!r} is {data_type} but model input {info.describe()} takes "
            f"{'text' if wants_text else 'numbers'}: pick another column or convert it"
        )
    if depth != len(info.shape):
        expected = "a numeric column" if not info.shape else (
            "a Vector or array column" if len(info.shape) == 1 else f"arrays nested {len(info.shape)} deep")
        raise DataError(
            f"{parameter} column {name!r} is {data_type} but model input {info.describe()} takes {expected} "
            "per row (e.g. VectorAssembler for several numeric columns)"
        )
    size = _recorded_vector_size(df, name)
    if size is not None and info.shape[0] not in (None, size):
        raise DataError(
            f"{parameter} column {name!r} holds vectors of size {size} but model input {info.describe()} "
            f"takes {info.shape[0]} values per row"
        )


def _recorded_vector_size(df: DataFrame, name: str) -> Optional[int]:
    """The size ``VectorAssembler`` (and other ml stages) record in a vector column's metadata."""
    size = df.schema[name].metadata.get("ml_attr", {}).get("num_attrs")
    return int(size) if isinstance(size, int) else None


def _described(inputs: Sequence[TensorInfo]) -> str:
    return ", ".join(info.describe() for info in inputs)

