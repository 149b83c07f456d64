"""Decoding with a key and a value buffer per layer, written once per chunk of decode steps; nothing stacked.

Keras Hub's ``call_with_cache`` keeps one ``[batch, layers, 2, length, heads,
head_dim]`` cache and, at every decode step, slices each layer's part out,
writes the new position into a copy and stacks the layers back: about five
copies of every row's whole cache per step. :class:`LayerBufferDecoder`
keeps, after the model's own prefill (unchanged, split once per batch), one
key and one value buffer ``[batch, kv_heads, length, head_dim]`` per layer,
and leaves them unchanged during a chunk of decode steps: the chunk's loop
carries a small key and value tail ``[batch, kv_heads, steps, head_dim]``
per layer, a step writes its position into slot ``step`` of the tails and
attends to the buffers' positions before the chunk and to the tails' slots
up to its own (one softmax over both, four batched matrix products: no
operand transposed, grouped-query heads not repeated). At the chunk's end the
tails are written into the buffers with ``tf.tensor_scatter_nd_update``.
Dropping finished rows gathers the rows kept.

Writing into the buffers at every step would copy them at every step:
TensorFlow on a CPU never updates in place a tensor that enters a
``tf.function`` or a ``tf.while_loop`` body as an argument, and a variable
written by slice or scatter (in place) is then copied whole by every read (its
copy-on-read mode). Only XLA updates in place, and Keras Hub's step under XLA
was 7x slower on a CPU here (batch 32, cache 256: 3.45 against 0.47 s). The
tails are copied at every step, but they are ``steps`` positions long. So a
step reads the cache once (attention) and copies it once per chunk (``8``
steps in generation), against about five copies per step before; see
``docs/design/inference.md`` for the curve.

The step runs the model's own sublayers (projections, norms, feed-forward,
rotary embedding, output) around sparktf's attention, so it follows each
family's layer order, and has code for these families:

* ``"gpt2"``: ``GPT2CausalLM`` (``TransformerDecoder``, normalisation first,
  learned positions);
* ``"llama"``: ``LlamaCausalLM`` and ``Llama3CausalLM`` (rotary positions,
  grouped-query attention, gated feed-forward);
* ``"mistral"``: ``MistralCausalLM``, Llama's step (the same layers) with its
  sliding window: a query attends to the last ``sliding_window`` positions;
* ``"gemma"``: ``GemmaCausalLM``, Gemma 1 and Gemma 2 (step of its own:
  embeddings scaled by ``sqrt(hidden_dim)``, Gemma's rotary layout, GeGLU
  feed-forward; Gemma 2's norms after the attention and the feed-forward, soft
  caps on the attention scores, a sliding window on every other layer; the
  logits' soft cap is the output embedding's own).

Other families decode with :class:`~sparktf.inference.decoding.Decoder` on
``call_with_cache`` (Qwen, Phi-3, Falcon, ...), and the engine logs why once;
Gemma 3 (``Gemma3CausalLM``: query-key norms, a cache of one tensor per layer
and vision inputs) is not decoded token by token at all
(:func:`~sparktf.inference.decoding.probe_decoding` refuses its cache). The
driver checks a family's step against ``call_with_cache`` on a tiny prompt
before choosing it (:func:`buffer_family`).
"""

from __future__ import annotations

from functools import partial
from typing import Any, List, Optional, Tuple

import numpy as np

from sparktf.inference.decoding import CacheLayout, Decoder
from sparktf.models.keras_internals import decoder_parts

__all__ = ["LayerBufferDecoder", "buffer_family"]

#: The largest difference of a step's logits from ``call_with_cache``'s the driver's check accepts.
LOGITS_ATOL = 1e-4
_MASKED = -1e9  # added to a masked score, as Keras' softmax does


def _family(lm: Any) -> Optional[str]:
    """The family whose decode step sparktf writes for ``lm``, if any."""
    import keras_hub

    backbone = getattr(lm, "backbone", None)
    if isinstance(backbone, keras_hub.models.GPT2Backbone):
        return "gpt2"
    if isinstance(backbone, keras_hub.models.LlamaBackbone):
        return "llama"
    if isinstance(backbone, keras_hub.models.MistralBackbone):
        return "mistral"
    if isinstance(backbone, keras_hub.models.GemmaBackbone):
        return "gemma"
    return None


