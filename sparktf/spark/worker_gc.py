"""Keep a loaded model out of the Python garbage collector's full collections.

PySpark's worker daemon runs ``gc.collect()`` after every task of a reused
Python worker. Once TensorFlow, Keras and a model are loaded, the process
tracks ~400k container objects and each full collection walks them all:
~0.25 s per task on a 2-core machine, spent before the worker can take the
next task. Moving the long-lived objects to the permanent generation
(``gc.freeze()``) right after a model is loaded makes those collections
cost milliseconds. Objects frozen this way are still freed by reference
counting, but cycles among them (a Keras model is full of them) are not:
a model evicted from the worker's cache would stay in memory. So each load
by :func:`frozen_after` first unfreezes, then collects everything, which
frees what earlier loads left behind, and freezes again: one full
collection per model load.
"""

from __future__ import annotations

import gc
from typing import Any, Callable, TypeVar

__all__ = ["freeze_alive", "frozen_after"]

T = TypeVar("T")


def frozen_after(loader: Callable[[], T]) -> Callable[[], T]:
    """``loader``, then ``gc.unfreeze()``, a full collection and ``gc.freeze()`` of everything alive.

    Parameters
    ----------
    loader : callable
        Loads something long-lived (a model), e.g. the loader given to
        :func:`sparktf.models.cache.cached`.

    Returns
    -------
    callable
        Returns what ``loader`` returns.
    """

    def load() -> Any:
        loaded = loader()
        freeze_alive()
        return loaded

    return load


def freeze_alive() -> None:
    """Unfreeze, collect everything (freeing what earlier freezes kept), freeze what is still alive."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
