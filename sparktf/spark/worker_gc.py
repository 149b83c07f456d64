"""Keep a loaded model out of the Python garbage collector's full collections.

PySpark's worker daemon runs ``gc.collect()`` after every task of a reused
Python worker. Once TensorFlow, Keras and a model are loaded, the process
tracks ~400k container objects and each full collection walks them all:
~0.25 s per task on a 2-core machine, spent before the worker can take the
next task. Moving the long-lived objects to the permanent generation
(``gc.freeze()``) right after a model is loaded makes those collections
cost milliseconds.

Objects frozen this way are still freed by reference counting, but cycles
among them (a Keras model is full of them) are not: a model evicted from the
worker's cache stays in memory until a full collection that unfreezes first.
That collection walks everything the process holds, TensorFlow's own objects
included (0.16-0.27 s, against about 1 ms for freezing a small model's objects
alone), so a load pays for it only once the frozen objects or the process's
resident memory grew by more than a quarter since the last one: the rule
CPython's own collector uses for its full collections. What evicted models
keep alive is bounded by that quarter; the first load of a process always
collects in full.
"""

from __future__ import annotations

import gc
import os
from typing import Any, Callable, Optional, TypeVar

from sparktf.process_state import process_cache

__all__ = ["freeze_alive", "frozen_after", "FULL_COLLECTION_GROWTH"]

T = TypeVar("T")

#: How much the frozen objects or the resident memory may grow, as a fraction of their size after the last full
#: collection, before a load collects in full again.
FULL_COLLECTION_GROWTH = 0.25


class FrozenSince:
    """How many objects were frozen, and the resident bytes, right after this process's last full collection; and
    how many objects were frozen since (counted as they are frozen: counting the frozen ones walks them all)."""

    def __init__(self) -> None:
        self.objects: Optional[int] = None
        self.resident: Optional[int] = None
        self.added = 0

    def outgrown(self) -> bool:
        """Whether a full collection is due (none happened yet, or either size grew by more than the fraction)."""
        if self.objects is None:
            return True
        resident = _resident_bytes()
        return self.added > self.objects * FULL_COLLECTION_GROWTH or (
            resident is not None and self.resident is not None
            and resident > self.resident * (1.0 + FULL_COLLECTION_GROWTH))

    def mark(self) -> None:
        self.objects, self.resident, self.added = gc.get_freeze_count(), _resident_bytes(), 0

    def clear(self) -> None:
        """Forget the sizes: the next load collects in full."""
        self.objects = self.resident = None
        self.added = 0


def frozen_after(loader: Callable[[], T]) -> Callable[[], T]:
    """``loader``, then :func:`freeze_alive`.

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
    """Collect and freeze what is alive; unfreeze first (freeing what earlier freezes kept) when that is due."""
    since = process_cache("frozen_since", FrozenSince)
    gc.collect()
    since.added += len(gc.get_objects())  # what a freeze now moves: the objects outside the frozen set
    if since.outgrown():
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        since.mark()
    else:
        gc.freeze()


def _resident_bytes() -> Optional[int]:
    """This process's resident memory (Linux), or None where ``/proc`` does not tell it."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
