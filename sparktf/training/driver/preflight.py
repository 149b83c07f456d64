"""Checks ``TFOptimizer`` runs on the driver before any Spark job.

Settings out of range, a dataset that is not one, a ``model_dir`` that cannot
be created, an optimizer Keras does not know and labels that cannot fit the
model's output under its loss all fail here, at once, with a message naming
the parameter or the leaf, instead of inside the first training job.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any, Optional, Sequence, Tuple

from sparktf.collective.communicator import WIRE_DTYPES
from sparktf.data.block_dataset import BlockDataset
from sparktf.data.specs import LeafSpec
from sparktf.errors import ConfigurationError, DataError
from sparktf.models.keras_internals import compile_config
from sparktf.storage import is_local, local_path, store_for
from sparktf.training.worker.class_weights import ClassWeights, class_weights
from sparktf.triggers import Trigger, check_trigger, uses_score

__all__ = ["check_settings", "check_membership", "check_optimize", "checked_profile_steps", "resolve_optimizer", "recompile",
           "compile_with_loss", "check_labels"]

# Losses whose label shape per record follows from the output shape.
_CLASS_ID_LOSSES = {"sparse_categorical_crossentropy"}
_SAME_SHAPE_LOSSES = {"mse", "mae", "mean_squared_error", "mean_absolute_error"}


def check_settings(
    dataset: Any, num_workers: Optional[int], max_failures: int, collective_timeout: float, model_dir: Optional[str],
    gradient_compression: Optional[str], keep_checkpoints: Optional[int] = None,
) -> None:
    """Refuse a constructor argument of ``TFOptimizer`` that cannot work.

    Raises
    ------
    TypeError
        ``dataset`` is not a ``TFDataset``.
    ValueError
        ``num_workers`` < 1 (None means ``sc.defaultParallelism``),
        ``max_failures`` < 0, ``collective_timeout`` not a positive finite
        number of seconds, ``model_dir`` under a file or not writable,
        ``gradient_compression`` not None, "bf16" or "fp16", or
        ``keep_checkpoints`` not None or an integer >= 1.
    StorageError
        ``model_dir`` is a URI whose scheme nothing can open.
    """
    if not isinstance(dataset, BlockDataset):
        raise TypeError(f"dataset must be a TFDataset (e.g. TFDataset.from_ndarrays(...)), got {dataset!r}")
    if num_workers is not None and not (isinstance(num_workers, numbers.Integral) and num_workers >= 1):
        raise ValueError(
            f"num_workers must be a positive integer (or None for sc.defaultParallelism), got {num_workers!r}"
        )
    if not (isinstance(max_failures, numbers.Integral) and max_failures >= 0):
        raise ValueError(f"max_failures must be an integer >= 0, got {max_failures!r}")
    if not (isinstance(collective_timeout, numbers.Real) and math.isfinite(collective_timeout)
            and collective_timeout > 0):
        raise ValueError(
            f"collective_timeout must be a positive finite number of seconds (e.g. 300), got {collective_timeout!r}"
        )
    if gradient_compression is not None and not (isinstance(gradient_compression, str)
                                                 and gradient_compression in WIRE_DTYPES):
        raise ValueError(
            f"gradient_compression must be None (float32), 'bf16' or 'fp16', got {gradient_compression!r}"
        )
    if keep_checkpoints is not None and not (isinstance(keep_checkpoints, numbers.Integral)
                                             and keep_checkpoints >= 1):
        raise ValueError(f"keep_checkpoints must be an integer >= 1 (or None to keep all), got {keep_checkpoints!r}")
    if model_dir is not None:
        _check_model_dir(model_dir)


def check_membership(num_workers: int, min_workers: Optional[int], replace_wait: float) -> int:
    """``min_workers`` resolved (None: ``num_workers``), after refusing values that cannot work.

    Raises
    ------
    ValueError
        ``min_workers`` not an integer in ``[1, num_workers]``, or
        ``replace_wait`` not a finite number of seconds >= 0.
    """
    if min_workers is not None and not (isinstance(min_workers, numbers.Integral)
                                        and 1 <= min_workers <= num_workers):
        raise ValueError(
            f"min_workers must be an integer from 1 to num_workers={num_workers} (or None for num_workers), "
            f"got {min_workers!r}"
        )
    if not (isinstance(replace_wait, numbers.Real) and math.isfinite(replace_wait) and replace_wait >= 0):
        raise ValueError(f"replace_wait must be a finite number of seconds >= 0 (e.g. 60), got {replace_wait!r}")
    return num_workers if min_workers is None else int(min_workers)


def _check_model_dir(model_dir: str) -> None:
    """A URI needs a store that opens it; a local ``model_dir``'s nearest existing ancestor must be a writable folder."""
    model_dir = os.fspath(model_dir)
    store = store_for(model_dir, "model_dir")
    if not is_local(model_dir):
        if store.exists(model_dir) and not store.isdir(model_dir):
            raise ValueError(f"model_dir {model_dir!r} is a file, not a folder ({store.route}). Choose another model_dir.")
        return
    path = os.path.abspath(local_path(model_dir))
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(
            f"model_dir {model_dir!r} cannot be created: {existing!r} is a file, not a directory. "
            "Choose another model_dir."
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(
            f"model_dir {model_dir!r} cannot be written: no write permission on {existing!r}. "
            "Choose another model_dir."
        )


def resolve_optimizer(optimizer: Any, parameter: str) -> Any:
    """The Keras optimizer ``optimizer`` names (an instance is returned as is).

    Raises
    ------
    ValueError
        Naming ``parameter`` and valid examples, when Keras does not know it.
    """
    import keras

    try:
        return keras.optimizers.get(optimizer)
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"{parameter}={optimizer!r} is not a Keras optimizer: pass a name such as 'sgd', 'adam' "
            f"or 'rmsprop', or an instance such as keras.optimizers.Adam(1e-3) ({error})"
        ) from None


