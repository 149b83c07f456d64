"""``DynamicEmbedding``: an embedding table that gives rows to the ids it sees, up to a capacity, and a small hashed
fallback table to the rest; and ``DynamicEmbeddingEviction``, the callback that frees rows between epochs of
``model.fit``."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import keras
import numpy as np
import tensorflow as tf

from sparktf.errors import ConfigurationError
from sparktf.layers.sketch import FALLBACK_SALT, SKETCH_DEPTH, bucket, sketch_add, sketch_estimate, sketch_width
from sparktf.layers.slots import native_variable, reset_slot_rows

__all__ = ["DynamicEmbedding", "DynamicEmbeddingEviction", "dynamic_embeddings", "table_stats"]

_INT64_MAX = 2 ** 63 - 1


def _configuration_error(argument: str, expected: str, value: Any, advice: str) -> ConfigurationError:
    return ConfigurationError(f"DynamicEmbedding: {argument} must be {expected}, got {value!r} "
                              f"({type(value).__name__}); {advice}")


def _check_count(argument: str, value: Any, advice: str) -> int:
    """``value`` if it is an int >= 1 (not a bool), else a ConfigurationError naming ``argument``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise _configuration_error(argument, "an int >= 1", value, advice)
    return int(value)


def _check_evict(evict: Any) -> Optional[Dict[str, Any]]:
    """The eviction policy, checked: None, ``{"ttl_steps": int >= 1}`` or ``{"lfu": float in (0, 1)}``."""
    expected = 'None, {"ttl_steps": N} with an int N >= 1 or {"lfu": decay} with 0 < decay < 1'
    advice = 'pass e.g. evict={"ttl_steps": 1000} or evict={"lfu": 0.5}, or evict=None to keep every row'
    if evict is None:
        return None
    if not isinstance(evict, dict) or len(evict) != 1 or next(iter(evict)) not in ("ttl_steps", "lfu"):
        raise _configuration_error("evict", expected, evict, advice)
    (policy, value), = evict.items()
    if policy == "ttl_steps":
        return {"ttl_steps": _check_count("evict['ttl_steps']", value, advice)}
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not 0 < value < 1:
        raise _configuration_error("evict['lfu']", "a float with 0 < decay < 1", value, advice)
    return {"lfu": float(value)}


def _fallback_initializer(initializer: keras.initializers.Initializer) -> keras.initializers.Initializer:
    """The fallback table's initializer: the table's with the next seed. A random initializer's draws of two shapes
    with one int seed share their first values: with one initializer, fallback bin ``r`` would start equal to row
    ``r``. An unseeded Keras initializer made its int seed when constructed, so this draws no random number (a model
    built after ``keras.utils.set_random_seed`` gets the same seeds as with ``keras.layers.Embedding``)."""
    seed = getattr(initializer, "seed", None)
    if not isinstance(seed, int):  # not random (zeros, constant), or a SeedGenerator's draws that differ anyway
        return initializer
    return type(initializer).from_config({**initializer.get_config(), "seed": seed + 1})