def buffer_family(lm: Any, layout: CacheLayout) -> Tuple[Optional[str], Optional[str]]:
    """``(family, None)`` when ``lm`` decodes with a buffer per layer, else ``(None, why not)``.

    Besides the family and the cache's layout (``[batch, layers, 2, length,
    kv_heads, head_dim]``), one decode step after a tiny prefill must give the
    logits of ``call_with_cache`` within :data:`LOGITS_ATOL`.
    """
    import tensorflow as tf

    family = _family(lm)
    if family is None:
        return None, f"sparktf has no decode step with a buffer per layer for {type(lm.backbone).__name__}"
    layers = lm.backbone.transformer_layers
    if len(layout.shape) != 6 or layout.sequence_axis != 3 or layout.shape[1:3] != (len(layers), 2) or \
            any(decoder_parts(family, layer) is None for layer in layers) or \
            (family == "gpt2" and not all(layer.normalize_first for layer in layers)):
        return None, f"{type(lm).__name__}'s cache or decoder layers are not those of its family {family}"
    tokens = tf.constant(np.arange(1, 7, dtype=np.int32)[None, :] % int(lm.backbone.vocabulary_size))
    empty = tf.zeros([1, len(layers), 2, 6] + list(layout.shape[4:]), layout.dtype)
    stacked = lm.call_with_cache(tokens[:, :5], empty, 0)[2]
    want, _, _ = lm.call_with_cache(tokens[:, 5:], stacked, 5)
    buffers = _split(stacked, len(layers))
    got, _ = _STEPS[family](lm, tokens[:, 5:], buffers, [buffer[:, :, :1] for buffer in buffers], 5, 0)
    difference = float(tf.reduce_max(tf.abs(tf.cast(got, tf.float32) - tf.cast(want, tf.float32))))
    if not difference <= LOGITS_ATOL:
        return None, f"its decode step with a buffer per layer differs from call_with_cache by {difference:.2g}"
    return family, None


def _split(stacked: Any, layers: int) -> List[Any]:
    """The per-layer key and value buffers ``[batch, kv_heads, length, head_dim]`` of a ``call_with_cache`` cache
    (copied once)."""
    import tensorflow as tf

    return [tf.transpose(stacked[:, layer, part], [0, 2, 1, 3]) for layer in range(layers) for part in (0, 1)]


def _write(buffer: Any, update: Any, start: Any) -> Any:
    """``buffer`` ``[batch, kv_heads, length, dim]`` with positions ``start`` on of each row set to ``update``
    ``[batch, kv_heads, n, dim]``."""
    import tensorflow as tf

    shape = tf.shape(update)
    rows, heads, positions = tf.meshgrid(tf.range(shape[0]), tf.range(shape[1]), start + tf.range(shape[2]),
                                         indexing="ij")
    return tf.tensor_scatter_nd_update(buffer, tf.stack([rows, heads, positions], axis=-1), update)


def _by_head(projected: Any) -> Any:
    """One position's keys or values ``[batch, 1, kv_heads, dim]`` as ``[batch, kv_heads, 1, dim]`` (no copy)."""
    import tensorflow as tf

    return tf.reshape(projected, [tf.shape(projected)[0], projected.shape[2], 1, projected.shape[3]])


