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
builder and the sublayers of its GPT-2, Llama, Mistral and Gemma decoder
layers (for decoding with a buffer per layer) are read here too. When Keras
changes one of these, this module is what changes.
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


# The private sublayers of a Keras Hub decoder layer (the second: its attention) and of its attention, by family: what a
# decode step calls.
# Mistral's layers have Llama's names.
_LLAMA_NAMES = (("_self_attention_layernorm", "_self_attention_layer", "_feedforward_layernorm",
                 "_feedforward_gate_dense", "_feedforward_intermediate_dense", "_feedforward_output_dense"),
                ("_query_dense", "_key_dense", "_value_dense", "_output_dense"))
_DECODER_PARTS = {
    "gpt2": (("_self_attention_layer_norm", "_self_attention_layer", "_feedforward_layer_norm",
              "_feedforward_intermediate_dense", "_feedforward_output_dense"),
             ("_query_dense", "_key_dense", "_value_dense", "_output_dense")),
    "llama": _LLAMA_NAMES,
    "mistral": _LLAMA_NAMES,
    "gemma": (("pre_attention_norm", "attention", "pre_ffw_norm", "gating_ffw", "gating_ffw_2", "ffw_linear"),
              ("query_dense", "key_dense", "value_dense", "output_dense", "_apply_rope")),
}
# A Gemma 2 layer's norms after its attention and feed-forward (None in a Gemma 1 layer).
_OPTIONAL_PARTS = {"gemma": ("post_attention_norm", "post_ffw_norm")}


def _gemma_attention(layer: Any, attention: Any) -> Tuple[float, Optional[int], Optional[float]]:
    """``CachedGemmaAttention._compute_attention``'s query scale, sliding window and soft cap."""
    import numpy as np

    head_dim = attention.head_dim if attention.query_head_dim_normalize else \
        attention.hidden_dim // attention.num_query_heads
    window = attention.sliding_window_size if attention.use_sliding_window_attention else None
    return 1 / np.sqrt(head_dim), window, attention.logit_soft_cap


# What a family's attention does to its scores: (query scale, sliding window or None, soft cap or None), read from the
# decoder layer and its attention. Mistral's window is the decoder layer's (it makes the mask).
_ATTENTION_SETTINGS = {
    "gpt2": lambda layer, attention: (attention._inverse_sqrt_key_dim, None, None),
    "llama": lambda layer, attention: (attention._inv_norm_factor, None, None),
    "mistral": lambda layer, attention: (attention._inv_norm_factor, layer.sliding_window, None),
    "gemma": _gemma_attention,
}


def decoder_parts(family: str, layer: Any) -> Optional[Dict[str, Any]]:
    """The sublayers a decode step of ``family`` calls in ``layer``, by their private names; None when ``layer``
    lacks one.

    The families: ``"gpt2"`` (``TransformerDecoder`` with
    ``CachedMultiHeadAttention``), ``"llama"`` (``LlamaTransformerDecoder``),
    ``"mistral"`` (``MistralTransformerDecoder``) and ``"gemma"``
    (``GemmaDecoderBlock``, Gemma 1 and 2; its optional post-attention and
    post-feed-forward norms are None when absent). The attention's sublayers
    (and Gemma's ``_apply_rope``) have ``"attention."`` first; its query scale,
    sliding window (None: none) and score soft cap (None: none) are
    ``"attention.scale"``, ``"attention.window"`` and ``"attention.soft_cap"``.
    """
    layer_names, attention_names = _DECODER_PARTS[family]
    if not all(hasattr(layer, name) for name in layer_names):
        return None
    parts = {name: getattr(layer, name) for name in layer_names}
    parts.update({name: getattr(layer, name, None) for name in _OPTIONAL_PARTS.get(family, ())})
    attention = parts[layer_names[1]]
    if not all(hasattr(attention, name) for name in attention_names):
        return None
    parts.update({f"attention.{name}": getattr(attention, name) for name in attention_names})
    try:
        settings = _ATTENTION_SETTINGS[family](layer, attention)
    except AttributeError:
        return None
    parts.update(zip(("attention.scale", "attention.window", "attention.soft_cap"), settings))
    return parts