@keras.saving.register_keras_serializable(package="sparktf")
class DynamicEmbedding(keras.layers.Layer):
    """An embedding table whose rows go to the ids it sees, up to ``capacity`` rows, with a hashed fallback table.

    The layer takes ids of any value (int32, int64 or string; any shape,
    e.g. ``[batch]`` or ``[batch, k]``) and returns their vectors
    (``[..., output_dim]``). An id gets a row of its own after
    ``admit_after`` sightings in training, while fewer than ``capacity``
    rows are in use; until then, and when the table is full, it reads one
    of ``fallback_bins`` shared rows of a small trainable fallback table,
    picked by a hash of the id. String ids are first fingerprinted to int64
    (``tf.strings.to_hash_bucket_fast(ids, 2**63 - 1)``): :meth:`keys` of a
    string layer returns those fingerprints.

    In training (``training=True``) with :attr:`admits_in_call` True (the
    default), each call first passes its ids to :meth:`observe`, so with
    ``admit_after=1`` a new id reads its own row in the step that first sees
    it. Inference only looks up and changes nothing. With
    ``admit_after=1``, no eviction and the capacity not reached, training
    equals a ``keras.layers.Embedding(capacity, output_dim)`` fed each id's
    first-seen index: same initial rows, same sparse gradients (only the
    rows read), same optimizer slots.

    Admission with ``admit_after > 1`` counts the sightings of ids not yet
    held in a count-min sketch (variable ``sketch``, ``[4, width]`` int32,
    ``width`` the power of two ``>= max(1024, 8 * capacity)``): memory
    ``4 * width * 4`` bytes whatever the number of distinct ids; an id's
    count is never under-estimated and over-estimated by at most
    ``e * N / width`` (``N`` the sightings counted) with probability
    ``1 - e**-4``; every counter is halved at each :meth:`evict` (TinyLFU's
    aging, with any ``evict`` policy, ``None`` too), so old sightings fade.
    The counters are int32: a layer never evicted wraps a counter after
    2**31 sightings hashed to it.

    Eviction (``evict``) runs between steps, never inside one, by
    :meth:`evict` (the :class:`DynamicEmbeddingEviction` callback calls it at
    each epoch end of ``model.fit``):

    * ``{"ttl_steps": N}`` frees the rows whose id was not seen in the last
      ``N`` training steps (``step - last_seen > N``);
    * ``{"lfu": decay}`` multiplies every used row's score (its sightings)
      by ``decay``, then frees the ``k`` lowest-scored rows (ties: the lower
      row first), ``k = min(refused_full since the last eviction, rows in
      use)``: as many rows as admissions were refused for want of room.

    A freed row is redrawn from ``embeddings_initializer`` (row ``r`` of the
    full ``[capacity, output_dim]`` draw: with a seeded initializer, the
    value row ``r`` started with; the draw holds a table's worth of memory
    while :meth:`evict` runs) and its optimizer slots are reset.

    ``step`` counts :meth:`observe` calls (a model calling the layer twice
    in a step counts two); ``refused_full`` counts an id once per call in
    which the table had no room for it.

    All state is variables of the layer (``model.get_weights()``,
    ``model.save`` and checkpoints carry it): trainable ``embeddings``
    ``[capacity, output_dim]`` and ``fallback`` ``[fallback_bins,
    output_dim]``; non-trainable ``row_keys``, ``row_used``,
    ``sorted_keys``, ``sorted_rows`` (the used rows' keys ascending, padded
    at the end, and their rows), ``size``, ``last_seen``, ``score``,
    ``step``, the counters ``fallback_reads``, ``refused_full``,
    ``evicted``, ``refused_at_eviction`` (``refused_full`` at the last
    eviction), and ``sketch`` when ``admit_after > 1``.

    Parameters
    ----------
    output_dim : int
        The size of each vector.
    capacity : int
        The most rows of its own the table holds.
    admit_after : int
        The sightings (in training) after which an id gets a row of its own.
    evict : dict or None
        None (rows are never freed), ``{"ttl_steps": N}`` or ``{"lfu": decay}``.
    fallback_bins : int
        The rows of the fallback table.
    embeddings_initializer : str or keras.initializers.Initializer
        The initializer of the table, as ``keras.layers.Embedding``'s; the
        fallback table's is the same with the next seed.
    name : str or None
        The layer's name.
    **kwargs
        The arguments of :class:`keras.layers.Layer`.

    Raises
    ------
    sparktf.errors.ConfigurationError
        An argument of the wrong type or out of range.

    Attributes
    ----------
    admits_in_call : bool
        Whether a training call observes its own ids (True). A trainer
        that observes the global batch's ids itself, on every rank before
        each step (as sparktf's distributed trainer is to), sets it False;
        training calls then only look up.
    """

    def __init__(self, output_dim: int, capacity: int, admit_after: int = 1, evict: Optional[Dict[str, Any]] = None,
                 fallback_bins: int = 1024, embeddings_initializer: Any = "uniform", name: Optional[str] = None,
                 **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        self.output_dim = _check_count("output_dim", output_dim, "pass the size of each vector, e.g. output_dim=16")
        self.capacity = _check_count("capacity", capacity, "pass the most rows of its own the table may hold")
        self.admit_after = _check_count("admit_after", admit_after,
                                        "pass the sightings after which an id gets a row (1: at once)")
        self.eviction = _check_evict(evict)
        self.fallback_bins = _check_count("fallback_bins", fallback_bins,
                                          "pass the rows of the shared fallback table, e.g. 1024")
        try:
            self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        except (ValueError, TypeError) as error:
            raise _configuration_error("embeddings_initializer", "a Keras initializer or its name",
                                       embeddings_initializer, f"pass e.g. 'uniform' ({error})") from None
        self.admits_in_call = True
        self.supports_jit = False  # tf.unique, searchsorted and data-dependent shapes: no XLA

    def build(self, input_shape: Any = None) -> None:
        """Create the tables and the state variables."""
        capacity, dim = self.capacity, self.output_dim
        self.embeddings = self.add_weight(shape=(capacity, dim), initializer=self.embeddings_initializer,
                                          name="embeddings", trainable=True)
        self.fallback = self.add_weight(shape=(self.fallback_bins, dim), name="fallback", trainable=True,
                                        initializer=_fallback_initializer(self.embeddings_initializer))

        def state(name: str, shape: tuple, dtype: str) -> keras.Variable:
            return self.add_weight(shape=shape, initializer="zeros", dtype=dtype, name=name, trainable=False,
                                   autocast=False)

        self.row_keys = state("row_keys", (capacity,), "int64")
        self.row_used = state("row_used", (capacity,), "int32")
        self.sorted_keys = state("sorted_keys", (capacity,), "int64")
        self.sorted_rows = state("sorted_rows", (capacity,), "int32")
        self.size = state("size", (), "int32")
        self.last_seen = state("last_seen", (capacity,), "int64")
        self.score = state("score", (capacity,), "float32")
        self.step = state("step", (), "int64")
        self.fallback_reads = state("fallback_reads", (), "int64")
        self.refused_full = state("refused_full", (), "int64")
        self.evicted = state("evicted", (), "int64")
        self.refused_at_eviction = state("refused_at_eviction", (), "int64")
        self.sketch = None
        if self.admit_after > 1:
            self.sketch = state("sketch", (SKETCH_DEPTH, sketch_width(capacity)), "int32")
        self.built = True

    def keys_of(self, ids: Any) -> tf.Tensor:
        """``ids`` as the table's int64 keys, flattened: integers cast, strings fingerprinted.

        Raises
        ------
        sparktf.errors.ConfigurationError
            The ids are neither integers nor strings.
        """
        ids = tf.convert_to_tensor(ids)
        if ids.dtype == tf.string:
            keys = tf.strings.to_hash_bucket_fast(ids, _INT64_MAX)
        elif ids.dtype.is_integer:
            keys = tf.cast(ids, tf.int64)
        else:
            raise ConfigurationError(f"DynamicEmbedding {self.name!r}: ids must be integers or strings, got dtype "
                                     f"{ids.dtype.name}; give the model's input dtype='int64' (or 'string')")
        return tf.reshape(keys, [-1])

    def _find(self, keys: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        """``(found, rows)`` of the 1-D int64 ``keys``: whether each holds a row, and that row (meaningless when
        not found)."""
        size = tf.convert_to_tensor(self.size)
        positions = tf.searchsorted(self.sorted_keys[:size], keys)
        clamped = tf.minimum(positions, self.capacity - 1)
        found = (positions < size) & tf.equal(tf.gather(self.sorted_keys, clamped), keys)
        return found, tf.gather(self.sorted_rows, clamped)

    def _rebuild_sorted(self) -> None:
        """Rebuild ``sorted_keys``/``sorted_rows`` from ``row_keys``/``row_used``."""
        used_rows = tf.cast(tf.where(tf.convert_to_tensor(self.row_used) > 0)[:, 0], tf.int32)
        keys = tf.gather(self.row_keys, used_rows)
        order = tf.argsort(keys, stable=True)
        padding = [self.capacity - tf.size(used_rows)]
        self.sorted_keys.assign(tf.concat([tf.gather(keys, order), tf.fill(padding, tf.constant(_INT64_MAX))], 0))
        self.sorted_rows.assign(tf.concat([tf.gather(used_rows, order), tf.zeros(padding, tf.int32)], 0))

    def _set_rows(self, rows: tf.Tensor, **values: Any) -> None:
        """Scatter one value per state variable (``row_used=1``, ...) into the rows ``rows``."""
        for name, value in values.items():
            variable = getattr(self, name)
            filled = tf.fill(tf.shape(rows), tf.cast(value, variable.dtype))
            native_variable(variable).scatter_update(tf.IndexedSlices(filled, rows))

    def _admit(self, keys: tf.Tensor) -> None:
        """Give the 1-D ``keys`` (not held, at most the free rows) the lowest free rows, in order."""
        rows = tf.cast(tf.where(tf.convert_to_tensor(self.row_used) == 0)[: tf.size(keys), 0], tf.int32)
        native_variable(self.row_keys).scatter_update(tf.IndexedSlices(keys, rows))
        self._set_rows(rows, row_used=1, score=0)
        self.size.assign_add(tf.size(keys))
        self._rebuild_sorted()

    def observe(self, ids: Any) -> None:
        """Count a training step's ids: admit those that reached ``admit_after`` sightings, mark the held ones seen.

        Increments ``step``; adds the sightings of the ids not held to the
        sketch (``admit_after > 1``); admits the not-held ids whose sightings
        reach ``admit_after``, in first-seen order, into the lowest free rows
        (the ones beyond the free rows are counted in ``refused_full`` and
        stay on the fallback table); then sets ``last_seen`` to ``step`` and
        adds the batch's sightings to ``score`` for every held id of the
        batch. Deterministic: the same calls on two copies of the layer give
        identical state. Usable eagerly and inside ``tf.function``.

        Parameters
        ----------
        ids : array-like or tf.Tensor
            The ids of one step, any shape (int or string).
        """
        if not self.built:
            self.build()
        unique, _, counts = tf.unique_with_counts(self.keys_of(ids))
        self.step.assign_add(1)
        held, _ = self._find(unique)
        newcomers, sightings = tf.boolean_mask(unique, ~held), tf.boolean_mask(counts, ~held)
        if self.sketch is not None:
            sketch_add(native_variable(self.sketch), newcomers, sightings)
            sightings = sketch_estimate(native_variable(self.sketch), newcomers)
        ready = tf.boolean_mask(newcomers, sightings >= self.admit_after)
        admitted = tf.minimum(tf.size(ready), self.capacity - tf.convert_to_tensor(self.size))
        self.refused_full.assign_add(tf.cast(tf.size(ready) - admitted, tf.int64))
        tf.cond(admitted > 0, lambda: self._admit(ready[:admitted]), lambda: None)
        held, rows = self._find(unique)
        rows = tf.boolean_mask(rows, held)
        self._set_rows(rows, last_seen=tf.convert_to_tensor(self.step))
        native_variable(self.score).scatter_add(tf.IndexedSlices(tf.cast(tf.boolean_mask(counts, held),
                                                                         tf.float32), rows))

    def call(self, ids: Any, training: Optional[bool] = None) -> tf.Tensor:
        """The vectors of ``ids`` (``ids.shape + [output_dim]``); in training, observes the ids first (see
        :attr:`admits_in_call`) and counts the lookups served by the fallback table."""
        ids = tf.convert_to_tensor(ids)
        keys = self.keys_of(ids)
        if training and self.admits_in_call:
            self.observe(keys)
        found, rows = self._find(keys)
        own, shared = tf.where(found)[:, 0], tf.where(~found)[:, 0]
        bins = bucket(tf.gather(keys, shared), FALLBACK_SALT, self.fallback_bins)
        vectors = tf.dynamic_stitch(
            [tf.cast(own, tf.int32), tf.cast(shared, tf.int32)],
            [tf.gather(self.embeddings.value, tf.gather(rows, own)), tf.gather(self.fallback.value, bins)])
        if training:
            self.fallback_reads.assign_add(tf.size(shared, out_type=tf.int64))
        shape = tf.concat([tf.shape(ids), [self.output_dim]], axis=0)
        return tf.cast(tf.reshape(vectors, shape), self.compute_dtype)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        """``input_shape + (output_dim,)``."""
        return tuple(input_shape) + (self.output_dim,)

    def evict(self, optimizer: Optional[keras.optimizers.Optimizer] = None) -> int:
        """Free rows by the ``evict`` policy; call it between steps (eagerly), never inside one.

        Halves the sketch's counters (``admit_after > 1``, whatever the
        policy, ``None`` too), then frees the
        rows the policy picks (see the class docstring): each is marked free,
        its key leaves ``sorted_keys``, its ``embeddings`` row is redrawn
        from the initializer and, with ``optimizer``, its slots in the
        optimizer are reset to their initial values.

        Parameters
        ----------
        optimizer : keras.optimizers.Optimizer or None
            The optimizer training the layer (``model.optimizer``), whose
            slots of the freed rows are reset.

        Returns
        -------
        int
            The rows freed (0 with ``evict=None``).
        """
        if not self.built:
            return 0
        if self.sketch is not None:
            self.sketch.assign(self.sketch // 2)
        if self.eviction is None:
            return 0
        used = tf.where(tf.convert_to_tensor(self.row_used) > 0)[:, 0]
        if "ttl_steps" in self.eviction:
            idle = tf.convert_to_tensor(self.step) - tf.gather(self.last_seen, used)
            rows = tf.boolean_mask(used, idle > self.eviction["ttl_steps"])
        else:
            self.score.assign(tf.where(tf.convert_to_tensor(self.row_used) > 0, self.score * self.eviction["lfu"],
                                       self.score))
            waiting = int(self.refused_full.numpy() - self.refused_at_eviction.numpy())
            self.refused_at_eviction.assign(self.refused_full)
            lowest = tf.argsort(tf.gather(self.score, used), stable=True)[:min(waiting, int(self.size.numpy()))]
            rows = tf.gather(used, lowest)
        return self._free(tf.cast(rows, tf.int32), optimizer)

    def _free(self, rows: tf.Tensor, optimizer: Optional[keras.optimizers.Optimizer]) -> int:
        """Free ``rows`` (1-D int32, used): fresh initializer rows, reset state and optimizer slots."""
        freed = int(tf.size(rows))
        if freed == 0:
            return 0
        fresh = self.embeddings_initializer(shape=(self.capacity, self.output_dim), dtype=self.embeddings.dtype)
        native_variable(self.embeddings).scatter_update(tf.IndexedSlices(tf.gather(fresh, rows), rows))
        self._set_rows(rows, row_used=0, row_keys=0, last_seen=0, score=0)
        self.size.assign_sub(freed)
        self.evicted.assign_add(freed)
        self._rebuild_sorted()
        if optimizer is not None:
            reset_slot_rows(optimizer, self.embeddings, rows)
        return freed

    def keys(self) -> np.ndarray:
        """The ids holding rows of their own, ascending (int64; a string layer's are the strings' fingerprints,
        ``tf.strings.to_hash_bucket_fast(ids, 2**63 - 1)``)."""
        return self.sorted_keys.numpy()[: int(self.size.numpy())].copy() if self.built else np.zeros(0, np.int64)

    def stats(self) -> Dict[str, int]:
        """``rows`` (in use), ``capacity``, ``fallback_reads``, ``refused_full``, ``evicted``, ``step``, as ints."""
        if not self.built:
            return {"rows": 0, "capacity": self.capacity, "fallback_reads": 0, "refused_full": 0, "evicted": 0,
                    "step": 0}
        return {"rows": int(self.size.numpy()), "capacity": self.capacity,
                "fallback_reads": int(self.fallback_reads.numpy()), "refused_full": int(self.refused_full.numpy()),
                "evicted": int(self.evicted.numpy()), "step": int(self.step.numpy())}

    def get_config(self) -> Dict[str, Any]:
        """The constructor's arguments."""
        config = super().get_config()
        config.update({"output_dim": self.output_dim, "capacity": self.capacity, "admit_after": self.admit_after,
                       "evict": self.eviction, "fallback_bins": self.fallback_bins,
                       "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer)})
        return config


def dynamic_embeddings(model: keras.layers.Layer) -> List[DynamicEmbedding]:
    """Every :class:`DynamicEmbedding` in ``model``, nested ones too (``model`` itself included)."""
    return [layer for layer in model._flatten_layers() if isinstance(layer, DynamicEmbedding)]


def table_stats(model: keras.layers.Layer) -> Dict[str, Dict[str, int]]:
    """:meth:`DynamicEmbedding.stats` of every dynamic table of ``model``, by layer name (empty: none)."""
    return {layer.name: layer.stats() for layer in dynamic_embeddings(model)}


class DynamicEmbeddingEviction(keras.callbacks.Callback):
    """At each epoch end of ``model.fit``, :meth:`DynamicEmbedding.evict` every ``DynamicEmbedding`` of the model
    (nested ones too) with ``model.optimizer``; the rows freed are added to the epoch's logs as
    ``evicted_rows``."""

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        """Evict in every ``DynamicEmbedding`` of the model."""
        freed = sum(layer.evict(self.model.optimizer) for layer in dynamic_embeddings(self.model))
        if logs is not None:
            logs["evicted_rows"] = freed
