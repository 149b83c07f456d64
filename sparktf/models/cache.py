"""The per-process cache of loaded models (Keras payloads, SavedModels, TFNet graphs, sharded tables' working models).

A Python worker keeps the models its tasks loaded, keyed by content hash, so
later tasks and jobs with the same model skip the load (a small LRU; the
``models`` entry of :mod:`sparktf.process_state`). What a task derives from a
model (its traced training step, traced batch maps, generation engine,
prediction runner) is kept on the model's own entry (:func:`derived`): the
slots count models, and a model's derived objects leave with it.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Dict, Optional, TypeVar, Union

from sparktf.models.payload import ModelPayload, payload_key
from sparktf.process_state import process_cache

__all__ = ["ModelCache", "ModelEntry", "cached", "derived", "load_cached", "batch_mapper", "load_count",
           "DEFAULT_CACHE_ENTRIES"]

DEFAULT_CACHE_ENTRIES = 4

T = TypeVar("T")


class ModelEntry:
    """One loaded model and the objects derived from it, by name (made once per entry).

    Parameters
    ----------
    model : object
        The loaded model.
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self._derived: Dict[str, Any] = {}

    def derived(self, name: str, make: Callable[[Any], T]) -> T:
        """The object ``name`` of this model, made by ``make(model)`` the first time it is asked for."""
        if name not in self._derived:
            self._derived[name] = make(self.model)
        return self._derived[name]


class ModelCache:
    """A thread-safe LRU of loaded models keyed by content hash, each with its derived objects.

    Parameters
    ----------
    max_entries : int
        How many models a process keeps; the least recently used is dropped with its derived objects.
    """

    def __init__(self, max_entries: int = DEFAULT_CACHE_ENTRIES) -> None:
        self.max_entries = max_entries
        self.loads = 0
        self._entries: "collections.OrderedDict[str, ModelEntry]" = collections.OrderedDict()
        self._lock = threading.RLock()  # a loader may load another entry

    def get_or_load(self, key: str, loader: Callable[[], Any]) -> Any:
        """Return the cached model for ``key``, calling ``loader()`` on a miss."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key].model
            model = loader()
            self.loads += 1
            self._entries[key] = ModelEntry(model)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            return model

    def derived(self, model: Any, name: str, make: Callable[[Any], T]) -> T:
        """The object ``name`` derived from the cached ``model`` by ``make(model)``, kept on the model's entry
        (made once while it is cached); made afresh, and not kept, for a model the cache does not hold."""
        with self._lock:
            for key, entry in self._entries.items():
                if entry.model is model:
                    self._entries.move_to_end(key)
                    return entry.derived(name, make)
        return make(model)

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()


def _cache() -> ModelCache:
    return process_cache("models", ModelCache)


def cached(key: str, loader: Callable[[], Any]) -> Any:
    """Return this process's cached model for ``key``, loading it on a miss.

    Shared by every model kind (Keras payloads, SavedModels, graphs) so that
    :func:`load_count` counts them all.
    """
    return _cache().get_or_load(key, loader)


def derived(model: Any, name: str, make: Callable[[Any], T]) -> T:
    """This process's object ``name`` derived from a cached ``model`` (see :meth:`ModelCache.derived`)."""
    return _cache().derived(model, name, make)


def load_cached(source: Union["ModelPayload", bytes, Any], key: Optional[str] = None) -> Any:
    """Return the model for ``source``, built at most once per process.

    Parameters
    ----------
    source : ModelPayload, bytes or pyspark.Broadcast
        A payload, its ``to_bytes()``, or a broadcast variable holding those
        bytes.
    key : str, optional
        The payload's ``key`` when the caller knows it (e.g. passed along
        with the broadcast); then a cache hit does not read the broadcast.

    Returns
    -------
    keras.Model
        The same object for the same content within this Python process
        (while it stays among the cache's most recent entries).
    """
    if isinstance(source, ModelPayload):
        return cached(source.key, source.build)

    def data() -> bytes:
        return source if isinstance(source, (bytes, bytearray, memoryview)) else source.value

    return cached(key or payload_key(data()), lambda: ModelPayload.from_bytes(data()).build())


def batch_mapper(elements: Any, model: Any) -> Callable[[list], list]:
    """This process's traced batch maps (:class:`~sparktf.data.batch_maps.MappedElements`, or None) for a loaded
    ``model``: traced once per process and model, kept on the model's entry; without maps, the identity (nothing
    cached)."""
    if elements is None or not elements.maps.active:
        return _unmapped
    return derived(model, f"batch-maps/{elements.key}", elements.mapper)


def _unmapped(leaves: list) -> list:
    return leaves


def load_count() -> int:
    """How many models this process has loaded (cache misses) so far."""
    return _cache().loads
