"""What a model's output means, and the prediction / probability columns made from it.

A model compiled with a (sparse / binary) cross-entropy is a classifier: its
output is class probabilities (or logits, with ``from_logits=True``), its
prediction the 0-based class index as a double and its probabilities an ml
``Vector``, the columns Spark's classification evaluators read. Every other
model is a regressor whose prediction is its output (a double for one
value). The columns are plain Spark SQL expressions over the raw output
column, so ``transform`` stays a lazy DataFrame transformation.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sparktf.errors import DataError
from sparktf.inference.feeds import TensorInfo

__all__ = ["CLASSIFICATION", "REGRESSION", "loss_name", "task_of", "with_prediction_columns"]

CLASSIFICATION, REGRESSION = "classification", "regression"

#: Keras losses whose model outputs class probabilities (or logits), by name and by class name.
_CLASSIFICATION_LOSSES = {
    "sparse_categorical_crossentropy": "SparseCategoricalCrossentropy",
    "categorical_crossentropy": "CategoricalCrossentropy",
    "binary_crossentropy": "BinaryCrossentropy",
    "categorical_focal_crossentropy": "CategoricalFocalCrossentropy",
    "binary_focal_crossentropy": "BinaryFocalCrossentropy",
}
_BY_CLASS_NAME = {class_name: name for name, class_name in _CLASSIFICATION_LOSSES.items()}


def loss_name(loss: Any) -> Optional[str]:
    """The built-in Keras loss ``loss`` is (a name, a loss object or a loss function), else None."""
    if isinstance(loss, str):
        return loss
    by_class = _BY_CLASS_NAME.get(type(loss).__name__)
    return by_class or getattr(loss, "name", None) or getattr(loss, "__name__", None)


def task_of(model: Any) -> Tuple[str, bool]:
    """``(task, from_logits)`` of a compiled Keras model, read from its loss.

    A model without a single built-in cross-entropy loss (not compiled,
    several outputs, a custom loss) is a regressor.
    """
    loss = getattr(model, "loss", None)
    if loss_name(loss) not in _CLASSIFICATION_LOSSES:
        return REGRESSION, False
    config = loss.get_config() if hasattr(loss, "get_config") else {}
    return CLASSIFICATION, bool(config.get("from_logits", False))


def num_outputs(output: Optional[TensorInfo]) -> Optional[int]:
    """How many values the model returns per record (None: several outputs or a dimension of any size)."""
    if output is None or None in output.shape:
        return None
    size = 1
    for dimension in output.shape:
        size *= dimension
    return size


def with_prediction_columns(
    scored: DataFrame,
    raw_col: str,
    kept: List[str],
    output: Optional[TensorInfo],
    task: str,
    from_logits: bool,
    prediction_col: str,
    probability_col: str,
) -> DataFrame:
    """``scored``'s ``kept`` columns plus the prediction (and, for a classifier, probability) column.

    Parameters
    ----------
    scored : pyspark.sql.DataFrame
        With the model's raw output in ``raw_col``.
    output : TensorInfo, optional
        The model's single output (None for several).
    task : str
        ``"classification"`` or ``"regression"``.
    from_logits : bool
        A classifier's output is logits.

    Raises
    ------
    DataError
        For a classifier whose output is not one vector of class scores.
    """
    raw = F.col(raw_col)
    if task == CLASSIFICATION:
        probabilities = _class_probabilities(raw, output, from_logits)
        # the SQL function itself: Spark 3.5's F.array_position takes only a literal to look for
        best = F.call_function("array_position", probabilities, F.array_max(probabilities)) - 1
        from pyspark.ml.functions import array_to_vector

        return scored.select(
            *kept, best.cast("double").alias(prediction_col), array_to_vector(probabilities).alias(probability_col)
        )
    if num_outputs(output) == 1:
        raw = raw[0] if output.shape else raw
        return scored.select(*kept, raw.cast("double").alias(prediction_col))
    return scored.select(*kept, raw.alias(prediction_col))


def _class_probabilities(raw: Column, output: Optional[TensorInfo], from_logits: bool) -> Column:
    """An array column of each class's probability: softmax over several scores, [1 - p, p] for one."""
    size = num_outputs(output)
    if size is None or len(output.shape) > 1:
        described = output.describe() if output is not None else "several outputs"
        raise DataError(
            f"a classifier needs one output of shape [number of classes] (or [1] for a sigmoid), but the "
            f"model returns {described}; use task='regression' for the raw output"
        )
    if size == 1:
        positive = raw[0] if output.shape else raw
        positive = 1.0 / (1.0 + F.exp(-positive)) if from_logits else positive.cast("double")
        return F.array(1.0 - positive, positive)
    if not from_logits:
        return raw
    largest = F.array_max(raw)
    exponentials = F.transform(raw, lambda score: F.exp(score - largest))
    total = F.aggregate(exponentials, F.lit(0.0), lambda running, value: running + value)
    return F.transform(exponentials, lambda value: value / total)
