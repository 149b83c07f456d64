"""Batch generation with a Keras Hub ``CausalLM``: prompts grouped by length, finished rows dropped, a shared prefix.

:func:`generation_options` checks ``method="generate"``'s keywords on the
driver and probes the model's key/value cache there, once: the options carry
its layout to the workers. On the executors, :class:`GenerationEngine` (one per Python worker,
model and options) completes a *window* of prompts (several batches of one
partition) at a time:

1. it tokenizes them once, and names a row it cannot complete (a prompt that
   with its new tokens is longer than the model's sequence length);
2. it sorts the rows by length and cuts batches of up to ``batch_size`` rows
   where decoding them together costs least (:func:`grouped_batches`), each
   padded to the smallest of a fixed set of lengths (:func:`length_buckets`)
   that holds its longest prompt plus its new tokens;
3. it prefills each batch (after the shared prefix, whose cache was computed
   once, and after the leading runs of tokens its rows share with other rows
   of the window, found and prefilled once per window:
   :mod:`~sparktf.inference.shared_runs`; such rows are batched apart from
   the others) and decodes ``chunk_steps`` tokens at a time, dropping the rows that
   have produced a stop token or their ``max_new_tokens`` between chunks
   (GPT-2, Llama, Mistral and Gemma with a key and a value buffer per layer,
   :mod:`~sparktf.inference.kv_cache`; other models on ``call_with_cache``);
4. it gives the completions back in the window's order.

With a greedy sampler each completion is the one ``lm.generate`` gives for
the prompt alone, with ``generate``'s defaults (``stop_token_ids="auto"``,
``max_length`` the preprocessor's sequence length unless ``max_new_tokens``
is given). A model the decoder cannot drive (see
:func:`~sparktf.inference.decoding.probe_decoding`) runs ``lm.generate``
on the same sorted batches, with each batch's ``max_length``.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from sparktf.errors import ConfigurationError, DataError
from sparktf.inference.decoding import CacheLayout, Decoder, probe_decoding
from sparktf.inference.kv_cache import LayerBufferDecoder, buffer_family
from sparktf.inference.shared_runs import MIN_SHARED_RUN, SharedRuns

__all__ = ["GenerationOptions", "GenerationEngine", "GenerationTotals", "RejectedRow", "generation_options",
           "grouped_batches", "length_buckets", "padding_stops", "stop_token_ids", "timed_window", "WINDOW_BATCHES"]

_LOG = logging.getLogger("sparktf.generate")

#: Batches of prompts one window holds: the rows sorted by length together.
WINDOW_BATCHES = 8
#: Lengths a worker pads its batches to, at most.
MAX_BUCKETS = 8
#: Decode steps between two looks for finished rows.
CHUNK_STEPS = 8
_OWN_KEYWORDS = ("max_new_tokens", "prefix", "on_error")
# The work of decoding, in copies of one cached position of one row (about 15 ns on a CPU core, a GPT-2 of hidden
# 256): a decode step's fixed cost and a prompt token's prefill (measured: 1.7 ms and 0.15 ms).
_STEP_COST = 110
_PREFILL_COST = 10


class RejectedRow(DataError):
    """A prompt that cannot be completed: ``offset`` is its index in the call's prompts."""

    def __init__(self, offset: int, reason: str):
        super().__init__(reason)
        self.offset, self.reason = offset, reason


@dataclass(frozen=True)
class GenerationOptions:
    """``method="generate"``'s keywords, checked, and what the driver probed of the model (see
    :func:`generation_options`): its cache's ``cache_layout`` when it can be decoded token by token, else
    ``undecodable``, why not; the family whose decode steps keep a buffer per layer, ``buffer_family``
    (:mod:`~sparktf.inference.kv_cache`), else ``no_buffers``, why not; ``shared_run``, the fewest tokens rows of a
    window must share beyond ``prefix`` for their run to be prefilled once (None: runs are not looked for)."""

    max_new_tokens: Optional[int] = None
    max_length: Optional[int] = None
    stop_token_ids: Any = "auto"
    strip_prompt: bool = False
    prefix: str = ""
    on_error: str = "raise"
    cache_layout: Optional[CacheLayout] = None
    undecodable: Optional[str] = None
    buffer_family: Optional[str] = None
    no_buffers: Optional[str] = None
    shared_run: Optional[int] = None


