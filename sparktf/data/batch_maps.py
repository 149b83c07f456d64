"""Functions applied to every batch on the workers, between a dataset's records and the model.

Two kinds run here, in this order, as ``tf.data.Dataset.map`` and Keras Hub's
``Task.fit`` would run them on one machine:

* the dataset's own maps (:meth:`sparktf.dataset.TFDataset.map`), each called
  on a batch as ``fn(features)``, ``fn(features, labels)`` or
  ``fn(features, labels, sample_weight)``;
* the model's preprocessing, for a model with a ``preprocessor`` and a
  ``preprocess_samples`` method (a Keras Hub ``Task``): the executors call the
  ``preprocess_samples`` of the model they loaded, so the tokenizer and its
  vocabulary are those of the model that travelled.

A function returns ``x``, ``(x,)``, ``(x, y)`` or ``(x, y, sample_weight)``
(Keras' ``pack_x_y_sample_weight``). The functions run in one ``tf.function``
traced once per process for a batch of any size; the driver traces them on
specs only (:meth:`BatchMaps.output_structure`) to learn what the model will
get, so a mismatch with the model's inputs is found before any job.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any, Callable, List, Tuple

import cloudpickle
import numpy as np

from sparktf.data import specs
from sparktf.errors import DataError

__all__ = ["BatchMaps", "MappedElements", "preprocesses", "NO_MAPS"]


def preprocesses(model: Any) -> bool:
    """Whether ``model`` preprocesses its input samples itself (a Keras Hub task with a preprocessor)."""
    return getattr(model, "preprocessor", None) is not None and callable(getattr(model, "preprocess_samples", None))


@dataclass(frozen=True)
class BatchMaps:
    """The functions a batch goes through on a worker before the model (picklable; travels with the job).

    Attributes
    ----------
    functions : tuple of callable
        The dataset's maps, in the order they were added.
    model_preprocessing : bool
        Then call the loaded model's ``preprocess_samples``.
    """

    functions: Tuple[Callable[..., Any], ...] = ()
    model_preprocessing: bool = False

    @property
    def active(self) -> bool:
        """Whether any function runs."""
        return bool(self.functions) or self.model_preprocessing

    def then(self, function: Callable[..., Any]) -> "BatchMaps":
        """These maps followed by ``function``."""
        if not callable(function):
            raise DataError(f"TFDataset.map takes a function of a batch, got {type(function).__name__}")
        return replace(self, functions=self.functions + (function,))

    def for_model(self, model: Any) -> "BatchMaps":
        """These maps, then ``model``'s own preprocessing when it has one."""
        return replace(self, model_preprocessing=preprocesses(model))

    def key(self, structure: tuple) -> str:
        """A digest of the functions and the structure they map (names a worker's traced function)."""
        content = cloudpickle.dumps((self.functions, self.model_preprocessing, repr(structure)))
        return hashlib.sha256(content).hexdigest()[:24]

    def output_structure(self, structure: tuple, model: Any = None) -> tuple:
        """The element structure the model gets, from the dataset's ``structure``, traced on specs (driver).

        Raises
        ------
        DataError
            When a function fails on the specs or returns something that is
            not an element, naming the function.
        """
        if not self.active:
            return structure
        _refuse_sparse(structure)
        function = self._traced(structure, model)
        outputs = function.structured_outputs
        return tuple(specs_of(part) for part in outputs)

    def mapper(self, structure: tuple, model: Any = None) -> Callable[[List[np.ndarray]], List[np.ndarray]]:
        """A worker's ``leaves -> leaves``: a batch of ``structure`` to a batch of :meth:`output_structure`."""
        if not self.active:
            return lambda leaves: leaves
        function = self._traced(structure, model)

        def mapped(leaves: List[np.ndarray]) -> List[np.ndarray]:
            import tensorflow as tf

            try:
                outputs = function(*specs.pack(structure, [_tensor_ready(leaf) for leaf in leaves]))
            except tf.errors.OpError as exc:  # a record the maps reject
                raise DataError(f"the batch maps rejected a batch: {exc.message.strip().splitlines()[0]}") from None
            return [_numpy(value) for value in tf.nest.flatten(outputs)]

        return mapped

    def _traced(self, structure: tuple, model: Any) -> Any:
        import tensorflow as tf

        functions = list(self.functions)
        if self.model_preprocessing:
            functions.append(_model_preprocessing(model))

        def run(*element: Any) -> tuple:
            parts = tuple(element)
            for function in functions:
                parts = _element(_called(function, parts), function)
            weights = parts[2:] and (tf.cast(parts[2], tf.float32),)
            return parts[:2] + weights

        signature = [tf.nest.map_structure(_batch_spec, part) for part in structure]
        try:
            return tf.function(run).get_concrete_function(*signature)
        except DataError:
            raise
        except Exception as exc:  # autograph wraps what a function raised: its message keeps the cause
            names = ", ".join(_name(function) for function in functions)
            raise DataError(f"the batch maps ({names}) cannot run on batches of {structure}: "
                            f"{str(exc).strip().splitlines()[-1].strip()}") from None


