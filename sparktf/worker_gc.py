"""Keep a loaded model out of the Python garbage collector's full collections.

PySpark's worker daemon runs ``gc.collect()`` after every task of a reused
Python worker. Once TensorFlow, Keras and a model are loaded, the process
tracks ~400k container objects and each full collection walks them all:
~0.25 s per task on a 2-core machine, spent before the worker can take the
next task. Moving the long-lived objects to the permanent generation
(``gc.freeze()``) right after a model is loaded makes those collections
cost milliseconds. Objects frozen this way are still freed by reference
counting; only cycles among them are never collected, which is what a
model kept in the worker's cache is anyway.
"""

from __future__ import annotations

import gc
from typing import Any, Callable, TypeVar

__all__ = ["frozen_after"]

T = TypeVar("T")


def frozen_after(loader: Callable[[], T]) -> Callable[[], T]:
    """``loader`` followed by a full collection and ``gc.freeze()`` of everything alive.

    Parameters
    ----------
    loader : callable
        Loads something long-lived (a model), e.g. the loader given to
        :func:`sparktf.model_io.cached`.

    Returns
    -------
    callable
        Returns what ``loader`` returns.
    """

    def load() -> Any:
        loaded = loader()
        gc.collect()
        gc.freeze()
        return loaded

    return load
