"""Turning TensorFlow models into :class:`FrozenGraph` s, and export folders.

Every form TFNet accepts - a SavedModel signature, a frozen ``.pb``, an export
folder, a ``tf.function`` or a Keras model - ends up here as one frozen
``GraphDef`` plus input/output tensor names.

An export folder holds ``frozen_inference_graph.pb`` (a binary ``GraphDef``)
and ``graph_meta.json`` with ``input_names`` and ``output_names``.
"""

from __future__ import annotations

import json
import os
from typing import Any, List, Optional, Sequence, Union

import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from sparktf.errors import DataError, ModelError
from sparktf.models.frozen_graph import FrozenGraph, parse_graph_def
from sparktf.models.saved_model_archive import load_saved_model
from sparktf.storage import join, kept_local_copy, store_for

__all__ = [
    "GRAPH_FILE",
    "META_FILE",
    "freeze_callable",
    "freeze_saved_model",
    "read_graph_def",
    "read_export_folder",
    "write_export_folder",
]

GRAPH_FILE = "frozen_inference_graph.pb"
META_FILE = "graph_meta.json"


def _keras_signature(model) -> List[tf.TensorSpec]:
    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise DataError(
            f"Cannot tell the inputs of Keras model {model.name!r}: it has no symbolic inputs "
            "(a subclassed or unbuilt model). Pass input_signature=[tf.TensorSpec(shape, dtype), ...]."
        )
    return [tf.TensorSpec(t.shape, t.dtype, name=t.name) for t in inputs]


def _is_keras_model(obj: Any) -> bool:
    import keras

    return isinstance(obj, keras.Model)


def _concrete_function(model_or_function: Any, input_signature: Optional[Sequence[tf.TensorSpec]]):
    if isinstance(model_or_function, tf.types.experimental.ConcreteFunction):
        return model_or_function
    if _is_keras_model(model_or_function):
        model = model_or_function
        signature = list(input_signature) if input_signature is not None else _keras_signature(model)
        if len(signature) == 1:
            function = tf.function(lambda x: model(x, training=False), autograph=False)  # as Keras' predict
        else:
            function = tf.function(lambda *xs: model(list(xs), training=False), autograph=False)
        return function.get_concrete_function(*signature)
    if not callable(model_or_function):
        raise DataError(
            f"Expected a Keras model, a tf.function or a Python callable, got {type(model_or_function).__name__}."
        )
    function = model_or_function
    if not isinstance(function, tf.types.experimental.PolymorphicFunction):
        function = tf.function(function)
    if input_signature is not None:
        return function.get_concrete_function(*input_signature)
    if getattr(function, "input_signature", None) is not None:
        return function.get_concrete_function()
    raise DataError(
        "The function has no input signature. Pass input_signature=[tf.TensorSpec(shape, dtype), ...] "
        "(one spec per positional argument; use None for the batch dimension)."
    )


def freeze_callable(model_or_function: Any, input_signature: Optional[Sequence[tf.TensorSpec]] = None) -> FrozenGraph:
    """Freeze a Keras model, a ``tf.function``, a ConcreteFunction or a callable.

    Parameters
    ----------
    model_or_function : keras.Model, tf.function, ConcreteFunction or callable
        What to freeze. A Keras model is called with ``training=False``.
    input_signature : sequence of tf.TensorSpec, optional
        One spec per positional input. Defaults to ``model.inputs`` for a
        Keras model and to the function's own signature for a
        ``tf.function`` that has one.

    Returns
    -------
    FrozenGraph
        Inputs in argument order, outputs in ``tf.nest.flatten`` order.
    """
    frozen = _frozen(_concrete_function(model_or_function, input_signature))
    inputs = [t.name for t in frozen.inputs if t.dtype != tf.resource]
    outputs = [t.name for t in frozen.outputs]
    return FrozenGraph(frozen.graph.as_graph_def(), inputs, outputs)


def _frozen(function: Any) -> Any:
    """``function`` with its variables frozen into constants.

    Raises
    ------
    ModelError
        When it reads lookup tables (an adapted ``StringLookup``,
        ``TextVectorization``, a ``tf.lookup`` table): a frozen graph holds
        constants, not tables; naming the ops.
    """
    tables = sorted({op.name.rsplit("/", 1)[0] for op in function.graph.get_operations()
                     if op.type.startswith("LookupTable")})
    if tables:
        raise ModelError(
            f"cannot freeze a graph that reads lookup tables ({', '.join(tables[:3])}"
            f"{', ...' if len(tables) > 3 else ''}): a frozen graph holds constants, not tables. Run the Keras model "
            "itself on Spark (TFPredictor.from_keras, TFOptimizer.from_keras: its vocabularies travel with it), or "
            "move the lookups into a TFDataset.map function before the graph."
        )
    return convert_variables_to_constants_v2(function)