def generation_options(model: Any, options: Dict[str, Any]) -> GenerationOptions:
    """``options`` of ``method="generate"`` for ``model``, checked before any job, with the layout of ``model``'s
    cache probed (two tiny prefills, the only ones: the workers get the layout with the options).

    Raises
    ------
    ConfigurationError
        For a keyword neither sparktf nor ``model.generate`` takes, a value
        out of range, or ``max_new_tokens`` / ``prefix`` with a model that
        cannot decode token by token.
    """
    accepted = [name for name in inspect.signature(model.generate).parameters if name != "inputs"]
    unknown = sorted(set(options) - set(accepted) - set(_OWN_KEYWORDS))
    if unknown:
        raise ConfigurationError(
            f"method='generate' takes no keyword(s) {unknown}: sparktf takes {list(_OWN_KEYWORDS)} and "
            f"{type(model).__name__}.generate takes {accepted}")
    for name in set(options) - set(_OWN_KEYWORDS) - {"max_length", "stop_token_ids", "strip_prompt"}:
        raise ConfigurationError(f"method='generate' cannot pass {name}={options[name]!r} to generate: sparktf "
                                 "feeds each batch of prompts itself")
    checked = GenerationOptions(**options)
    for name in ("max_new_tokens", "max_length"):
        value = getattr(checked, name)
        if value is not None and (not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1):
            raise ConfigurationError(f"{name} must be a positive int, got {value!r}")
    if checked.on_error not in ("raise", "null"):
        raise ConfigurationError(f"on_error must be 'raise' or 'null', got {checked.on_error!r}")
    if not isinstance(checked.prefix, str):
        raise ConfigurationError(f"prefix must be a str, got {type(checked.prefix).__name__}")
    if getattr(model, "preprocessor", None) is None:
        raise ConfigurationError(f"method='generate' needs a {type(model).__name__} with its preprocessor: it "
                                 "tokenizes the prompts")
    layout, reason = probe_decoding(model)
    if reason is not None and (checked.max_new_tokens is not None or checked.prefix):
        raise ConfigurationError(f"max_new_tokens and prefix need a model sparktf can decode token by token; "
                                 f"this one cannot: {reason}")
    stops = stop_token_ids(model, checked.stop_token_ids)
    if padding_stops(model, stops):
        _LOG.warning("generate: stop token id %d is also %s's padding token, so, as lm.generate does (it reads the "
                     "padding after a prompt as that stop token), every completion is its prompt with no new token. "
                     "Pass stop_token_ids=None or ids without it to generate",
                     model.preprocessor.tokenizer.pad_token_id, type(model).__name__)
    family, no_buffers = buffer_family(model, layout) if layout is not None else (None, reason)
    return dataclasses.replace(checked, cache_layout=layout, undecodable=reason, buffer_family=family,
                               no_buffers=no_buffers, shared_run=MIN_SHARED_RUN if layout is not None else None)


def stop_token_ids(lm: Any, stop: Any) -> np.ndarray:
    """The token ids ``lm.generate(..., stop_token_ids=stop)`` stops at: ``"auto"`` is its preprocessor's end
    token (and second end token, Llama 3's), ``None`` none."""
    if isinstance(stop, str) and stop == "auto":
        tokenizer = lm.preprocessor.tokenizer
        stop = [tokenizer.end_token_id] + ([tokenizer.end_token2_id] if hasattr(tokenizer, "end_token2_id") else [])
    return np.array([] if stop is None else list(stop), dtype=np.int64)


def padding_stops(lm: Any, stops: np.ndarray) -> bool:
    """Whether a stop token of ``stops`` is ``lm``'s padding token, so that ``lm.generate`` makes no new token.

    Keras Hub's sampler stops once every row holds a stop token after its
    prompt, and reads the padding after a prompt as tokens held: with the
    padding's id among the stop tokens (a vocabulary whose end token is id 0,
    GPT-2's padding), ``generate`` gives back each prompt (cut to
    ``max_length``) without a new token.
    """
    padding = getattr(lm.preprocessor.tokenizer, "pad_token_id", None)
    return padding is not None and bool(np.isin(padding, stops))


