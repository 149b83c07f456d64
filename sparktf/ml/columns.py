"""Checks of DataFrame columns against a model, from the schema alone (no Spark job).

The label column against the model's output and loss (the class count
``StringIndexer`` records); the feature columns' checks are
:mod:`sparktf.inference.columns`'. Each error is a ``DataError`` naming the
column, the Param it came from and what was expected.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from pyspark.sql import DataFrame

from sparktf.data.arrow_io import column_kind
from sparktf.errors import DataError
from sparktf.inference.columns import check_columns_exist
from sparktf.inference.feeds import TensorInfo

__all__ = ["check_label_column", "model_output"]


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
