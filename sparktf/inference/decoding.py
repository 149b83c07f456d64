"""Token-level decoding of a Keras Hub ``CausalLM``: prefill and chunks of decode steps on its key/value cache.

:class:`Decoder` drives the model's own ``call_with_cache`` (the forward pass
``generate`` uses) and its compiled sampler's per-token choice
(``compute_probabilities``, ``get_next_token``), so it needs no per-model code:

* :meth:`Decoder.prefill` fills a batch's cache from its padded prompts, after
  a shared prefix whose cache was computed once (:meth:`Decoder.prefix_cache`)
  and is tiled into the batch, or after each row's own prefix (the runs rows
  share, gathered by :meth:`Decoder.prefix_rows`);
* :meth:`Decoder.decode` runs up to ``steps`` decode steps, one position for
  every row, exactly as the sampler's loop does (a row still inside its
  prompt keeps its own token);
* :meth:`Decoder.keep` drops finished rows from the batch (tokens and cache).

Both functions are traced once per worker with any batch size and length
(:attr:`Decoder.traces` counts them). A model whose cache is not one tensor
with the batch on its first axis and one axis along the sequence, or whose
sampler replaces the token loop (beam, contrastive), is not decodable here:
:func:`probe_decoding` says why. It reads the cache's layout from two tiny
prefills, once on the driver: the layout travels to the workers with
``method="generate"``'s options, and no worker probes again.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from sparktf.models.keras_internals import cache_builder

__all__ = ["CacheLayout", "Decoder", "probe_decoding"]


@dataclass(frozen=True)
class CacheLayout:
    """A model's key/value cache: one tensor ``shape`` with the batch on axis 0 and the sequence on ``sequence_axis``
    (``None`` in ``shape`` on both)."""

    shape: Tuple[Optional[int], ...]
    sequence_axis: int
    dtype: str


def _cache_layout(lm: Any) -> Optional[CacheLayout]:
    """The layout of ``lm``'s cache, read from two tiny prefills (None: not one tensor, or no single sequence axis)."""
    import tensorflow as tf

    build = cache_builder(lm)
    if build is None or list(inspect.signature(build).parameters) != ["token_ids"]:
        return None
    shapes = []
    for length in (2, 3):
        _, cache = build(tf.zeros((1, length), "int32"))
        if not isinstance(cache, tf.Tensor):
            return None
        shapes.append(tuple(cache.shape.as_list()))
    changed = [axis for axis, (one, two) in enumerate(zip(*shapes)) if one != two]
    if len(changed) != 1 or changed[0] == 0 or shapes[0][0] != 1:
        return None
    shape = tuple(None if axis in (0, changed[0]) else size for axis, size in enumerate(shapes[0]))
    return CacheLayout(shape, changed[0], cache.dtype.name)


def probe_decoding(lm: Any) -> Tuple[Optional[CacheLayout], Optional[str]]:
    """Whether ``lm`` can be decoded chunk by chunk: ``(its cache's layout, None)``, else ``(None, why not)``.

    The layout is read from two tiny prefills (the only ones before generation), so call it once per model: on the
    driver, which ships the layout to the workers.
    """
    from keras_hub.samplers import Sampler

    if not callable(getattr(lm, "call_with_cache", None)):
        return None, f"{type(lm).__name__} has no call_with_cache(token_ids, cache, cache_update_index)"
    sampler = getattr(lm, "sampler", None)
    if sampler is None or type(sampler).__call__ is not Sampler.__call__:
        return None, (f"its sampler {type(sampler).__name__} runs a loop of its own (beam or contrastive search); "
                      "compile(sampler='greedy' | 'top_k' | 'top_p' | 'random') decodes token by token")
    layout = _cache_layout(lm)
    if layout is None:
        return None, (f"the cache of {type(lm).__name__}._build_cache is not one tensor with the batch first and "
                      "one sequence axis")
    return layout, None