def length_buckets(limit: int) -> List[int]:
    """The fixed lengths batches are padded to: ``limit`` and up to 7 shorter ones, each about 1.41x the next."""
    lengths = {int(math.ceil(limit / 2 ** (k / 2) / 8) * 8) for k in range(MAX_BUCKETS)}
    return sorted(min(length, limit) for length in lengths)


def grouped_batches(rows: Sequence[Tuple[int, int]], batch_size: int, buckets: Sequence[int],
                    row_costs: Tuple[float, float] = (1.0, 0.0)) -> List[Tuple[int, int]]:
    """Cut ``rows`` (``(prompt length, end)`` pairs sorted by length) into batches of at most ``batch_size``: the
    ``[start, stop)`` spans of least estimated work.

    A batch is prefilled up to its longest prompt, then decodes in lockstep
    from its shortest prompt to its furthest end; each step costs every
    active row ``row_costs[0]`` per position of the batch's length bucket
    (its cache copied or read) and ``row_costs[1]`` (its layers: the
    decoder's ``ROW_COSTS``), and pays a fixed cost. So a long prompt batched
    with short ones makes them all wait, and tiny batches pay the fixed cost
    often. The least total is found by dynamic programming
    (``O(n x batch_size)``).
    """
    per_position, per_row = row_costs
    size = max(1, int(batch_size))
    best = [0.0] + [math.inf] * len(rows)
    cut = [0] * (len(rows) + 1)
    for stop in range(1, len(rows) + 1):
        furthest, ends, longest = 0, 0, rows[stop - 1][0]
        for start in range(stop - 1, max(stop - size, 0) - 1, -1):  # the batch rows[start:stop], growing leftwards
            furthest, ends = max(furthest, rows[start][1]), ends + rows[start][1]
            count, first = stop - start, rows[start][0]
            length = next((bucket for bucket in buckets if bucket >= furthest), furthest)
            decode = (per_position * length + per_row) * (ends - count * first) + _STEP_COST * (furthest - first)
            cost = best[start] + decode + _PREFILL_COST * count * longest
            if cost < best[stop]:
                best[stop], cut[stop] = cost, start
    spans, stop = [], len(rows)
    while stop:
        spans.append((cut[stop], stop))
        stop = cut[stop]
    return spans[::-1]


def _sequence_limit(lm: Any) -> int:
    """The longest token sequence ``lm`` takes: its position embedding's, else its preprocessor's length."""
    limit = getattr(lm.backbone, "max_sequence_length", None)
    return int(limit) if limit else int(lm.preprocessor.sequence_length)


@dataclass
class _Row:
    """One prompt being completed: its tokens (the prefix's first), where its prompt ends and where it must stop."""

    offset: int
    token_ids: np.ndarray  # the prompt's; once finished, the prompt's and the new ones
    length: int  # the prompt's tokens
    shown_from: int  # the first token of the completion's text: after the prefix, or after the prompt
    end: int
    group: int = -1  # the group of rows sharing a leading run it is in (see SharedRuns), if any


