"""Shipping Keras models to Spark executors as bytes.

A Keras 3 model does not survive a plain ``cloudpickle`` trip to an executor
when it uses classes or functions defined in the user's script or notebook:
Keras pickles a model by its config, and the executor cannot locate
``__main__.MyLayer``. :class:`ModelPayload` captures everything needed to
rebuild the model elsewhere:

* the architecture, as the Keras config (``keras.saving.serialize_keras_object``),
  including the build and compile configs;
* the custom classes and functions the model refers to (custom layers, Lambda
  functions, custom losses and metrics, initializers, ...), pickled *by value*
  when they come from the user's own code (``__main__`` or a module that is not
  an installed package) so executors need not have them;
* every model variable (trainable and non-trainable) as a NumPy array;
* the optimizer variables (iteration counter, slots), when built;
* what Keras saves besides config and weights (:mod:`sparktf.models.layer_state`):
  assets such as an adapted lookup's or a tokenizer's vocabulary, and the
  own variables of weightless layers (a ``tf_idf`` lookup's IDF weights).

``payload.to_bytes()`` is the wire format, sent once per job;
:func:`sparktf.models.cache.load_cached` rebuilds a model at most once per
Python worker process for the same content.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import sys
import types
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, Mapping, Optional, Sequence, Tuple, Union

import cloudpickle
import numpy as np

from sparktf.errors import DataError, InternalError
from sparktf.models import layer_state, rebuild
from sparktf.models.keras_internals import compile_config, nested_layers, serialized_function
from sparktf.models.layer_state import LayerState
from sparktf.spark.user_code import pickle_by_value

__all__ = ["ModelPayload", "payload_key"]

_MAGIC = b"SPARKTF-MODEL-1\n"
_DIGEST_SIZE = hashlib.sha256().digest_size
_FRAMEWORK_PACKAGES = frozenset({"builtins", "keras", "tensorflow", "tf_keras", "numpy", "jax", "torch"})
_LAMBDA_ATTRIBUTES = ("function", "_output_shape", "mask")
_LAMBDA_PREFIX = "sparktf_lambda_"


@dataclass(frozen=True)
class ModelPayload:
    """Everything needed to rebuild a Keras model in another process.

    Attributes
    ----------
    config : str
        JSON of the model's Keras config (with build and compile configs).
        Python lambdas of ``Lambda`` layers are replaced by references to
        ``custom_objects`` entries, so they travel with their globals.
    custom_objects : bytes
        cloudpickle of ``{name: class or function}``: the user-defined objects
        the config refers to.
    weights : tuple of numpy.ndarray
        Values of ``model.weights`` (trainable and non-trainable), in order.
    optimizer_variables : tuple of numpy.ndarray
        Values of ``model.optimizer.variables`` (empty when the optimizer was
        not built or not included).
    key : str
        Hex SHA-256 of the serialized content; equal content, equal key.
    """

    config: str
    custom_objects: bytes
    weights: Tuple[np.ndarray, ...]
    optimizer_variables: Tuple[np.ndarray, ...]
    layer_states: Tuple[LayerState, ...]
    trainable: Tuple[bool, ...]
    key: str

    @classmethod
    def from_model(cls, model: Any, include_optimizer: bool = True, include_weights: bool = True) -> "ModelPayload":
        """Capture ``model`` (a ``keras.Model``) for shipping.

        Parameters
        ----------
        model : keras.Model
            A functional, Sequential or subclassed model. A subclassed model
            must be serializable by Keras (``get_config`` returning its
            constructor arguments, which Keras does automatically when they
            are plain values) and built.
        include_optimizer : bool
            Also capture the optimizer variables (iteration counter, slots),
            so that ``build()`` resumes training exactly where it stopped.
            The compile config (loss, metrics, optimizer hyper-parameters) is
            always kept.
        include_weights : bool
            Capture the weights (and, with ``include_optimizer``, the optimizer
            variables). Without them the payload is the architecture and
            compile config only: small, its ``key`` the same for every state
            of the model, and ``build()`` returns freshly initialised
            variables for the caller to assign (what training does with the
            state it streams separately).

        Returns
        -------
        ModelPayload

        Raises
        ------
        DataError
            When Keras cannot serialize the model, or a subclassed model
            cannot be rebuilt from its config.
        ModelError
            When a layer cannot save its assets (e.g. a tokenizer without a
            vocabulary), naming the layer.
        """
        import keras

        try:
            config = keras.saving.serialize_keras_object(model)
            custom_objects = _user_objects(model)
            if not isinstance(model, rebuild.config_native_models()):
                with keras.saving.custom_object_scope(custom_objects):
                    type(model).from_config(model.get_config())  # fail here, not on every executor
        except (NotImplementedError, TypeError) as exc:
            raise DataError(
                f"Keras cannot serialize and rebuild the model {model.name!r} of class "
                f"{type(model).__name__}: {exc}. Accept **kwargs in __init__ and pass them to "
                "super().__init__(), implement get_config() (and from_config() when the "
                "constructor takes non-plain arguments), or build the model with the "
                "functional API."
            ) from exc
        custom_objects.update(_replace_lambdas(model, config))
        rebuild.keep_custom_compile_arguments(model, config)
        weights = tuple(v.numpy() for v in model.weights) if include_weights else ()
        optimizer = getattr(model, "optimizer", None)
        optimizer_variables: Tuple[np.ndarray, ...] = ()
        if include_weights and include_optimizer and optimizer is not None and optimizer.built:
            optimizer_variables = tuple(v.numpy() for v in optimizer.variables)
        return cls._with_key(
            config=json.dumps(config, sort_keys=True),
            custom_objects=pickle_by_value(custom_objects),
            weights=weights,
            optimizer_variables=optimizer_variables,
            layer_states=layer_state.capture(model),
            trainable=tuple(bool(v.trainable) for v in model.weights),
        )

    @classmethod
    def _with_key(cls, **fields: Any) -> "ModelPayload":
        body = _encode_body(fields)
        return cls(key=hashlib.sha256(body).hexdigest(), **fields)

    def to_bytes(self) -> bytes:
        """Serialize to the wire format: a magic line, the digest, the body."""
        fields = {name: getattr(self, name) for name in _BODY_FIELDS}
        body = _encode_body(fields)
        return _MAGIC + bytes.fromhex(self.key) + body

    @classmethod
    def from_bytes(cls, data: bytes) -> "ModelPayload":
        """Parse bytes written by :meth:`to_bytes`, checking their digest.

        Raises
        ------
        DataError
            When ``data`` is not a sparktf model payload or is corrupted.
        """
        key = payload_key(data)
        body = memoryview(data)[len(_MAGIC) + _DIGEST_SIZE:]
        if hashlib.sha256(body).hexdigest() != key:
            raise DataError(
                "The model payload is corrupted (its SHA-256 digest does not "
                "match its content). Ship the model again with "
                "ModelPayload.from_model(model).to_bytes()."
            )
        fields = pickle.loads(body)
        return cls(key=key, **fields)

    def build(self, table_rows: Optional[Mapping[str, int]] = None) -> Any:
        """Rebuild the model, compiled when it was, with all its state.

        Parameters
        ----------
        table_rows : mapping of str to int, optional
            ``Embedding`` layers (by name) to build with that many rows instead
            (a sharded table's working table); only for a payload without
            weights.

        Returns
        -------
        keras.Model
            A new model whose weights and optimizer variables equal the
            captured ones exactly (freshly initialised when the payload has
            none).

        Raises
        ------
        DataError
            When Keras cannot rebuild the model from the payload, or the
            rebuilt model's variables do not match the captured ones.
        ModelError
            When a layer cannot load its saved state (vocabulary, lookup
            table), naming the layer, or the model's classes come from a
            package this process cannot import, naming the extra to install.
        """
        import keras

        rebuild.register_sparktf_classes()

        config = json.loads(self.config)
        rebuild.require_packages(config)
        if table_rows:
            if self.weights:
                raise InternalError("a payload with weights cannot be built with resized tables")
            rebuild.resize_tables(config, table_rows)
        custom_objects = cloudpickle.loads(self.custom_objects)
        try:
            with keras.saving.custom_object_scope(custom_objects), rebuild.global_policy(config):
                with warnings.catch_warnings():  # a custom compile(): compiled below
                    warnings.filterwarnings("ignore", message=".*compile\\(\\)` was not called")
                    model = keras.saving.deserialize_keras_object(
                        config, custom_objects=custom_objects, safe_mode=False
                    )
        except (TypeError, ValueError) as exc:
            raise DataError(
                f"cannot rebuild the model from its payload: {exc}. The payload carries the "
                f"custom objects {sorted(custom_objects)}; an object missing from that list "
                "must be importable on the executors (e.g. decorated with "
                "keras.saving.register_keras_serializable in an installed module)."
            ) from exc
        changed = layer_state.restore(model, self.layer_states)
        changed = rebuild.freeze_as_captured(model, self.trainable) or changed
        rebuild.compile_as_captured(model, config.get("compile_config"), changed)
        if self.weights:
            _assign(model.weights, self.weights, "model weight")
            layer_state.weights_assigned(model)
        if self.optimizer_variables:
            optimizer = model.optimizer
            if not optimizer.built:
                optimizer.build(model.trainable_variables)
            _assign(optimizer.variables, self.optimizer_variables, "optimizer variable")
        return model


_BODY_FIELDS = ("config", "custom_objects", "weights", "optimizer_variables", "layer_states", "trainable")


def _encode_body(fields: Dict[str, Any]) -> bytes:
    return pickle.dumps({name: fields[name] for name in _BODY_FIELDS}, protocol=5)


def payload_key(data: Union[bytes, memoryview]) -> str:
    """Return the content hash stored in the header of payload bytes.

    Cheap: reads the header only, without parsing the body.
    """
    header = bytes(data[: len(_MAGIC) + _DIGEST_SIZE])
    if not header.startswith(_MAGIC) or len(header) < len(_MAGIC) + _DIGEST_SIZE:
        raise DataError(
            "These bytes are not a sparktf model payload (bad header). Pass "
            "ModelPayload.from_model(model).to_bytes() or a broadcast of it."
        )
    return header[len(_MAGIC):].hex()


# --------------------------------------------------------------------------
# Finding the user-defined objects a model refers to


def _user_objects(model: Any) -> Dict[str, Any]:
    """Map Keras lookup name -> user-defined class or function used by ``model``."""
    import keras

    found: Dict[str, Any] = {}
    for obj in _referenced_objects(model):
        target = _serializable_target(obj)
        if target is not None and _is_user_defined(target):
            found.setdefault(keras.saving.get_registered_name(target), target)
    return found


def _serializable_target(obj: Any) -> Any:
    """The class or function Keras would look up by name to rebuild ``obj``.

    Free functions (not methods, not lambdas) and the classes of objects with
    a ``get_config`` (layers, losses, metrics, initializers, ...); else None.
    """
    if isinstance(obj, types.FunctionType):
        owner = obj.__qualname__.rpartition(".")[0]
        is_free = not owner or owner.endswith("<locals>")
        return obj if is_free and obj.__name__ != "<lambda>" else None
    cls = obj if isinstance(obj, type) else type(obj)
    return cls if hasattr(cls, "get_config") else None


def _referenced_objects(model: Any) -> Iterator[Any]:
    """Layers, their attribute values, the compile arguments and the optimizer."""
    for layer in nested_layers(model, include_self=True):
        yield layer
        yield from _nested_values(vars(layer).values())
    compiled = compile_config(model)
    if compiled is not None:
        yield from _nested_values(compiled.values())
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        yield optimizer
        yield from _nested_values(vars(optimizer).values())


def _nested_values(values: Iterable[Any], depth: int = 3) -> Iterator[Any]:
    for value in values:
        yield value
        if depth and isinstance(value, (list, tuple)):
            yield from _nested_values(value, depth - 1)
        elif depth and isinstance(value, dict):
            yield from _nested_values(value.values(), depth - 1)


def _is_user_defined(obj: Any) -> bool:
    package = (getattr(obj, "__module__", None) or "builtins").split(".", 1)[0]
    return package not in _FRAMEWORK_PACKAGES and package not in sys.stdlib_module_names


def _replace_lambdas(model: Any, config: Any) -> Dict[str, Any]:
    """Swap Python lambdas in ``config`` for named references; return the names.

    Keras stores a lambda as marshalled bytecode, which loses its globals
    (``tf``, user helpers); a named reference to the cloudpickled function
    keeps them.
    """
    import keras

    by_config: Dict[str, Tuple[str, Any]] = {}
    for layer in nested_layers(model, include_self=True):
        if not isinstance(layer, keras.layers.Lambda):
            continue
        for attribute in _LAMBDA_ATTRIBUTES:
            fn = getattr(layer, attribute, None)
            if isinstance(fn, types.LambdaType) and fn.__name__ == "<lambda>":
                node = serialized_function(layer, fn)
                name = f"{_LAMBDA_PREFIX}{len(by_config)}"
                by_config.setdefault(_canonical(node), (name, fn))
    if by_config:
        _substitute_lambda_nodes(config, by_config)
    return dict(by_config.values())


def _substitute_lambda_nodes(node: Any, by_config: Dict[str, Tuple[str, Any]]) -> None:
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, child in list(items):
        if isinstance(child, dict) and child.get("class_name") == "__lambda__":
            name, _ = by_config[_canonical(child)]
            node[key] = {"module": "builtins", "class_name": "function", "config": name, "registered_name": "function"}
        elif isinstance(child, (dict, list)):
            _substitute_lambda_nodes(child, by_config)


def _canonical(node: Any) -> str:
    return json.dumps(node, sort_keys=True, default=repr)


# --------------------------------------------------------------------------
# Restoring variables


def _assign(variables: Sequence[Any], values: Sequence[np.ndarray], what: str) -> None:
    if len(variables) != len(values):
        raise DataError(
            f"The rebuilt model has {len(variables)} {what}s but the payload "
            f"holds {len(values)}. The model's architecture changed between "
            "capture and rebuild (e.g. a layer that creates variables lazily); "
            "build the model before ModelPayload.from_model()."
        )
    for variable, value in zip(variables, values):
        if tuple(variable.shape) != value.shape:
            raise DataError(
                f"{what} {variable.path!r} has shape {tuple(variable.shape)} in "
                f"the rebuilt model but {value.shape} in the payload. Rebuild "
                "the payload from the current model."
            )
        variable.assign(value)