def recompile(keras_model: Any, optimizer: Any, metrics: Optional[list]) -> None:
    """``TFOptimizer.from_keras``: compile with ``optimizer`` and/or ``metrics`` instead of the compiled ones.

    Raises
    ------
    DataError
        The model is not compiled and no ``optimizer`` is given.
    """
    compiled = getattr(keras_model, "compiled", False)
    if not compiled and optimizer is None:
        raise DataError(
            f"the Keras model {keras_model.name!r} is not compiled: call "
            "model.compile(optimizer=..., loss=...) before TFOptimizer.from_keras, "
            "or pass optimizer=..."
        )
    if optimizer is not None or metrics is not None:
        settings = dict(compile_config(keras_model) or {}) if compiled else {}
        if optimizer is not None:
            settings["optimizer"] = resolve_optimizer(optimizer, "optimizer")
        if metrics is not None:
            settings["metrics"] = metrics
        keras_model.compile(**settings)


def compile_with_loss(model: Any, loss_fn: Any, optim_method: Any, metrics: Optional[list]) -> None:
    """``TFOptimizer.from_loss``: compile ``model`` with a loss function and an optimizer (TypeError: not callable)."""
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable(y_true, y_pred), got {loss_fn!r}")
    model.compile(optimizer=resolve_optimizer(optim_method, "optim_method"), loss=loss_fn, metrics=metrics)


