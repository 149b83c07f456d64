"""The per-process cache of loaded models (Keras payloads, SavedModels, TFNet graphs).

A Python worker keeps the models its tasks loaded, keyed by content hash, so
later tasks and jobs with the same model skip the load (a small LRU; the
``models`` entry of :mod:`sparktf.process_state`).
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Optional, Union

from sparktf.models.payload import ModelPayload, payload_key
from sparktf.process_state import process_cache

__all__ = ["ModelCache", "cached", "load_cached", "batch_mapper", "load_count", "DEFAULT_CACHE_ENTRIES"]

DEFAULT_CACHE_ENTRIES = 4


class ModelCache:
    """A thread-safe LRU of loaded models keyed by content hash.

    Parameters
    ----------
    max_entries : int
        How many models a process keeps; the least recently used is dropped.
    """

    def __init__(self, max_entries: int = DEFAULT_CACHE_ENTRIES) -> None:
        self.max_entries = max_entries
        self.loads = 0
        self._entries: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
        self._lock = threading.RLock()  # a loader may load another entry

    def get_or_load(self, key: str, loader: Callable[[], Any]) -> Any:
        """Return the cached object for ``key``, calling ``loader()`` on a miss."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
            value = loader()
            self.loads += 1
            self._entries[key] = value
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            return value

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()


def _cache() -> ModelCache:
    return process_cache("models", ModelCache)


def cached(key: str, loader: Callable[[], Any]) -> Any:
    """Return this process's cached object for ``key``, loading it on a miss.

    Shared by every model kind (Keras payloads, SavedModels) so that
    :func:`load_count` counts them all.
    """
    return _cache().get_or_load(key, loader)


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
    ``model``: traced once per process and model (the entry holds the model, so its ``id`` names it while cached);
    without maps, the identity (nothing cached)."""
    if elements is None or not elements.maps.active:
        return _unmapped
    return cached(f"batch-maps/{elements.key}/{id(model)}", lambda: elements.mapper(model))


def _unmapped(leaves: list) -> list:
    return leaves


def load_count() -> int:
    """How many models this process has loaded (cache misses) so far."""
    return _cache().loads
