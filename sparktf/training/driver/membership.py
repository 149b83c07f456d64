"""How many workers each training segment runs on: all of them, or (elastic) fewer while executors are gone.

Every segment is a fresh barrier job with a fresh ring, and the driver's
model state is the commit point, so the worker count may change from one
segment to the next. :class:`Membership` picks it before every launch:

* the first launch of an ``optimize`` call refuses at once a cluster with
  fewer task slots than ``min_workers`` (it is too small); otherwise it
  wants ``num_workers``;
* a launch that finds fewer task slots than it wants (the workers of the
  last launch, or ``num_workers`` at the first one) on the live executors
  waits up to ``replace_wait`` seconds for them to come back, then goes on
  with the most workers the live executors hold, at least ``min_workers``
  (below that: :class:`~sparktf.errors.TrainingError` naming the slots
  needed and left); while it waits, the training data's layout for that
  count is built (``prepare``), so the wait and Spark's shuffle overlap;
* a launch after a segment that ran on fewer than ``num_workers`` grows back
  to as many as are free then, without waiting.

Slots that exist but are busy (tasks of a failed job still ending, the
layout's own job) are waited for separately, once the launch's data is
ready: :meth:`Membership.wait_free`, at most :data:`SLOT_WAIT_SECONDS`.

A change of the worker count is not a failure (``max_failures`` does not
count it); more than :data:`FLAP_LIMIT` changes within :data:`FLAP_WINDOW`
seconds (executors that keep coming and going) end training with a
``TrainingError``. With ``min_workers == num_workers`` (the default) the
count never changes; a relaunch then still waits up to ``replace_wait`` for
lost slots before it gives up.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any, Callable, Deque, Optional

from sparktf.errors import TrainingError
from sparktf.spark.cluster import TaskSlots, slot_shortage, wait_for_free_slots

__all__ = ["Membership", "FLAP_LIMIT", "FLAP_WINDOW", "SLOT_WAIT_SECONDS"]

_LOG = logging.getLogger("sparktf.optimizer")

#: Seconds a launch waits for task slots that running tasks (e.g. a failed job's) still hold.
SLOT_WAIT_SECONDS = 30.0
#: The most worker-count changes allowed within :data:`FLAP_WINDOW` seconds.
FLAP_LIMIT = 8
#: Seconds over which :data:`FLAP_LIMIT` counts changes.
FLAP_WINDOW = 600.0
_POLL_SECONDS = 0.2


class Membership:
    """The worker count of each launch of one ``optimize`` call.

    Parameters
    ----------
    session : SessionKind
        The session that runs the training jobs.
    num_workers : int
        The workers training wants (``TFOptimizer``'s ``num_workers``).
    min_workers : int
        The fewest it goes on with (``num_workers``: not elastic).
    replace_wait : float
        Seconds a launch waits for missing slots before it goes on with fewer
        (or gives up below ``min_workers``).
    prepare : callable, optional
        ``prepare(n)`` starts building the training data for ``n`` workers
        while a launch waits; called at most once per wait and count.
    probe : callable, optional
        Returns the cluster's :class:`~sparktf.spark.cluster.TaskSlots`
        (default: ``session.slots()``).
    clock, sleep : callable, optional
        ``time.monotonic`` and ``time.sleep`` (replaceable in tests).
    available : callable, optional
        Slots a launch could grow to now (default: the probe's free ones);
        with concurrent calls, what the slot planner would grant at once.
    busy_wait : callable, optional
        Seconds :meth:`wait_free` waits for busy slots (default
        :data:`SLOT_WAIT_SECONDS`; longer while other calls of the driver run).

    Attributes
    ----------
    current : int or None
        The workers of the last launch (None before the first).
    changes : int
        The worker-count changes so far.
    """

    def __init__(
        self,
        session: Any,
        num_workers: int,
        min_workers: int,
        replace_wait: float,
        prepare: Optional[Callable[[int], None]] = None,
        probe: Optional[Callable[[], TaskSlots]] = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        available: Optional[Callable[[], int]] = None,
        busy_wait: Optional[Callable[[], float]] = None,
    ):
        if not 1 <= min_workers <= num_workers:
            raise ValueError(f"min_workers must be between 1 and num_workers={num_workers}, got {min_workers}")
        self.session = session
        self.num_workers = num_workers
        self.min_workers = min_workers
        self.replace_wait = float(replace_wait)
        self._prepare = prepare
        self._probe = probe or session.slots
        self._clock = clock
        self._sleep = sleep
        self._available = available or (lambda: self._probe().free)
        self._busy_wait = busy_wait or (lambda: SLOT_WAIT_SECONDS)
        self.current: Optional[int] = None
        self.changes = 0
        self._change_times: Deque[float] = collections.deque()

    @property
    def elastic(self) -> bool:
        """Whether training may go on with fewer than ``num_workers``."""
        return self.min_workers < self.num_workers

    def lost_slots(self) -> bool:
        """Whether, elastic, the live executors now hold fewer slots than the last launch's workers."""
        return self.elastic and self.current is not None and self._probe().total < self.current

    def next_launch(self, iteration: int, failed: bool = False) -> int:
        """The workers of the next launch, waiting up to ``replace_wait`` for missing slots.

        Parameters
        ----------
        iteration : int
            The last iteration done (the launch starts after it), for the log.
        failed : bool
            Whether the last launch failed (then it does not grow).

        Raises
        ------
        SparkTFError
            At the first launch, when the cluster has fewer task slots than
            ``min_workers``.
        TrainingError
            Fewer than ``min_workers`` slots are left after ``replace_wait``,
            or the count changed more than :data:`FLAP_LIMIT` times within
            :data:`FLAP_WINDOW` seconds.
        """
        if self.current is None:
            workers = self._first()
        else:
            workers = None if failed else self._grown()
            if workers is None:
                workers = self._wanted_or_fewer(self.current)
        self._settle(workers, iteration)
        return workers

    # ------------------------------------------------------------------ choices

    def _first(self) -> int:
        slots = self._probe()
        if slots.total < self.min_workers:
            setting = "min_workers" if self.elastic else "num_workers"
            raise slot_shortage(self.session, setting, self.min_workers, slots)
        return self._wanted_or_fewer(self.num_workers) if self.elastic else self.num_workers

    def _grown(self) -> Optional[int]:
        """More workers than the last launch when slots are free for them now, else None."""
        if self.current >= self.num_workers:
            return None
        grown = min(self.num_workers, self._available())
        return grown if grown > self.current else None

    def _wanted_or_fewer(self, wanted: int) -> int:
        """``wanted`` once the live executors hold its slots; after ``replace_wait``, what they hold."""
        deadline = self._clock() + self.replace_wait
        warned = False
        prepared = set()
        while True:
            slots = self._probe()
            if slots.total >= wanted:
                return wanted
            left = deadline - self._clock()
            if left <= 0:
                break
            if not warned:
                _LOG.warning("%d of the %d task slots training wants are gone; waiting up to %g s for them to "
                             "come back (replace_wait)", wanted - slots.total, wanted, self.replace_wait)
                warned = True
            fallback = slots.total  # what the launch goes on with unless slots come back
            if self._prepare is not None and fallback >= self.min_workers and fallback not in prepared:
                prepared.add(fallback)
                self._prepare(fallback)
            self._sleep(min(_POLL_SECONDS, left))
        if slots.total < self.min_workers:
            raise TrainingError(
                f"training needs at least min_workers={self.min_workers} free task slots, but has only "
                f"{slots.total} (of the {wanted} it wants) after waiting replace_wait="
                f"{self.replace_wait:g} s for lost executors to come back{self._busy(slots)}. Add executors "
                "and resume from the driver's model (or model_dir), or allow fewer workers with a lower "
                "min_workers"
            )
        return slots.total

    def wait_free(self, workers: int) -> None:
        """Wait (at most :data:`SLOT_WAIT_SECONDS`, or ``busy_wait()``) until ``workers`` slots are free of running tasks.

        Raises
        ------
        SparkTFError
            The slots are not all free in time (naming the busy executors).
        """
        wait_for_free_slots(self.session, workers, timeout=self._busy_wait(), probe=self._probe)

    # ------------------------------------------------------------------ changes

    def _settle(self, workers: int, iteration: int) -> None:
        previous, self.current = self.current, workers
        if previous is None and workers < self.num_workers:
            _LOG.warning("continuing on %d of %d workers from iteration %d: the other task slots are gone",
                         workers, self.num_workers, iteration + 1)
        if previous is None or workers == previous:
            return
        self.changes += 1
        now = self._clock()
        self._change_times.append(now)
        while self._change_times and now - self._change_times[0] > FLAP_WINDOW:
            self._change_times.popleft()
        if len(self._change_times) > FLAP_LIMIT:
            raise TrainingError(
                f"the number of training workers changed {len(self._change_times)} times within "
                f"{FLAP_WINDOW:g} s (executors keep coming and going; at most {FLAP_LIMIT} changes are "
                f"allowed): fix the cluster, or set min_workers=num_workers to fail on the first loss"
            )
        why = "task slots came back" if workers > previous else "task slots are gone"
        _LOG.warning("continuing on %d of %d workers from iteration %d: %s", workers, self.num_workers,
                     iteration + 1, why)

    @staticmethod
    def _busy(slots: TaskSlots) -> str:
        busy = slots.describe_busy()
        return f"; busy: {busy}" if busy else ""
