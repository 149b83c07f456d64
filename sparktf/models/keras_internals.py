"""The parts of Keras that are not public API and that sparktf reads, in one place.

Keras 3 has no public way to list a model's nested layers, to tell a
functional model, the variables an optimizer was built for, the per-variable
state it keeps, or how a functional graph's layers are called. The model
payload needs the first two (every layer's state and code travels; a graph
that cannot be rebuilt is refused), table handling the rest: which
``Embedding`` layers a model has, which optimizer variables are a table's
state (and of which kind: ``"momentum"``, ``"velocity"``, ...), and whether a
table's ids are a model input or a column of one (``ids[:, i]``, Keras'
``GetItem``). The compile arguments a model keeps, a ``Lambda``'s
function as Keras serializes it, the compiled loss and metrics objects,
Adagrad's accumulator of a variable, a Keras Hub ``CausalLM``'s cache
builder and the sublayers of its GPT-2 and Llama decoder layers (for
decoding in place) are read here too. When Keras changes one of these, this module is
what changes.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

__all__ = ["adagrad_accumulator", "cache_builder", "call_nodes", "column_of", "compile_config", "compiled_losses",
           "decoder_parts", "is_functional", "nested_layers", "optimizer_tracks", "row_state_variables",
           "serialized_function", "tracked_variables"]


def nested_layers(model: Any, include_self: bool = False) -> List[Any]:
    """Every layer of ``model``, nested models' included (``Model._flatten_layers``)."""
    return list(model._flatten_layers(include_self=include_self))


def is_functional(model: Any) -> bool:
    """Whether ``model`` is a functional model (``Sequential`` included), rebuilt from its graph's config."""
    from keras.src.models.functional import Functional

    return isinstance(model, Functional)


def tracked_variables(optimizer: Any) -> List[Any]:
    """The variables ``optimizer`` was built for (``_trainable_variables``)."""
    return list(optimizer._trainable_variables)


def optimizer_tracks(optimizer: Any, variable: Any) -> bool:
    """Whether ``optimizer`` was built for ``variable`` (and so holds its state)."""
    return optimizer.built and optimizer._var_key(variable) in optimizer._trainable_variables_indices


def row_state_variables(optimizer: Any, variable: Any) -> Dict[str, Any]:
    """The optimizer's variables holding ``variable``'s state per row, by kind (``"momentum"``, ``"velocity"``, ...).

    Keras names a state variable ``<variable path with "/" as "_">_<kind>``
    (``add_variable_from_reference``); its first dimension is the rows'.
    """
    prefix = variable.path.replace("/", "_") + "_"
    return {state.name[len(prefix):]: state for state in optimizer.variables
            if state.name.startswith(prefix) and len(state.shape) and state.shape[0] == variable.shape[0]}


def call_nodes(operation: Any) -> List[Any]:
    """The calls of a layer or operation in functional graphs (``_inbound_nodes``): each has ``input_tensors``,
    ``output_tensors`` and ``arguments``."""
    return list(getattr(operation, "_inbound_nodes", ()))


def column_of(tensor: Any) -> Optional[Tuple[Any, Any]]:
    """``(source tensor, key)`` when ``tensor`` is ``source[key]`` in a functional graph (Keras' ``GetItem``
    operation, which ``ids[:, i]`` makes); None otherwise."""
    history = getattr(tensor, "_keras_history", None)
    if history is None or type(history.operation).__name__ != "GetItem":
        return None
    nodes = call_nodes(history.operation)
    if history.node_index >= len(nodes):
        return None
    args = nodes[history.node_index].arguments.args
    return (args[0], args[1]) if len(args) == 2 else None


def compile_config(model: Any) -> Optional[Dict[str, Any]]:
    """The arguments ``model.compile`` was called with (``_compile_config``), None before it was."""
    config = getattr(model, "_compile_config", None)
    return None if config is None else config.config


def serialized_function(layer: Any, function: Any) -> Any:
    """A ``Lambda`` layer's ``function`` as Keras writes it into the layer's config."""
    return layer._serialize_function_to_config(function)


def compiled_losses(model: Any) -> List[Any]:
    """The compiled loss and metrics containers of ``model`` (``_compile_loss``, ``_compile_metrics``; None: none)."""
    return [getattr(model, "_compile_loss", None), getattr(model, "_compile_metrics", None)]


def adagrad_accumulator(optimizer: Any, variable: Any) -> Any:
    """Keras' ``Adagrad``'s accumulator of ``variable``."""
    return optimizer._accumulators[optimizer._get_variable_index(variable)]


def cache_builder(lm: Any) -> Any:
    """A Keras Hub ``CausalLM``'s ``_build_cache(token_ids)`` (None: it has none)."""
    return getattr(lm, "_build_cache", None)


# The private sublayers of a Keras Hub decoder layer and of its attention, by family: what a decode step calls.
_DECODER_PARTS = {
    "gpt2": (("_self_attention_layer_norm", "_self_attention_layer", "_feedforward_layer_norm",
              "_feedforward_intermediate_dense", "_feedforward_output_dense"),
             ("_query_dense", "_key_dense", "_value_dense", "_output_dense", "_inverse_sqrt_key_dim")),
    "llama": (("_self_attention_layernorm", "_self_attention_layer", "_feedforward_layernorm",
               "_feedforward_gate_dense", "_feedforward_intermediate_dense", "_feedforward_output_dense"),
              ("_query_dense", "_key_dense", "_value_dense", "_output_dense", "_inv_norm_factor")),
}


def decoder_parts(family: str, layer: Any) -> Optional[Dict[str, Any]]:
    """The sublayers a decode step of ``family`` (``"gpt2"``: ``TransformerDecoder`` with
    ``CachedMultiHeadAttention``; ``"llama"``: ``LlamaTransformerDecoder``) calls in ``layer``, by their private
    names (the attention's with ``"attention."`` first, its softmax scale as ``"attention.scale"``); None when
    ``layer`` lacks one."""
    layer_names, attention_names = _DECODER_PARTS[family]
    if not all(hasattr(layer, name) for name in layer_names):
        return None
    parts = {name: getattr(layer, name) for name in layer_names}
    attention = parts["_self_attention_layer"]
    if not all(hasattr(attention, name) for name in attention_names):
        return None
    parts.update({f"attention.{name}": getattr(attention, name) for name in attention_names[:-1]})
    parts["attention.scale"] = getattr(attention, attention_names[-1])
    return parts