def check_labels(model: Any, labels: Sequence[LeafSpec]) -> None:
    """Refuse labels that cannot fit the model's single output under its loss.

    Decided only where it is decidable on the driver: a model with one
    declared output, one label leaf, and a built-in loss by name or object.
    Strings never fit a numeric output; ``sparse_categorical_crossentropy``
    takes one class id per output row; MSE / MAE take the output's shape.

    Raises
    ------
    DataError
        Naming the label leaf, the output shape and the loss, and what to do.
    """
    outputs = getattr(model, "outputs", None)
    if not outputs or len(outputs) != 1 or len(labels) != 1:
        return
    (label,) = labels
    output: Tuple[Optional[int], ...] = tuple(outputs[0].shape[1:])
    output_is_string = str(outputs[0].dtype) == "string"
    if label.is_string and not output_is_string:
        raise DataError(
            f"{label.path} are strings but the model's output is {outputs[0].dtype} of shape "
            f"{list(output)}: give numeric labels (e.g. class ids from a StringIndexer or a lookup table)"
        )
    loss = _loss_name(getattr(model, "loss", None))
    if loss is None or None in output:
        return
    if loss in _CLASS_ID_LOSSES:
        allowed = [output[:-1], output[:-1] + (1,)]
        hint = "class ids (one integer per output row); use categorical_crossentropy for one-hot labels"
    elif loss in _SAME_SHAPE_LOSSES:
        allowed = [output, output + (1,)] + ([output[:-1]] if output[-1:] == (1,) else [])
        hint = "labels of the output's shape"
    else:
        return
    if tuple(label.shape) not in allowed:
        raise DataError(
            f"{label.path} have shape {list(label.shape)} per record, but the model's output "
            f"has shape {list(output)} and its loss {loss} needs {hint} (shape "
            f"{' or '.join(str(list(shape)) for shape in allowed)}): fix the labels or the model's last layer"
        )


def _loss_name(loss: Any) -> Optional[str]:
    """The built-in loss ``loss`` is (a name, a Keras loss object or function), else None."""
    if isinstance(loss, str):
        return loss
    name = getattr(loss, "name", None) or getattr(loss, "__name__", None)
    module = type(loss).__module__ if hasattr(loss, "name") else getattr(loss, "__module__", "")
    return name if str(module).startswith("keras") else None


def check_optimize(model: Any, dataset: Any, num_workers: int, triggers: Tuple[Any, Any, Any],
                   class_weight: Any) -> Tuple[Trigger, Trigger, Trigger, Optional[ClassWeights]]:
    """``optimize``'s end, checkpoint and validation triggers (the latter defaults to the checkpoint trigger)
    and class weights, checked with the model, its training dataset and worker count before any job.

    Raises
    ------
    TypeError
        For a trigger that is not one.
    DataError
        When the dataset has no ``batch_size`` (or one smaller than
        ``num_workers``), ``end_trigger`` uses ``MaxScore`` without validation
        data, or ``class_weight`` does not fit the model or its labels
        (:func:`~sparktf.training.worker.class_weights.class_weights`).
    """
    end_trigger = check_trigger(triggers[0], "end_trigger")
    checkpoint_trigger = check_trigger(triggers[1], "checkpoint_trigger")
    validation_trigger = check_trigger(triggers[2] or checkpoint_trigger, "validation_trigger")
    dataset.local_batch_size(num_workers)
    if dataset.val_dataset is None and uses_score(end_trigger):
        raise DataError(
            f"end_trigger {end_trigger!r} uses MaxScore, which needs validation data: create "
            "the TFDataset with validation data (e.g. val_rdd / val_tensors) or use another trigger"
        )
    weights = class_weights(class_weight, model, dataset.label_spec)
    return end_trigger, checkpoint_trigger, validation_trigger, weights


def checked_profile_steps(profile_steps: Any) -> Optional[Tuple[int, int]]:
    """``optimize``'s ``profile_steps``: None, or ``(start, end)`` iterations with ``1 <= start <= end``.

    Raises
    ------
    ConfigurationError
        For anything else, saying what fits.
    """
    if profile_steps is None:
        return None
    fits = (isinstance(profile_steps, (tuple, list)) and len(profile_steps) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) for n in profile_steps)
            and 1 <= profile_steps[0] <= profile_steps[1])
    if not fits:
        raise ConfigurationError(f"profile_steps must be (start, end) iterations with 1 <= start <= end, e.g. "
                                 f"(10, 20); got {profile_steps!r}")
    return int(profile_steps[0]), int(profile_steps[1])
