"""What a Python process of sparktf's keeps between Spark tasks: every process-wide cache, in one place.

A Python worker runs many tasks (``spark.python.worker.reuse``), and some of
what one task builds is worth keeping for the next: a loaded model, the
training stream a segment parked, files opened ahead. Each such cache is an
entry of the one :class:`ProcessState` of the process, created by its owner
on first use through :func:`process_cache`:

======================  =============================  ==============================================
entry                   owner                          holds, and until when
======================  =============================  ==============================================
``models``              ``models.cache``               loaded models (Keras payloads, SavedModels,
                                                       TFNet graphs, sharded tables' working models)
                                                       by content hash, each entry holding what was
                                                       derived from its model (traced training step,
                                                       traced batch maps, generation engine,
                                                       prediction runner): the 4 most recently used
                                                       models, each leaving with its derived objects
``in_memory_shards``    ``data.block_feed``            training shards read back from their spills,
                                                       least recently used dropped first to stay
                                                       within ``spark.sparktf.trainDataMemory``
``parked_stream``       ``data.tfrecord_stream``       one ``cache=False`` training stream, parked at
                                                       a segment's end until the next segment of the
                                                       same stream takes it (another replaces it)
``early_readers``       ``data.tfrecord_readahead``    TFRecord files opened before their turn: at most
                                                       ``MAX_EARLY``, the oldest closed; each stops
                                                       when nobody takes it within ``IDLE_SECONDS``
``stores``              ``storage.routes``             the Hadoop and fsspec stores made so far, by
                                                       scheme (and JVM, or storage environment)
``frozen_since``        ``spark.worker_gc``            the frozen object count and resident memory
                                                       after the last full collection, which decide
                                                       when a model load collects in full again
======================  =============================  ==============================================

The ``models`` slots count models, not what derives from them: a scoring
query in a training worker takes one slot, and cannot evict the training
model's traced step (``training.worker.loop``) apart from its model, so a later
segment in the same worker finds it traced.

:func:`reset` empties them all and closes what they hold (the tests use it;
a worker never needs to). Per-call state (a stream's read failures, a step's
layout) lives in the call, never here.

Two process-wide facts are not caches, and :func:`reset` leaves them alone,
because they mirror state outside sparktf that cannot be undone:

==================================  =============================  ==========================================
state                               owner                          what it mirrors
==================================  =============================  ==========================================
``_bound``, ``_inherited``          ``spark.task_devices``         the GPUs this process's TensorFlow was
                                                                   bound to (TensorFlow cannot move)
``_REGISTERED``                     ``spark.user_code``            the user modules this driver registered
                                                                   in cloudpickle's process-wide registry
==================================  =============================  ==========================================
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, TypeVar

__all__ = ["ProcessState", "process_cache", "reset"]

T = TypeVar("T")


class ProcessState:
    """The process's named caches, each created on first use; :meth:`reset` clears them."""

    def __init__(self) -> None:
        self._entries: Dict[str, Any] = {}
        self._lock = threading.Lock()

    def cache(self, name: str, factory: Callable[[], T]) -> T:
        """The entry ``name``, made by ``factory()`` the first time it is asked for."""
        with self._lock:
            if name not in self._entries:
                self._entries[name] = factory()
            return self._entries[name]

    def names(self) -> list:
        """The entries created so far."""
        with self._lock:
            return sorted(self._entries)

    def reset(self) -> None:
        """Drop every entry, calling its ``clear()`` first (which closes what it holds)."""
        with self._lock:
            entries, self._entries = list(self._entries.values()), {}
        for entry in entries:
            clear = getattr(entry, "clear", None)
            if clear is not None:
                clear()


_STATE = ProcessState()


def process_cache(name: str, factory: Callable[[], T]) -> T:
    """This process's cache ``name`` (see the module's table), made by ``factory()`` on first use."""
    return _STATE.cache(name, factory)


def reset() -> None:
    """Empty every cache of this process (see :meth:`ProcessState.reset`)."""
    _STATE.reset()
