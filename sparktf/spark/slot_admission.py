"""FIFO admission of the task slots that the concurrent sparktf calls of one driver hold for their barrier jobs.

A barrier job needs all its task slots at once. Several ``optimize`` and
``sparktf.run`` calls started from threads of one driver (model selection:
``CrossValidator(parallelism=k)``, Optuna or Hyperopt trials) would otherwise
submit barrier jobs that together need more slots than the cluster has, and
Spark's own answer is a job that waits, or a check that retries for minutes.

Each session has one :class:`SlotPlanner` (:mod:`~sparktf.spark.session_state`).
Before its first barrier job a call (:mod:`~sparktf.spark.calls`) asks it to
*hold* as many slots as its workers need:

* requests of the same resource profile are granted in the order they came
  (FIFO: a big request is not starved by later small ones), each once the
  slots the other calls hold leave room for it;
* a call waits holding nothing, so no call holds slots while it waits for
  more, and nothing can deadlock: every held slot is given back when its
  call ends, however it ends;
* a request for more slots than the cluster has (for that profile) fails at
  once with a ``SparkTFError`` naming both numbers;
* every wait is bounded by the call's timeout (``spark.sparktf.slotWait``),
  after which it fails naming the calls that held the slots.

The planner knows no Spark: a call is anything with ``what``, ``key``,
``held``, ``timeout``, ``interrupted``, ``check()`` and ``cancel_jobs()``.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable, Deque, Dict, List

from sparktf.errors import SparkTFError
from sparktf.spark.resources import describe_profile

__all__ = ["SlotPlanner", "SLOT_WAIT_CONF", "profile_key"]

_LOG = logging.getLogger("sparktf.slots")
#: Seconds a call may wait for its turn (its slots held by other calls); then it fails.
SLOT_WAIT_CONF = "spark.sparktf.slotWait"
POLL_SECONDS = 0.25


class _Request:
    __slots__ = ("call", "slots", "key")

    def __init__(self, call: Any, slots: int, key: str):
        self.call, self.slots, self.key = call, slots, key


class SlotPlanner:
    """FIFO admission of the slot requests of one Spark session's calls (see the module docstring).

    A session's is its :class:`~sparktf.spark.session_state.SessionState`'s;
    it keeps no session, only what the calls hold: slots per resource
    profile, and who waits.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: Deque[_Request] = collections.deque()
        self._held: Dict[str, int] = collections.defaultdict(int)
        self._calls: List[Any] = []

    # ------------------------------------------------------------------ calls

    def register(self, call: Any) -> None:
        with self._cond:
            self._calls.append(call)

    def unregister(self, call: Any) -> None:
        with self._cond:
            if call in self._calls:
                self._calls.remove(call)
            self._cond.notify_all()

    def others(self, call: Any) -> List[Any]:
        """The other calls running (or waiting) now."""
        with self._cond:
            return [other for other in self._calls if other is not call]

    def held(self, profile: Any = None) -> int:
        """Slots the calls hold now for ``profile`` (None: the session's defaults)."""
        with self._cond:
            return self._held[profile_key(profile)]

    def interrupt(self) -> None:
        """Mark every call cancelled (no lock taken: safe in a signal handler); :meth:`cancel_jobs` does the rest."""
        for call in list(self._calls):
            call.interrupted = True

    def cancel_jobs(self) -> int:
        """Cancel the jobs of every interrupted call and wake the waiting ones; returns how many such calls run."""
        with self._cond:
            calls = [call for call in self._calls if call.interrupted]
        for call in calls:
            call.cancel_jobs()
        with self._cond:
            self._cond.notify_all()
        return len(calls)

    # ------------------------------------------------------------------ slots

    def acquire(self, call: Any, slots: int, total: Callable[[], int], timeout: float, profile: Any = None) -> None:
        """Wait (FIFO among requests of ``profile``) until ``slots`` more fit beside what other calls hold; take them.

        ``total()`` is the cluster's slots for ``profile`` now (probed again
        while waiting: executors come and go).

        Raises
        ------
        SparkTFError
            ``slots`` is more than the cluster has; the call was cancelled;
            or its turn did not come within ``timeout`` seconds.
        """
        key = profile_key(profile)
        request = _Request(call, slots, key)
        started = time.monotonic()
        with self._cond:
            self._queue.append(request)
        try:
            while True:
                call.check()
                capacity = total()
                if slots > capacity:
                    raise SparkTFError(
                        f"{call.what} needs {slots} task slots at once, but the cluster has only {capacity} "
                        f"{_profile_words(key)}: lower the workers or add executors / cores")
                waited = time.monotonic() - started
                with self._cond:
                    first = next(r for r in self._queue if r.key == key)
                    if first is request and self._held[key] + slots <= capacity:
                        self._queue.remove(request)
                        self._held[key] += slots
                        request = None
                        if waited > 1.0:
                            _LOG.info("%s got its %d task slots after waiting %.1f s", call.what, slots, waited)
                        return
                    if waited >= timeout:
                        raise self._too_long(call, slots, capacity, key, waited)
                    self._cond.wait(min(POLL_SECONDS, timeout - waited))
        finally:
            if request is not None:
                with self._cond:
                    self._queue.remove(request)
                    self._cond.notify_all()

    def try_grow(self, slots: int, capacity: int, profile: Any = None) -> bool:
        """Take ``slots`` more at once if they fit and no request of ``profile`` waits; else take nothing."""
        key = profile_key(profile)
        with self._cond:
            if any(r.key == key for r in self._queue) or self._held[key] + slots > capacity:
                return False
            self._held[key] += slots
            return True

    def grantable(self, capacity: int, profile: Any = None) -> int:
        """Slots a new request of ``profile`` could take now: ``capacity`` less what calls hold (0 while any waits)."""
        key = profile_key(profile)
        with self._cond:
            if any(r.key == key for r in self._queue):
                return 0
            return max(0, capacity - self._held[key])

    def release(self, slots: int, profile: Any = None) -> None:
        key = profile_key(profile)
        with self._cond:
            self._held[key] = max(0, self._held[key] - slots)
            self._cond.notify_all()

    def _too_long(self, call: Any, slots: int, capacity: int, key: str, waited: float) -> SparkTFError:
        holders = ", ".join(f"{other.what} holds {other.held}" for other in self._calls
                            if other is not call and other.held and other.key == key) or "none"
        return SparkTFError(
            f"{call.what} waited {waited:.0f} s for {slots} of the cluster's {capacity} task slots "
            f"{_profile_words(key)} without getting its turn ({SLOT_WAIT_CONF}={call.timeout:g}); held by other "
            f"calls of this driver: {holders}. Run fewer trials at once (parallelism), give each fewer workers, "
            f"or raise {SLOT_WAIT_CONF}"
        )


def profile_key(profile: Any) -> str:
    return describe_profile(profile) if profile is not None else ""


def _profile_words(key: str) -> str:
    return f"for {key}" if key else "of the session's default resource profile"