@dataclass(frozen=True)
class MappedElements:
    """A dataset's batches as one model gets them: the stored structure, the maps, the structure after them.

    Attributes
    ----------
    maps : BatchMaps
        The dataset's maps, and the model's preprocessing when it has one.
    stored : tuple
        The element structure of the Blocks.
    element : tuple
        The element structure after the maps (traced on the driver).
    key : str
        Names the traced function in a worker's cache.
    """

    maps: BatchMaps
    stored: tuple
    element: tuple
    key: str = ""

    @classmethod
    def of(cls, dataset: Any, model: Any) -> "MappedElements":
        """How ``model`` gets ``dataset``'s batches.

        Raises
        ------
        DataError
            When a map fails on the dataset's specs.
        """
        return cls.of_structure(dataset.batch_maps, dataset.stored_structure, model)

    @classmethod
    def of_structure(cls, maps: BatchMaps, stored: tuple, model: Any) -> "MappedElements":
        """How ``model`` gets batches of ``stored`` through ``maps`` (see :meth:`of`)."""
        maps = maps.for_model(model)
        if not maps.active:
            return cls(maps, stored, stored)
        return cls(maps, stored, maps.output_structure(stored, model), maps.key(stored))

    def mapper(self, model: Any) -> Callable[[List[np.ndarray]], List[np.ndarray]]:
        """A worker's ``leaves -> leaves`` for the model it loaded (identity without maps)."""
        return self.maps.mapper(self.stored, model)


def _called(function: Callable[..., Any], parts: tuple) -> Any:
    try:
        return function(*parts)
    except Exception as exc:
        raise DataError(
            f"the batch map {_name(function)} failed on a batch of {_described(parts)}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def _element(output: Any, function: Callable[..., Any]) -> tuple:
    """``(x,)``, ``(x, y)`` or ``(x, y, sample_weight)`` of what a map returned (None parts dropped)."""
    parts = output if isinstance(output, tuple) else (output,)
    if not 1 <= len(parts) <= 3 or parts[0] is None:
        raise DataError(
            f"the batch map {_name(function)} returned {len(parts)} part(s); return x, (x, y) or "
            "(x, y, sample_weight), as keras.utils.pack_x_y_sample_weight does"
        )
    if len(parts) == 3 and parts[2] is None:
        parts = parts[:2]
    if len(parts) == 2 and parts[1] is None:
        parts = parts[:1]
    if any(part is None for part in parts):
        raise DataError(f"the batch map {_name(function)} returned sample weights without labels")
    return parts


def _model_preprocessing(model: Any) -> Callable[..., Any]:
    def preprocess(x: Any, y: Any = None, sample_weight: Any = None) -> Any:
        return model.preprocess_samples(x, y, sample_weight)

    preprocess.__qualname__ = f"{type(model).__name__}.preprocess_samples"
    return preprocess


def specs_of(part: Any) -> Any:
    """One element part's per-record specs (the batch dimension dropped)."""
    import tensorflow as tf

    def spec(tensor: Any) -> Any:
        return tf.TensorSpec(tensor.shape[1:], tensor.dtype)

    return tf.nest.map_structure(spec, part)


def _batch_spec(spec: Any) -> Any:
    import tensorflow as tf

    return tf.TensorSpec([None, *spec.shape.as_list()], spec.dtype)


def _refuse_sparse(structure: tuple) -> None:
    sparse = [leaf.path for leaf in specs.leaf_specs(structure, "element") if leaf.sparse]
    if sparse:
        raise DataError(f"batch maps take dense batches; {sparse} are sparse. Densify them in the dataset first")


def _tensor_ready(leaf: np.ndarray) -> Any:
    """Text leaves (object arrays) as ``tf.string`` tensors; others as they are."""
    import tensorflow as tf

    return tf.constant(leaf, tf.string) if leaf.dtype == np.dtype(object) else leaf


def _numpy(value: Any) -> np.ndarray:
    array = value.numpy()
    return array.astype(object) if array.dtype.kind == "S" else array


def _name(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", None) or repr(function)


def _described(parts: tuple) -> str:
    names = ("features", "labels", "sample_weight")
    return ", ".join(f"{name} {_shapes(part)}" for name, part in zip(names, parts))


def _shapes(part: Any) -> str:
    import tensorflow as tf

    return str(tf.nest.map_structure(lambda t: f"{t.dtype.name}{list(t.shape)}", part))


NO_MAPS = BatchMaps()
