"""Checks of DataFrame columns against a model, from the schema alone (no Spark job).

Feature columns against the model's inputs (rank, text vs numbers, the
vector size ``VectorAssembler`` records), the label column against the
model's output and loss (the class count ``StringIndexer`` records). Each
error is a ``DataError`` naming the column, the Param it came from and what
was expected.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
from pyspark.sql import DataFrame

from sparktf.data.arrow_io import column_kind, is_vector_column
from sparktf.data.specs import LeafSpec
from sparktf.errors import DataError
from sparktf.inference.feeds import TensorInfo

__all__ = ["check_columns_exist", "feature_leaves", "check_label_column", "model_output"]


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


def model_output(model: Any) -> Optional[TensorInfo]:
    """A Keras model's single declared output, or None (several outputs, or none declared)."""
    outputs = getattr(model, "outputs", None)
    if not outputs or len(outputs) != 1:
        return None
    return TensorInfo.from_tensor("output", outputs[0])


def check_label_column(
    df: DataFrame, name: str, output: Optional[TensorInfo], loss: Optional[str], classifier: bool
) -> None:
    """Refuse a label column that cannot fit the model's output under its loss.

    A classifier trained with a sparse or binary cross-entropy takes one
    number per row, a class index below the number of classes its output
    has (checked against the values a ``StringIndexer`` recorded); other
    models take one number per output value, or a Vector / array column of
    the output's length.

    Raises
    ------
    DataError
        Naming ``labelCol``'s column, its type and what fits.
    """
    check_columns_exist(df, [name], "labelCol")
    field = df.schema[name]
    dtype, depth = column_kind(name, field.dataType)
    described = f"labelCol column {name!r} is {field.dataType.simpleString()}"
    if dtype == "string":
        raise DataError(f"{described}: labels must be numbers; index text labels first (StringIndexer)")
    if output is None or None in output.shape:
        return
    classes = _class_count(output, loss) if classifier else None
    if classes is not None:
        if depth:
            raise DataError(f"{described}, but {loss} takes one class index per row (a numeric column)")
        recorded = field.metadata.get("ml_attr", {}).get("vals")
        if recorded and len(recorded) > classes:
            raise DataError(
                f"{described} with {len(recorded)} classes {recorded[:10]}, but the model's output "
                f"{output.describe()} has room for {classes}: give the last layer {len(recorded)} units"
                + (" (softmax)" if classes > 2 else "")
            )
        return
    wanted, ranks = _label_ranks(output)
    if depth not in ranks:
        raise DataError(f"{described}, but the model's output {output.describe()} needs {wanted} per row")


def _class_count(output: TensorInfo, loss: Optional[str]) -> Optional[int]:
    """How many classes a sparse / binary cross-entropy model's output tells apart (None: other losses)."""
    if loss in ("sparse_categorical_crossentropy",) and len(output.shape) == 1:
        return int(output.shape[0])
    if loss in ("binary_crossentropy", "binary_focal_crossentropy") and tuple(output.shape) in ((), (1,)):
        return 2
    return None


def _label_ranks(output: TensorInfo) -> Tuple[str, Tuple[int, ...]]:
    """What label column fits ``output``: a description and the array depths allowed."""
    shape = tuple(output.shape)
    if shape in ((), (1,)):
        return "one number (a numeric column)", (0, 1)
    return f"{len(shape)}-deep arrays of shape {list(shape)} (a Vector or array column)", (len(shape),)


def _described(inputs: Sequence[TensorInfo]) -> str:
    return ", ".join(info.describe() for info in inputs)