class Decoder:
    """Prefill and chunked decoding of ``lm`` (see the module docstring).

    Parameters
    ----------
    lm : keras_hub.models.CausalLM
        A model :func:`probe_decoding` accepts, compiled with its sampler.
    layout : CacheLayout
        Its cache's layout (:func:`probe_decoding`'s).
    """

    #: A row's decode step, in copies of one cached position (see ``grouped_batches``): per position of its cache
    #: (each step copies the whole cache) and besides.
    ROW_COSTS = (1.0, 0.0)

    def __init__(self, lm: Any, layout: CacheLayout):
        import tensorflow as tf

        self.lm, self.layout = lm, layout
        self.traces = 0
        tokens = tf.TensorSpec((None, None), tf.int32)
        scalar = tf.TensorSpec((), tf.int32)
        stacked = tf.TensorSpec(layout.shape, layout.dtype)
        self._prefill = tf.function(self._prefill_graph, jit_compile=False,
                                    input_signature=[tokens, stacked, scalar])
        self._decode = tf.function(self._decode_graph, jit_compile=False,
                                   input_signature=[tokens, self._cache_spec(), scalar,
                                                    tf.TensorSpec((None, None), tf.bool), scalar])

    def _cache_spec(self) -> Any:
        """What :meth:`decode` takes as a cache: the model's own, one tensor."""
        import tensorflow as tf

        return tf.TensorSpec(self.layout.shape, self.layout.dtype)

    # ------------------------------------------------------------------ prefill

    def empty_cache(self, batch: int, length: int) -> Any:
        """A zero cache of ``batch`` rows and ``length`` positions."""
        import tensorflow as tf

        shape = [batch if axis == 0 else length if axis == self.layout.sequence_axis else size
                 for axis, size in enumerate(self.layout.shape)]
        return tf.zeros(shape, self.layout.dtype)

    def prefix_cache(self, token_ids: np.ndarray, prefix: Any = None) -> Any:
        """The model's cache of the rows ``token_ids`` ``[rows, length]`` (after ``prefix``'s tokens when given): a
        ``prefix`` for :meth:`prefill` (computed once per worker and ``prefix=``, or per window and shared runs)."""
        return self.stacked_prefill(token_ids, token_ids.shape[1], prefix)

    def prefix_rows(self, cache: Any, rows: Sequence[int], length: int) -> Any:
        """The first ``length`` positions of the model's ``cache``'s ``rows`` (repeated as listed): a batch's
        ``prefix``."""
        import tensorflow as tf

        size = [-1] * len(self.layout.shape)
        size[self.layout.sequence_axis] = length
        return tf.gather(tf.slice(cache, [0] * len(size), size), tf.constant(list(rows), tf.int32), axis=0)

    def prefill(self, token_ids: np.ndarray, prompt_end: int, prefix: Any = None) -> Any:
        """The cache :meth:`decode` takes of a batch of padded ``token_ids`` (see :meth:`stacked_prefill`)."""
        return self.stacked_prefill(token_ids, prompt_end, prefix)

    def stacked_prefill(self, token_ids: np.ndarray, prompt_end: int, prefix: Any = None) -> Any:
        """The model's own cache (one tensor) of a batch of padded ``token_ids`` (rows start after ``prefix``'s tokens
        when given: a cache of one row, tiled, or of one row per row of the batch).

        Returns a cache as long as ``token_ids`` holding positions up to
        ``prompt_end`` (the longest prompt's end); positions past a row's
        prompt hold values no step attends to before it writes them.
        """
        import tensorflow as tf

        batch, length = token_ids.shape
        cache = self.empty_cache(batch, length)
        start = 0
        if prefix is not None:
            start = int(prefix.shape[self.layout.sequence_axis])
            tiled = prefix if prefix.shape[0] == batch else tf.repeat(prefix, batch, axis=0)
            padding = [[0, 0]] * len(self.layout.shape)
            padding[self.layout.sequence_axis] = [0, length - start]
            cache = tf.pad(tiled, padding)
        if prompt_end <= start:  # every row is the prefix alone: decoding starts at its last token
            return cache
        return self._prefill(token_ids[:, start:prompt_end].astype(np.int32), cache, start)

    def _prefill_graph(self, token_ids: Any, cache: Any, start: Any) -> Any:
        self.traces += 1
        _, _, cache = self.lm.call_with_cache(token_ids, cache, start)
        return cache

    # ------------------------------------------------------------------ decode

    def decode(self, token_ids: Any, cache: Any, index: int, prompt_mask: Any, steps: int) -> Tuple[Any, Any]:
        """``steps`` decode steps from position ``index``: the new ``(token_ids, cache)``.

        Position ``p`` of a row whose ``prompt_mask[p]`` is set keeps its
        prompt token; every other position gets the sampler's next token.
        """
        return self._decode(token_ids, cache, index, prompt_mask, steps)

    def _decode_graph(self, token_ids: Any, cache: Any, index: Any, prompt_mask: Any, steps: Any) -> Tuple[Any, Any]:
        self.traces += 1

        def forward(last: Any, step: Any, cache: Any) -> Tuple[Any, Any]:
            logits, _, cache = self.lm.call_with_cache(last, cache, index - 1 + step)
            return logits, cache

        return self._loop(token_ids, index, prompt_mask, steps, forward, cache)

    def _loop(self, token_ids: Any, index: Any, prompt_mask: Any, steps: Any, forward: Any,
              state: Any) -> Tuple[Any, Any]:
        """``steps`` decode steps from position ``index`` in a ``tf.while_loop`` carrying the tokens and ``state``:
        the new ``(token_ids, state)``.

        Step ``s`` feeds each row's token at position ``index - 1 + s`` to
        ``forward(last [batch, 1], s, state)``, which returns the logits
        ``[batch, 1, vocabulary]`` and the new ``state``, and sets position
        ``index + s`` to the sampler's token (a prompt's own token where
        ``prompt_mask`` is set).
        """
        import tensorflow as tf

        sampler = self.lm.sampler
        batch = tf.shape(token_ids)[0]

        def body(step: Any, token_ids: Any, state: Any) -> Tuple[Any, Any, Any]:
            position = index + step
            logits, state = forward(tf.slice(token_ids, [0, position - 1], [batch, 1]), step, state)
            probabilities = sampler.compute_probabilities(tf.squeeze(logits, axis=1))
            chosen = tf.cast(sampler.get_next_token(probabilities), token_ids.dtype)
            chosen = tf.where(prompt_mask[:, position], token_ids[:, position], chosen)
            token_ids = tf.tensor_scatter_nd_update(
                token_ids, tf.stack([tf.range(batch), tf.fill([batch], position)], axis=1), chosen)
            return step + 1, token_ids, state

        _, token_ids, state = tf.while_loop(lambda step, *_: step < steps, body, (tf.constant(0), token_ids, state))
        return token_ids, state

    # ------------------------------------------------------------------ rows

    @staticmethod
    def keep(rows: Sequence[int], *tensors: Any) -> List[Any]:
        """``tensors`` (or lists of them) with only the batch ``rows`` (on their first axis): the rows kept are
        gathered, the others never copied."""
        import tensorflow as tf

        indices = tf.constant(list(rows), tf.int32)
        return [tf.nest.map_structure(lambda tensor: tf.gather(tensor, indices, axis=0), structure)
                for structure in tensors]