class GenerationEngine:
    """Completes windows of prompts with ``lm`` (one per Python worker, model and options; see the module docstring)."""

    def __init__(self, lm: Any, options: GenerationOptions):
        """``options`` as :func:`generation_options` made them (its probe of ``lm``'s cache: none here)."""
        self.lm, self.options = lm, options
        self.limit = _sequence_limit(lm)
        self.buckets = length_buckets(self.limit)
        preprocessor = lm.preprocessor
        self.stop_token_ids = stop_token_ids(lm, options.stop_token_ids)
        # generate's max_length defaults to the preprocessor's sequence length (prompts cut to it) unless
        # max_new_tokens is given
        self.max_length = options.max_length if options.max_length is not None or options.max_new_tokens is not None \
            else int(preprocessor.sequence_length)
        self._stops_at_once = padding_stops(lm, self.stop_token_ids)
        self._start_token = bool(getattr(preprocessor, "add_start_token", False))
        self.decoder = None if options.cache_layout is None else \
            LayerBufferDecoder(lm, options.cache_layout, options.buffer_family) if options.buffer_family else \
            Decoder(lm, options.cache_layout)
        if self.decoder is None:
            _LOG.warning("generating with %s.generate on sorted batches: %s", type(lm).__name__, options.undecodable)
        elif not options.buffer_family:
            _LOG.info("decoding %s with call_with_cache, which copies the cache at each step: %s", type(lm).__name__,
                      options.no_buffers)
        self.prefix_ids = self._tokens([options.prefix])[0] if options.prefix else None
        self._prefix_cache = None
        self.totals = GenerationTotals()  # what this engine completed so far (see timed_window)
        if self.prefix_ids is not None and self.decoder is not None:
            self._prefix_cache = self.decoder.prefix_cache(self.prefix_ids[None, :])

    @property
    def compiles(self) -> int:
        """The functions this worker traced for generation (prefill and decode: 2, 3 with a prefix)."""
        return self.decoder.traces if self.decoder is not None else 0

    # ------------------------------------------------------------------ the window

    def complete(self, prompts: Sequence[str], batch_size: int) -> Tuple[List[Optional[str]], "GenerationTotals"]:
        """The completions of ``prompts`` in order (None for a row ``on_error="null"`` skips) and the window's figures
        (its ``seconds`` not set).

        Batches of at most ``batch_size`` rows of similar length go through the model (see
        :func:`grouped_batches`).

        Raises
        ------
        RejectedRow
            With ``on_error="raise"``, for the first prompt that cannot be completed.
        """
        rows, rejected = self._rows(prompts)
        if rejected and self.options.on_error == "raise":
            offset, reason = rejected[0]
            raise RejectedRow(offset, reason)
        completions: List[Optional[str]] = [None] * len(prompts)
        window = GenerationTotals(prompts=len(prompts), nulls=len(rejected))
        runs = self._shared_runs(rows)
        runs_cache = self.decoder.prefix_cache(runs.token_ids, self._prefix_cache) if runs else None
        if runs:
            window.prefill_possible = runs.possible()
            window.prefill_saved = -int((runs.runs - runs.known).sum())  # the runs' own prefill
        for start, stop in self._batches(rows, batch_size):
            batch = rows[start:stop]
            if self.decoder is None:
                self._generate(batch)
            else:
                groups = [row.group for row in batch]
                run = runs.batch_start(groups) if runs else 0
                if run:
                    window.prefill_saved += len(batch) * (run - runs.known)
                self._decode(batch, self.decoder.prefix_rows(runs_cache, groups, run) if run else self._prefix_cache)
            texts = self._texts([row.token_ids[row.shown_from:] for row in batch])
            for row, text in zip(batch, texts):
                completions[row.offset] = text
            window.new_tokens += sum(len(row.token_ids) - row.length for row in batch)
        if rejected:
            _LOG.warning("generate: %d of %d prompts got a null completion (on_error='null'), the first: %s",
                         len(rejected), len(prompts), rejected[0][1])
        return completions, window

    def _shared_runs(self, rows: List["_Row"]) -> Optional[SharedRuns]:
        """The groups of ``rows`` sharing a leading run (each row's ``group`` set), if worth prefilling apart: the
        prefill saved must outweigh the decode steps of one more batch."""
        if self.decoder is None or self.options.shared_run is None or not rows:
            return None
        known = len(self.prefix_ids) if self.prefix_ids is not None else 0
        runs = SharedRuns.find([row.token_ids for row in rows], self.options.shared_run, known)
        if not runs or runs.possible() * _PREFILL_COST < _STEP_COST * max(row.end - row.length for row in rows):
            return None
        for row, group in zip(rows, runs.groups):
            row.group = int(group)
        return runs

    def _batches(self, rows: List["_Row"], batch_size: int) -> List[Tuple[int, int]]:
        """Sorts ``rows`` (those in a group of a shared run last, each part by length) and cuts each part into
        batches (:func:`grouped_batches`): their ``[start, stop)`` spans."""
        rows.sort(key=lambda row: (row.group >= 0, row.length, row.end))
        first_grouped = sum(row.group < 0 for row in rows)
        spans = []
        for first, last in ((0, first_grouped), (first_grouped, len(rows))):
            spans += [(first + start, first + stop) for start, stop in
                      grouped_batches([(row.length, row.end) for row in rows[first:last]], batch_size, self.buckets,
                                      (self.decoder or Decoder).ROW_COSTS)]
        return spans

    def _rows(self, prompts: Sequence[str]) -> Tuple[List["_Row"], List[Tuple[int, str]]]:
        """The rows to complete and, for the others, ``(offset, reason)``."""
        options, rows, rejected = self.options, [], []
        prefix = self.prefix_ids if self.prefix_ids is not None else np.zeros(0, np.int64)
        for offset, tokens in enumerate(self._tokens(prompts)):
            if len(prefix):
                tokens = tokens[1:] if self._start_token else tokens
            length = len(prefix) + len(tokens)
            if self.max_length is not None and length > self.max_length:
                length = self.max_length  # as generate: the prompt cut to max_length, nothing new
            end = length + options.max_new_tokens if options.max_new_tokens is not None else self.max_length
            if self.max_length is not None:
                end = min(end, self.max_length)
            end = length if self._stops_at_once else max(end, length)
            if end > self.limit or (self.max_length is None and len(tokens) > self.limit):
                counted = f"more than {self.limit}" if len(tokens) > self.limit else str(length)
                advice = ("Shorten it or lower max_new_tokens" if options.on_error == "null" else
                          "Shorten it, lower max_new_tokens, or pass on_error='null' to give such rows a null "
                          "completion")
                rejected.append((offset, f"the prompt has {counted} tokens (the start token and prefix included) and "
                                 f"{max(end - length, 0)} new tokens are wanted: longer than the model's sequence "
                                 f"length {self.limit}. {advice}"))
                continue
            token_ids = np.concatenate([prefix, tokens]).astype(np.int64)[:length]
            shown = length if options.strip_prompt else len(prefix)
            rows.append(_Row(offset, token_ids, length, shown, end))
        return rows, rejected

    def _tokens(self, texts: Sequence[str]) -> List[np.ndarray]:
        """Each text's token ids as ``generate`` starts them (the start token first), up to ``limit + 1`` of them."""
        packed = self.lm.preprocessor.generate_preprocess(list(texts), sequence_length=self.limit + 1)
        token_ids = np.asarray(packed["token_ids"])
        lengths = np.asarray(packed["padding_mask"]).sum(axis=1)
        return [token_ids[i, :lengths[i]] for i in range(len(texts))]

    def _padded(self, batch: Sequence["_Row"], bucketed: bool = True) -> Tuple[np.ndarray, np.ndarray]:
        """The batch's tokens and prompt mask, padded to its length bucket (or to its longest row's end)."""
        need = max(row.end for row in batch)
        length = next(bucket for bucket in self.buckets if bucket >= need) if bucketed else need
        token_ids = np.zeros((len(batch), length), np.int32)
        mask = np.zeros((len(batch), length), bool)
        for i, row in enumerate(batch):
            token_ids[i, :len(row.token_ids)] = row.token_ids
            mask[i, :len(row.token_ids)] = True
        return token_ids, mask

    # ------------------------------------------------------------------ decoding

    def _decode(self, batch: List["_Row"], prefix: Any) -> None:
        """Decode ``batch`` chunk by chunk after ``prefix``'s cache (see :meth:`Decoder.prefill`), dropping its
        finished rows; sets each row's tokens."""
        import tensorflow as tf

        token_ids, mask = self._padded(batch)
        prompt_lengths = mask.sum(axis=1)
        cache = self.decoder.prefill(token_ids, int(prompt_lengths.max()), prefix)
        tokens, mask_t = tf.constant(token_ids), tf.constant(mask)
        active = list(range(len(batch)))
        index = int(prompt_lengths.min())
        while active:
            furthest = max(batch[i].end for i in active)
            steps = min(CHUNK_STEPS, furthest - index)
            if steps > 0:
                tokens, cache = self.decoder.decode(tokens, cache, index, mask_t, steps)
                index += steps
            values = tokens.numpy()
            still = []
            for position, i in enumerate(active):
                if not self._finish(batch[i], values[position], index):
                    still.append(position)
            if len(still) < len(active):
                tokens, cache, mask_t = Decoder.keep(still, tokens, cache, mask_t)
                active = [active[position] for position in still]

    def _finish(self, row: "_Row", values: np.ndarray, index: int) -> bool:
        """Whether ``row`` is done at ``index`` (its ``end`` reached or a stop token made); if so, keep its tokens."""
        made = values[row.length:min(index, row.end)]
        stops = np.flatnonzero(np.isin(made, self.stop_token_ids)) if len(self.stop_token_ids) else ()
        if len(stops):
            row.token_ids = values[:row.length + stops[0] + 1].astype(np.int64)
            return True
        if index >= row.end:
            row.token_ids = values[:row.end].astype(np.int64)
            return True
        return False

    def _generate(self, batch: List["_Row"]) -> None:
        """``lm.generate``'s function on the batch (a model the decoder cannot drive); sets each row's tokens.

        The batch is padded to its longest row's end, not to a bucket: a beam search ranks whole sequences, so
        what it picks depends on their length."""
        token_ids, mask = self._padded(batch, bucketed=False)
        stop = list(self.stop_token_ids) if len(self.stop_token_ids) else None
        output = self.lm.make_generate_function()({"token_ids": token_ids, "padding_mask": mask}, stop_token_ids=stop)
        values = np.asarray(output["token_ids"])
        for row, row_values in zip(batch, values):
            self._finish(row, row_values, row.end)

    def _texts(self, token_lists: Sequence[np.ndarray]) -> List[str]:
        """The text of each token list, as ``generate``'s postprocessing makes it (special tokens dropped)."""
        width = max(len(tokens) for tokens in token_lists)
        token_ids = np.zeros((len(token_lists), max(width, 1)), np.int32)
        mask = np.zeros(token_ids.shape, bool)
        for i, tokens in enumerate(token_lists):
            token_ids[i, :len(tokens)] = tokens
            mask[i, :len(tokens)] = True
        texts = self.lm.preprocessor.generate_postprocess({"token_ids": token_ids, "padding_mask": mask})
        return [value.decode("utf-8") if isinstance(value, bytes) else str(value)
                for value in np.asarray(texts, dtype=object).reshape(-1)]


