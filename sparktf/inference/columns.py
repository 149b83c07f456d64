"""Feature columns of a DataFrame against a model's inputs, from the schema alone (no Spark job).

Each column's rank, kind (text vs numbers) and the vector size ``VectorAssembler``
records are checked against the input it feeds; the result is the per-row
spec each column must have. Used by ``TFPredictor.predict_dataframe`` (a
streaming DataFrame's columns cannot be sampled) and by :mod:`sparktf.ml`.
Each error is a ``DataError`` naming the column, the option it came from and
what was expected.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
from pyspark.sql import DataFrame

from sparktf.data.arrow_io import column_kind, is_vector_column
from sparktf.data.specs import LeafSpec
from sparktf.errors import DataError
from sparktf.inference.feeds import TensorInfo

__all__ = ["check_columns_exist", "feature_leaves"]


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