def _select(kind: str, wanted: Optional[Sequence[str]], available: List[str], signature: str) -> List[str]:
    if wanted is None:
        return available
    if isinstance(wanted, str):
        wanted = [wanted]
    unknown = [name for name in wanted if name not in available]
    if unknown:
        raise DataError(
            f"Signature {signature!r} has no {kind} named {', '.join(map(repr, unknown))}; "
            f"its {kind}s are: {', '.join(available)}. Pass {kind}s from that list."
        )
    return list(wanted)


def freeze_saved_model(
    path: str,
    signature: str = "serving_default",
    inputs: Optional[Sequence[str]] = None,
    outputs: Optional[Sequence[str]] = None,
) -> FrozenGraph:
    """Freeze one signature of a SavedModel.

    Parameters
    ----------
    path : str
        SavedModel directory.
    signature : str
        Signature key.
    inputs, outputs : sequence of str, optional
        Signature input / output keys to use, in the order wanted; default all
        of them in sorted order.

    Returns
    -------
    FrozenGraph
    """
    local = kept_local_copy(path, "SavedModel")  # its assets may be read after this call
    if not tf.saved_model.contains_saved_model(local):
        raise DataError(f"No SavedModel found at {path!r} (expected a saved_model.pb in it). Check the path.")
    loaded = load_saved_model(local)
    signatures = dict(loaded.signatures)
    if signature not in signatures:
        raise DataError(
            f"SavedModel {path!r} has no signature {signature!r}; its signatures are: "
            f"{', '.join(signatures) or '(none)'}. Pass signature= one of them."
        )
    function = signatures[signature]
    # A signature takes and returns dicts; its tensors follow sorted key order.
    input_keys = sorted(function.structured_input_signature[1])
    output_keys = sorted(function.structured_outputs)
    frozen = _frozen(function)
    input_tensors = dict(zip(input_keys, [t.name for t in frozen.inputs if t.dtype != tf.resource]))
    output_tensors = dict(zip(output_keys, [t.name for t in frozen.outputs]))
    chosen_inputs = _select("input", inputs, input_keys, signature)
    chosen_outputs = _select("output", outputs, output_keys, signature)
    return FrozenGraph(
        frozen.graph.as_graph_def(),
        [input_tensors[k] for k in chosen_inputs],
        [output_tensors[k] for k in chosen_outputs],
    )


def read_graph_def(graph_def_or_path: Union[tf.compat.v1.GraphDef, bytes, str, os.PathLike]) -> tf.compat.v1.GraphDef:
    """Return a ``GraphDef`` given one, its bytes, or the path of a binary ``.pb`` file."""
    if not isinstance(graph_def_or_path, (str, os.PathLike)):
        return parse_graph_def(graph_def_or_path)
    path = os.fspath(graph_def_or_path)
    store = store_for(path, "frozen graph path")
    if not store.exists(path) or store.isdir(path):
        raise DataError(f"Frozen graph file {path!r} does not exist. Check the path.")
    return parse_graph_def(store.read_bytes(path), source=repr(path))


def write_export_folder(graph: FrozenGraph, folder: Union[str, os.PathLike]) -> str:
    """Write ``graph`` as ``frozen_inference_graph.pb`` + ``graph_meta.json`` into ``folder``.

    Returns the folder path. The meta file also records each tensor's dtype
    and shape, for people reading it.
    """
    folder = os.fspath(folder)
    store = store_for(folder, "export folder")
    store.makedirs(folder)
    store.write_bytes(join(folder, GRAPH_FILE), graph.graph_bytes)

    def describe(specs):
        return [
            {"dtype": spec.dtype.name, "shape": spec.shape.as_list() if spec.shape.rank is not None else None}
            for spec in specs
        ]

    meta = {
        "input_names": graph.input_names,
        "output_names": graph.output_names,
        "inputs": describe(graph.input_specs),
        "outputs": describe(graph.output_specs),
    }
    store.write_bytes(join(folder, META_FILE), json.dumps(meta, indent=2).encode("utf-8"))
    return folder


def read_export_folder(folder: Union[str, os.PathLike]) -> FrozenGraph:
    """Read a folder written by :func:`write_export_folder` (or Analytics Zoo's ``export_tf``)."""
    folder = os.fspath(folder)
    store = store_for(folder, "export folder")
    names = store.listdir(folder)
    missing = [name for name in (GRAPH_FILE, META_FILE) if name not in names]
    if missing:
        present = names if store.isdir(folder) else "(the folder does not exist)"
        raise DataError(
            f"Export folder {folder!r} lacks {', '.join(missing)}; it contains: {present}. "
            "Create it with sparktf.net.export_tf."
        )
    meta = json.loads(store.read_bytes(join(folder, META_FILE)))
    absent = [key for key in ("input_names", "output_names") if key not in meta]
    if absent:
        raise DataError(
            f"{META_FILE} in {folder!r} lacks {', '.join(absent)}; it has keys {sorted(meta)}. "
            "It needs input_names and output_names lists."
        )
    graph_def = read_graph_def(join(folder, GRAPH_FILE))
    return FrozenGraph(graph_def, meta["input_names"], meta["output_names"])
