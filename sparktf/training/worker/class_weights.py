"""Class weights and the sample weights of a training batch, as Keras' ``fit`` takes them.

``TFOptimizer.optimize(class_weight={class: weight})`` is checked on the
driver (:func:`class_weights`): a single-output model with one label per
record (a class index, shape ``[]`` or ``[1]``, or a one-hot / probability
row, shape ``[classes]``), finite weights >= 0. Each worker turns its batch's
labels into per-record weights as ``fit`` does
(``keras.src.trainers.data_adapters.data_adapter_utils.class_weight_to_sample_weights``:
the argmax of a row of several values, else the value rounded to an integer)
and multiplies them into the batch's sample weights, if it has any
(:func:`batch_parts`). Unlike ``fit``, which weights a class missing from
``class_weight`` with 1.0, a label without a class weight is a ``DataError``
naming it: a class left out of the dict is more often a mistake than a choice.

Class weights weight training only; validation and ``evaluate`` weight their
records by their sample weights alone, as ``fit`` and ``evaluate`` do.

This module runs on executors: it never imports driver-only modules.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import numpy as np

from sparktf.data.sample_weights import check_weights
from sparktf.data.specs import flatten, pack
from sparktf.errors import DataError

__all__ = ["ClassWeights", "class_weights", "batch_parts"]


@dataclass(frozen=True)
class ClassWeights:
    """A checked ``class_weight`` dict, as the workers apply it (picklable, TensorFlow-free).

    Attributes
    ----------
    classes : numpy.ndarray
        The class indices, sorted (int64).
    weights : numpy.ndarray
        Their weights, in the same order (float32).
    """

    classes: np.ndarray
    weights: np.ndarray

    def sample_weights(self, labels: Any, sample_weight: Any = None) -> np.ndarray:
        """One weight per record of a batch: its class's weight, times its sample weight when given.

        Raises
        ------
        DataError
            For a label that has no class weight, naming it.
        """
        classes = _class_indices(np.asarray(labels))
        position = np.minimum(np.searchsorted(self.classes, classes), len(self.classes) - 1)
        missing = self.classes[position] != classes
        if missing.any():
            label = int(classes[int(np.argmax(missing))])
            raise DataError(
                f"class_weight has no weight for label {label} (a batch's record has class {label}); its classes "
                f"are {self.classes.tolist()}. Give every class a weight, e.g. class_weight={{..., {label}: 1.0}}, "
                "or check the labels"
            )
        weights = self.weights[position]
        return weights if sample_weight is None else np.asarray(sample_weight, np.float32) * weights


def _class_indices(labels: np.ndarray) -> np.ndarray:
    """The class of each record, as Keras' ``class_weight_to_sample_weights`` reads the labels."""
    if labels.ndim > 1:
        labels = np.argmax(labels, axis=-1) if labels.shape[-1] != 1 else np.squeeze(labels, axis=-1)
    return np.round(labels).astype(np.int64)


def class_weights(class_weight: Any, model: Any, label_spec: Any) -> Optional[ClassWeights]:
    """``optimize``'s ``class_weight``, checked against the model and the dataset's labels (None: none given).

    Parameters
    ----------
    class_weight : dict, optional
        Class index -> weight, as ``fit`` takes it.
    model : keras.Model
        The model trained: it must have a single output.
    label_spec : tf.TensorSpec structure, optional
        The training dataset's labels (None: it has none).

    Raises
    ------
    DataError
        For a ``class_weight`` that is not a dict of int -> finite number >= 0,
        a model with several outputs, or labels that are missing, nested or
        not one class per record.
    """
    if class_weight is None:
        return None
    if not isinstance(class_weight, dict) or not class_weight:
        raise DataError(f"class_weight must be a non-empty dict class index -> weight, got {class_weight!r}")
    for key, value in class_weight.items():
        if isinstance(key, bool) or not isinstance(key, numbers.Integral) or key < 0:
            raise DataError(f"class_weight key {key!r} is not a class index (an int >= 0); e.g. {{0: 1.0, 1: 5.0}}")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise DataError(f"class_weight[{key!r}] = {value!r}: a class weight is a finite number >= 0")
        check_weights([value], lambda _: f"class_weight[{key!r}]", "class weight")
    outputs = getattr(model, "outputs", None) or []
    if len(outputs) > 1 or (label_spec is not None and len(flatten(label_spec)) > 1):
        raise DataError(
            f"class_weight works only for a model with a single output (as in keras' fit); this one has "
            f"{max(len(outputs), len(flatten(label_spec)))} outputs. Give each record a weight instead "
            "(sample_weight / weight_col / with_sample_weight)"
        )
    _check_labels(label_spec)
    classes = sorted(int(key) for key in class_weight)
    weights = [float(class_weight[key]) for key in classes]
    return ClassWeights(np.array(classes, np.int64), np.array(weights, np.float32))


def _check_labels(label_spec: Any) -> None:
    """Refuse labels that do not give one class per record (none, strings, rank 2 or more per record)."""
    if label_spec is None:
        raise DataError("class_weight needs labels: the training dataset has none")
    spec = flatten(label_spec)[0]
    if spec.dtype.name == "string" or spec.shape.rank > 1:
        raise DataError(
            f"class_weight needs one class per record: a class index (shape [] or [1]) or a one-hot row "
            f"(shape [classes]); the labels are {spec.dtype.name} of shape {spec.shape.as_list()}"
        )


def batch_parts(element_structure: tuple, arrays: list,
                class_weight: Optional[ClassWeights] = None) -> Tuple[Any, Any, Any]:
    """``(features, labels, sample_weight)`` of one batch (its leaves ``arrays``).

    ``labels`` is None for a dataset without labels, ``sample_weight`` None
    without sample or class weights; class weights are folded into the
    sample weights.
    """
    element = pack(element_structure, arrays)
    labels = element[1] if len(element) > 1 else None
    sample_weight = element[2] if len(element) > 2 else None
    if class_weight is not None:
        sample_weight = class_weight.sample_weights(labels, sample_weight)
    return element[0], labels, sample_weight