@dataclass
class GenerationTotals:
    """What one engine (a worker's, for one model and options) completed so far: the job's share of this worker
    while its tasks run. ``prefill_saved`` counts the prompt tokens not prefilled thanks to leading runs rows
    shared (less the runs' own prefill), ``prefill_possible`` what the runs found could save at most."""

    prompts: int = 0
    nulls: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    prefill_saved: int = 0
    prefill_possible: int = 0

    def add(self, other: "GenerationTotals") -> None:
        """Count ``other`` (a window's figures) in."""
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def __str__(self) -> str:
        seconds = max(self.seconds, 1e-9)
        shared = (f", prefill of {self.prefill_saved} prompt tokens saved by shared runs (of "
                  f"{self.prefill_possible} possible)" if self.prefill_possible else "")
        return (f"{self.prompts} prompts ({self.nulls} null), {self.new_tokens} new tokens in {self.seconds:.2f} s "
                f"({self.prompts / seconds:.1f} prompts/s, {self.new_tokens / seconds:.1f} new tokens/s){shared}")


def timed_window(engine: GenerationEngine, prompts: Sequence[str], batch_size: int) -> List[Optional[str]]:
    """``engine.complete(prompts, batch_size)``, logging (INFO) the window's prompts/s, new tokens/s, nulls and prefill
    saved by shared runs, the worker's totals with this engine so far (``engine.totals``) and its compiles."""
    started = time.perf_counter()
    completions, window = engine.complete(prompts, batch_size)
    window.seconds = time.perf_counter() - started
    engine.totals.add(window)
    _LOG.info("generated %s; this worker so far: %s; %d compiles on this worker", window, engine.totals,
              engine.compiles)
    return completions