def _attend(query: Any, past: Tuple[Any, Any], recent: Tuple[Any, Any], start: Any, step: Any, scale: float,
            window: Optional[int] = None, soft_cap: Optional[float] = None) -> Any:
    """One query position ``[batch, 1, heads, dim]`` attending to the ``past`` keys and values ``[batch, kv_heads,
    length, dim]`` before position ``start`` and the ``recent`` ones ``[batch, kv_heads, steps, dim]`` up to slot
    ``step``: ``[batch, 1, heads, dim]``.

    The scores are ``scale`` times the query-key products, then ``soft_cap *
    tanh(scores / soft_cap)`` when a ``soft_cap`` is given (Gemma 2); with a
    sliding ``window`` only the last ``window`` positions (the query's own
    included) are attended to, as Mistral's and Gemma 2's masks do. One
    softmax over both parts' scores; four batched matrix products
    (grouped-query heads not repeated, no operand transposed).
    """
    import tensorflow as tf

    batch, heads, dim = tf.shape(query)[0], query.shape[2], query.shape[3]
    kv_heads, length = past[0].shape[1], tf.shape(past[0])[2]
    grouped = tf.reshape(query, [batch, kv_heads, heads // kv_heads, dim])
    scale = tf.cast(scale, query.dtype)
    past_positions, slots = tf.range(length), tf.range(tf.shape(recent[0])[2])
    past_visible, recent_visible = past_positions < start, slots <= step
    if window is not None:  # position start + step sees the positions after start + step - window
        past_visible &= past_positions > start + step - window
        recent_visible &= slots > step - window
    scores = []
    for keys, visible in ((past[0], past_visible), (recent[0], recent_visible)):
        products = tf.matmul(grouped, keys, transpose_b=True) * scale
        if soft_cap is not None:
            products = tf.tanh(products / soft_cap) * soft_cap
        scores.append(tf.cast(products, tf.float32) + tf.where(visible, 0.0, _MASKED))
    weights = tf.cast(tf.nn.softmax(tf.concat(scores, axis=-1), axis=-1), past[1].dtype)
    attended = tf.matmul(weights[..., :length], past[1]) + tf.matmul(weights[..., length:], recent[1])
    return tf.reshape(attended, [batch, 1, heads, dim])


def _gpt2_step(lm: Any, tokens: Any, buffers: List[Any], tails: List[Any], start: Any,
               step: Any) -> Tuple[Any, List[Any]]:
    """GPT-2's decode step (``GPT2CausalLM.call_with_cache``) at position ``start + step``: the logits and the
    ``tails`` with slot ``step`` written (see :meth:`LayerBufferDecoder._decode_graph`)."""
    backbone = lm.backbone
    x = backbone.token_embedding(tokens)
    x = backbone.embeddings_add((x, backbone.position_embedding(x, start_index=start + step)))
    written = []
    for layer_index, layer in enumerate(backbone.transformer_layers):
        parts = decoder_parts("gpt2", layer)
        normed = parts["_self_attention_layer_norm"](x)
        keys = _write(tails[2 * layer_index], _by_head(parts["attention._key_dense"](normed)), step)
        values = _write(tails[2 * layer_index + 1], _by_head(parts["attention._value_dense"](normed)), step)
        attended = _attend(parts["attention._query_dense"](normed), buffers[2 * layer_index: 2 * layer_index + 2],
                           (keys, values), start, step, parts["attention.scale"])
        x = parts["attention._output_dense"](attended) + x
        feedforward = parts["_feedforward_intermediate_dense"](parts["_feedforward_layer_norm"](x))
        x = parts["_feedforward_output_dense"](feedforward) + x
        written += [keys, values]
    return backbone.token_embedding(backbone.layer_norm(x), reverse=True), written


def _llama_step(family: str, lm: Any, tokens: Any, buffers: List[Any], tails: List[Any], start: Any,
                step: Any) -> Tuple[Any, List[Any]]:
    """Llama's or Mistral's decode step (``LlamaCausalLM.call_with_cache``, ``MistralCausalLM``'s: the same layers
    but for Mistral's sliding window) at position ``start + step``: the logits and the ``tails`` with slot ``step``
    written (see :meth:`LayerBufferDecoder._decode_graph`)."""
    import tensorflow as tf

    backbone = lm.backbone
    x = backbone.token_embedding(tokens)
    written = []
    for layer_index, layer in enumerate(backbone.transformer_layers):
        parts = decoder_parts(family, layer)
        rotary = parts["_self_attention_layer"].rotary_embedding_layer
        normed = parts["_self_attention_layernorm"](x)
        keys = _write(tails[2 * layer_index],
                      _by_head(rotary(parts["attention._key_dense"](normed), start_index=start + step)), step)
        values = _write(tails[2 * layer_index + 1], _by_head(parts["attention._value_dense"](normed)), step)
        query = rotary(parts["attention._query_dense"](normed), start_index=start + step)
        attended = _attend(query, buffers[2 * layer_index: 2 * layer_index + 2], (keys, values), start, step,
                           parts["attention.scale"], parts["attention.window"])
        x = parts["attention._output_dense"](attended) + x
        normed = parts["_feedforward_layernorm"](x)
        gate = tf.cast(layer.activation(tf.cast(parts["_feedforward_gate_dense"](normed), tf.float32)), x.dtype)
        x = parts["_feedforward_output_dense"](parts["_feedforward_intermediate_dense"](normed) * gate) + x
        written += [keys, values]
    return backbone.token_embedding(backbone.layer_norm(x), reverse=True), written


def _gemma_step(lm: Any, tokens: Any, buffers: List[Any], tails: List[Any], start: Any,
                step: Any) -> Tuple[Any, List[Any]]:
    """Gemma's decode step (``GemmaCausalLM.call_with_cache``, Gemma 1 and 2) at position ``start + step``: the
    logits and the ``tails`` with slot ``step`` written (see :meth:`LayerBufferDecoder._decode_graph`).

    Unlike Llama's: the embeddings are scaled by ``sqrt(hidden_dim)``, the
    rotary embedding is Gemma's (``_apply_rope``), the feed-forward is GeGLU
    (tanh-approximated GELU), and Gemma 2's layers add norms after the
    attention and the feed-forward, soft caps on the attention scores and a
    sliding window on every other layer (the final logits' soft cap is the
    output embedding's own).
    """
    import keras
    import tensorflow as tf

    backbone = lm.backbone
    x = backbone.token_embedding(tokens)
    x = x * tf.cast(tf.sqrt(tf.cast(backbone.hidden_dim, tf.float32)), x.dtype)
    written = []
    for layer_index, layer in enumerate(backbone.transformer_layers):
        parts = decoder_parts("gemma", layer)
        rotary = parts["attention._apply_rope"]
        normed = parts["pre_attention_norm"](x)
        keys = _write(tails[2 * layer_index],
                      _by_head(rotary(parts["attention.key_dense"](normed), start + step)), step)
        values = _write(tails[2 * layer_index + 1], _by_head(parts["attention.value_dense"](normed)), step)
        query = rotary(parts["attention.query_dense"](normed), start + step)
        attended = parts["attention.output_dense"](
            _attend(query, buffers[2 * layer_index: 2 * layer_index + 2], (keys, values), start, step,
                    parts["attention.scale"], parts["attention.window"], parts["attention.soft_cap"]))
        if parts["post_attention_norm"] is not None:
            attended = parts["post_attention_norm"](attended)
        x = x + attended
        normed = parts["pre_ffw_norm"](x)
        gated = keras.activations.gelu(parts["gating_ffw"](normed), approximate=True) * parts["gating_ffw_2"](normed)
        feedforward = parts["ffw_linear"](gated)
        if parts["post_ffw_norm"] is not None:
            feedforward = parts["post_ffw_norm"](feedforward)
        x = feedforward + x
        written += [keys, values]
    return backbone.token_embedding(backbone.layer_norm(x), reverse=True), written


_STEPS = {"gpt2": _gpt2_step, "llama": partial(_llama_step, "llama"), "mistral": partial(_llama_step, "mistral"),
          "gemma": _gemma_step}


class LayerBufferDecoder(Decoder):
    """:class:`~sparktf.inference.decoding.Decoder` with a key and a value buffer per layer, written once per chunk
    of decode steps (see the module docstring); its caches are lists of ``2 x layers`` buffers.

    Parameters
    ----------
    lm : keras_hub.models.CausalLM
        A model of ``family``, compiled with its sampler.
    layout : CacheLayout
        Its ``call_with_cache`` cache's layout.
    family : str
        ``"gpt2"``, ``"llama"``, ``"mistral"`` or ``"gemma"`` (:func:`buffer_family`'s).
    """

    #: Measured with ``bench_text.py``'s curve (GPT-2 shape, one thread, the bests of 5 runs on a loaded machine):
    #: a row's step 0.25 ms plus 1.1 us per position (the attention's read), where copying costs 8 us per position.
    ROW_COSTS = (0.15, 30.0)

    def __init__(self, lm: Any, layout: CacheLayout, family: str):
        self.family, self.layers = family, len(lm.backbone.transformer_layers)
        super().__init__(lm, layout)

    def _cache_spec(self) -> Any:
        """A key and a value buffer ``[batch, kv_heads, length, head_dim]`` per layer."""
        import tensorflow as tf

        kv_heads, head_dim = self.layout.shape[4:]
        spec = tf.TensorSpec((None, kv_heads, None, head_dim), self.layout.dtype)
        return [spec] * (2 * self.layers)

    def prefill(self, token_ids: np.ndarray, prompt_end: int, prefix: Any = None) -> List[Any]:
        """The model's own prefill (:meth:`Decoder.stacked_prefill`), split once into the per-layer buffers."""
        return _split(self.stacked_prefill(token_ids, prompt_end, prefix), self.layers)

    def _decode_graph(self, token_ids: Any, cache: Any, index: Any, prompt_mask: Any, steps: Any) -> Tuple[Any, Any]:
        """A chunk of ``steps`` decode steps (see :meth:`Decoder.decode`) whose new keys and values go to small tails.

        The chunk writes positions ``start = index - 1`` to ``start + steps -
        1``. Its loop carries a key and a value tail ``[batch, kv_heads,
        steps, head_dim]`` per layer, and step ``s`` writes slot ``s``; the
        buffers are not written in the loop, and a step attends to their
        positions before ``start`` (every step writes its position for every
        row, a row inside its prompt too, so the later ones are never needed)
        and to the tails' slots up to ``s``. The tails are then written into
        the buffers: one copy of each buffer per chunk.
        """
        import tensorflow as tf

        self.traces += 1
        start, step_function = index - 1, _STEPS[self.family]
        tails = [tf.zeros([tf.shape(token_ids)[0], buffer.shape[1], steps, buffer.shape[3]], buffer.dtype)
                 for buffer in cache]

        def forward(last: Any, step: Any, tails: Any) -> Tuple[Any, Any]:
            return step_function(self.lm, last, cache, tails, start, step)

        token_ids, tails = self._loop(token_ids, index, prompt_mask, steps, forward, tails)
        return token_ids, [_write(buffer, tail, start) for buffer, tail in zip(cache, tails)]
