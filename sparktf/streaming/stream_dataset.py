"""A streaming ``TFDataset``: its specs from the schema, the lengths the schema does not tell from the model.

``TFDataset.from_dataframe`` of a streaming DataFrame makes one with
:func:`stream_dataset` (no action: a stream is read only by its query);
``TFOptimizer`` and ``TFPredictor`` complete it with :func:`resolved_for`
(through the one resolver of a stream's lengths,
:func:`~sparktf.inference.columns.stream_leaves`), so every micro-batch is read
in one record format.
"""

from __future__ import annotations

from typing import Any, Optional

from pyspark.sql import DataFrame

from sparktf.data import specs
from sparktf.data.sources import one_or_list
from sparktf.data.stream_frames import StreamFrames, stream_layouts
from sparktf.errors import DataError
from sparktf.inference.columns import stream_leaves
from sparktf.inference.feeds import keras_inputs

__all__ = ["stream_dataset", "resolved_for"]


def stream_dataset(cls: Any, session: Any, df: DataFrame, names: tuple, weight_spec: Any, validation_df: Any,
                   layouts: Optional[list] = None, **options: Any) -> Any:
    """The streaming dataset (of class ``cls``) of ``df``'s columns ``names`` ``(feature names, label count, all
    columns)``, of ``layouts`` ``(dtype, shape)`` (default: from the schema; None where it does not tell).

    Raises
    ------
    DataError
        For ``validation_df`` (a stream tests each micro-batch instead), or a missing or unsupported column.
    """
    import tensorflow as tf

    if validation_df is not None:
        raise DataError("validation_df does not go with a streaming DataFrame: optimize_stream evaluates each "
                        "micro-batch before it trains on it (test-then-train). Drop validation_df")
    feature_names, label_count, columns = names
    layouts = stream_layouts(df, columns) if layouts is None else layouts
    column_specs = [tf.TensorSpec(shape, tf.as_dtype(dtype)) for dtype, shape in layouts]
    feature_spec = one_or_list(column_specs[: len(feature_names)])
    label_spec = one_or_list(column_specs[len(feature_names):][:label_count]) if label_count else None
    return cls(StreamFrames(session, df, columns), feature_spec, label_spec, weight_spec=weight_spec, **options)


def resolved_for(dataset: Any, model: Any) -> Any:
    """``dataset`` (streaming) with the lengths its schema did not tell taken from ``model``'s inputs (features)
    and output (labels); ``dataset`` itself when it knows them all (see
    :func:`~sparktf.inference.columns.stream_leaves`).

    Raises
    ------
    DataError
        When the model does not tell a length either, naming the columns.
    """
    leaves = specs.leaf_specs(dataset.stored_structure, "records")
    if not any(None in leaf.shape for leaf in leaves):
        return dataset
    frame, columns = dataset.blocks.frame, dataset.blocks.columns
    count = len(specs.leaf_specs(dataset.stored_structure[0], "features"))
    declared = keras_inputs(model)
    outputs = [tuple(output.shape[1:]) for output in getattr(model, "outputs", None) or []]
    resolved_leaves = stream_leaves(frame, columns, None if declared is None else declared[0],
                                    [None] * count + outputs, count)
    weighted = len(dataset.stored_structure) > 2  # records end with a sample weight
    layouts = [("string" if leaf.is_string else leaf.dtype.name, leaf.shape) for leaf in resolved_leaves]
    resolved = stream_dataset(type(dataset), dataset.blocks.kind, frame,
                              (columns[:count], len(columns) - count - weighted, columns),
                              dataset.stored_structure[2] if weighted else None, None, layouts,
                              batch_size=dataset.batch_size, batch_per_thread=dataset.batch_per_thread,
                              shuffle=dataset.shuffle, seed=dataset.seed)
    for function in dataset.batch_maps.functions:  # the maps again, on the resolved specs
        resolved = resolved.mapped(function)
    return resolved
