"""Task slots shared by the concurrent sparktf calls of one driver: FIFO admission of their barrier jobs.

A barrier job needs all its task slots at once. Several ``optimize`` and
``sparktf.run`` calls started from threads of one driver (model selection:
``CrossValidator(parallelism=k)``, Optuna or Hyperopt trials) would otherwise
submit barrier jobs that together need more slots than the cluster has, and
Spark's own answer is a job that waits, or a check that retries for minutes.

Each call registers a :class:`Call` with the session's :class:`SlotPlanner`
(one per SparkContext or Spark Connect session, kept on it). Before its
first barrier job a call asks to *hold* as many slots as its workers need:

* requests of the same resource profile are granted in the order they came
  (FIFO: a big request is not starved by later small ones), each once the
  slots the other calls hold leave room for it;
* a call waits holding nothing, so no call holds slots while it waits for
  more, and nothing can deadlock: every held slot is given back when its
  call ends, however it ends;
* a request for more slots than the cluster has (for that profile) fails at
  once with a ``SparkTFError`` naming both numbers; the callers check that
  before any job;
* every wait is bounded by ``spark.sparktf.slotWait`` (seconds, default
  3600), after which the call fails naming the calls that held the slots.

The planner plans; Spark still runs the jobs. A call holding its slots may
still find some of them busy for a moment (another call's validation or
evaluation job, ordinary jobs that take any free slot); it waits for them as
before a relaunch, but for as long as other calls of this driver are
running, not only 30 s (:meth:`Call.busy_wait`).

Ctrl-C: while a call runs, this module's ``SIGINT`` handler (installed from
the main thread, chained to the one it finds: PySpark's cancels the
SparkContext's jobs) marks every call of every planner cancelled and cancels
their jobs by their call tags, so calls running in other threads stop
instead of relaunching, and the interrupt goes on in the main thread at once.
A call may be between two jobs when Ctrl-C comes, and submit its next one
before it sees its flag: the cancelling goes on, every
:data:`_POLL_SECONDS`, until every cancelled call has ended (at most
:data:`INTERRUPT_CANCEL_SECONDS`).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import signal
import threading
import time
import uuid
import weakref
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional

from sparktf.errors import ConfigurationError, SparkTFError
from sparktf.spark.cluster import TaskSlots
from sparktf.spark.resources import describe_profile

__all__ = ["SlotPlanner", "Call", "planner_for", "free_task_slots", "call_scope", "labelled", "current_label", "SLOT_WAIT_CONF",
           "BUSY_WAIT_SECONDS", "cancelled_error", "install_interrupt_handler"]

_LOG = logging.getLogger("sparktf.slots")
#: Seconds a call may wait for its turn (its slots held by other calls); then it fails.
SLOT_WAIT_CONF = "spark.sparktf.slotWait"
DEFAULT_SLOT_WAIT = 3600.0
#: Seconds a call waits for slots busy with tasks while no other call of this driver runs (a failed job's).
BUSY_WAIT_SECONDS = 30.0
_POLL_SECONDS = 0.25
#: Seconds the jobs of cancelled calls that have not ended yet are cancelled again (jobs they submit late).
INTERRUPT_CANCEL_SECONDS = 300.0
_PLANNER_ATTR = "_sparktf_slot_planner"
_PLANNERS: "weakref.WeakSet[SlotPlanner]" = weakref.WeakSet()
_THREAD = threading.local()  # the label of this thread's calls (see labelled)


def slot_wait(kind: Any) -> float:
    """``spark.sparktf.slotWait``: seconds a call may wait for its turn (this thread's local property first).

    Raises
    ------
    ConfigurationError
        The value is not a number of seconds >= 0.
    """
    text = kind.setting(SLOT_WAIT_CONF, str(DEFAULT_SLOT_WAIT))
    try:
        seconds = float(str(text).strip().removesuffix("s"))
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ConfigurationError(f"{SLOT_WAIT_CONF} must be a number of seconds >= 0, got {text!r}")
    return seconds


def cancelled_error(what: str) -> SparkTFError:
    """The error a call raises once Ctrl-C in the driver cancelled it."""
    error = SparkTFError(f"{what} was cancelled: Ctrl-C (KeyboardInterrupt) in the driver cancelled the jobs of "
                         "every running sparktf call")
    error._sparktf_cancelled = True
    return error


@contextlib.contextmanager
def labelled(label: str) -> Iterator[None]:
    """Label the sparktf calls this thread starts inside the block (their progress lines show it)."""
    previous = getattr(_THREAD, "label", None)
    _THREAD.label = label
    try:
        yield
    finally:
        _THREAD.label = previous


def current_label() -> Optional[str]:
    """The label of a call started now in this thread: :func:`labelled`'s, else the name of a thread that is
    not the main thread, else None (a lone call in the main thread keeps its progress bar)."""
    label = getattr(_THREAD, "label", None)
    if label:
        return label
    thread = threading.current_thread()
    return None if thread is threading.main_thread() else thread.name


class _Request:
    __slots__ = ("call", "slots", "key")

    def __init__(self, call: "Call", slots: int, key: str):
        self.call, self.slots, self.key = call, slots, key


class SlotPlanner:
    """FIFO admission of the slot requests of one Spark session's calls (see the module docstring).

    Get it with :func:`planner_for`; it keeps no session, only what the
    calls hold: slots per resource profile, and who waits.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: Deque[_Request] = collections.deque()
        self._held: Dict[str, int] = collections.defaultdict(int)
        self._calls: List[Call] = []
        _PLANNERS.add(self)

    # ------------------------------------------------------------------ calls

    def register(self, call: "Call") -> None:
        with self._cond:
            self._calls.append(call)

    def unregister(self, call: "Call") -> None:
        with self._cond:
            if call in self._calls:
                self._calls.remove(call)
            self._cond.notify_all()

    def others(self, call: "Call") -> List["Call"]:
        """The other calls running (or waiting) now."""
        with self._cond:
            return [other for other in self._calls if other is not call]

    def held(self, profile: Any = None) -> int:
        """Slots the calls hold now for ``profile`` (None: the session's defaults)."""
        with self._cond:
            return self._held[_key(profile)]

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

    def acquire(self, call: "Call", slots: int, total: Callable[[], int], timeout: float, profile: Any = None) -> None:
        """Wait (FIFO among requests of ``profile``) until ``slots`` more fit beside what other calls hold; take them.

        ``total()`` is the cluster's slots for ``profile`` now (probed again
        while waiting: executors come and go).

        Raises
        ------
        SparkTFError
            ``slots`` is more than the cluster has; the call was cancelled;
            or its turn did not come within ``timeout`` seconds.
        """
        key = _key(profile)
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
                    self._cond.wait(min(_POLL_SECONDS, timeout - waited))
        finally:
            if request is not None:
                with self._cond:
                    self._queue.remove(request)
                    self._cond.notify_all()

    def try_grow(self, slots: int, capacity: int, profile: Any = None) -> bool:
        """Take ``slots`` more at once if they fit and no request of ``profile`` waits; else take nothing."""
        key = _key(profile)
        with self._cond:
            if any(r.key == key for r in self._queue) or self._held[key] + slots > capacity:
                return False
            self._held[key] += slots
            return True

    def grantable(self, capacity: int, profile: Any = None) -> int:
        """Slots a new request of ``profile`` could take now: ``capacity`` less what calls hold (0 while any waits)."""
        key = _key(profile)
        with self._cond:
            if any(r.key == key for r in self._queue):
                return 0
            return max(0, capacity - self._held[key])

    def release(self, slots: int, profile: Any = None) -> None:
        key = _key(profile)
        with self._cond:
            self._held[key] = max(0, self._held[key] - slots)
            self._cond.notify_all()

    def _too_long(self, call: "Call", slots: int, capacity: int, key: str, waited: float) -> SparkTFError:
        holders = ", ".join(f"{other.what} holds {other.held}" for other in self._calls
                            if other is not call and other.held and other.key == key) or "none"
        return SparkTFError(
            f"{call.what} waited {waited:.0f} s for {slots} of the cluster's {capacity} task slots "
            f"{_profile_words(key)} without getting its turn ({SLOT_WAIT_CONF}={call.timeout:g}); held by other "
            f"calls of this driver: {holders}. Run fewer trials at once (parallelism), give each fewer workers, "
            f"or raise {SLOT_WAIT_CONF}"
        )


class Call:
    """One sparktf call (``optimize``, ``evaluate``, ``sparktf.run``) of one thread: its slots, tag and label.

    Use :func:`call_scope`. Attributes: ``tag`` (every job the thread starts
    inside the scope carries it), ``label`` (None: not labelled), ``held``
    (slots held now), ``interrupted`` (Ctrl-C cancelled it).
    """

    def __init__(self, planner: SlotPlanner, kind: Any, what: str, label: Optional[str]):
        self.planner = planner
        self.kind = kind
        self.what = what
        self.label = label
        self.tag = f"sparktf-call-{uuid.uuid4().hex[:12]}"
        self.timeout = slot_wait(kind)
        self.held = 0
        self.key = ""
        self._profile: Any = None
        self.interrupted = False

    def check(self) -> None:
        """Raise the cancellation error once Ctrl-C cancelled this call."""
        if self.interrupted:
            raise cancelled_error(self.what)

    def cancel_jobs(self) -> None:
        try:
            self.kind.cancel_tag(self.tag)
        except Exception as error:  # the session may be gone: its jobs with it
            _LOG.debug("could not cancel the jobs of %s: %s", self.what, error)

    def slots(self, profile: Any = None) -> TaskSlots:
        """The cluster's :class:`TaskSlots` for ``profile`` now; raises once the call is cancelled (every wait polls it)."""
        self.check()
        return self.kind.slots(profile)

    def grantable(self, profile: Any = None) -> int:
        """Slots this call could hold now without waiting: what it holds plus what no other call holds."""
        return self.held + self.planner.grantable(self.slots(profile).total, profile)

    def hold(self, slots: int, profile: Any = None) -> int:
        """Hold ``slots`` for the call's next barrier job; returns how many it holds.

        Fewer than held: the rest is given back. More: taken at once when
        they fit and nobody waits; otherwise a call that holds some keeps
        them (an elastic call goes on with what it has), and one that holds
        none waits its turn (:meth:`SlotPlanner.acquire`).

        Raises
        ------
        SparkTFError
            Ctrl-C cancelled the call: it launches nothing more.
        """
        self.check()
        if self.held and _key(profile) != self.key:
            self.release()
        if slots <= self.held:
            self.planner.release(self.held - slots, profile)
        elif self.held:
            if not self.planner.try_grow(slots - self.held, self.slots(profile).total, profile):
                return self.held
        else:
            self.planner.acquire(self, slots, lambda: self.slots(profile).total, self.timeout, profile)
        self.held, self.key, self._profile = slots, _key(profile), profile
        return slots

    def release(self) -> None:
        """Give back every slot the call holds."""
        if self.held:
            self.planner.release(self.held, self._profile)
            self.held = 0

    def busy_wait(self) -> float:
        """Seconds a launch may wait for its slots to be free of running tasks.

        :data:`BUSY_WAIT_SECONDS` when no other call of this driver runs
        (the tasks are a failed job's, or stuck); while others run their
        ordinary jobs may take free slots for a while: the call's own bound.
        """
        return max(BUSY_WAIT_SECONDS, self.timeout) if self.planner.others(self) else BUSY_WAIT_SECONDS


def free_task_slots(session: Any, profile: Any = None) -> int:
    """Task slots of ``session``'s cluster (for ``profile``) that no sparktf call of this driver holds now.

    The slots of the plan, not of the moment: tasks running outside sparktf's
    barrier jobs do not count, so the answer is the same on an idle driver
    however busy Spark happens to be (trials sized from it train alike).
    """
    from sparktf.spark.sessions import session_kind

    kind = session_kind(session)
    return planner_for(kind).grantable(kind.slots(profile).total, profile)


def planner_for(kind: Any) -> SlotPlanner:
    """The :class:`SlotPlanner` of ``kind``'s session (its SparkContext or Spark Connect session)."""
    holder = kind.holder
    planner = getattr(holder, _PLANNER_ATTR, None)
    if planner is None:
        planner = holder.__dict__.setdefault(_PLANNER_ATTR, SlotPlanner())  # one wins if two threads race
    return planner


@contextlib.contextmanager
def call_scope(kind: Any, what: str) -> Iterator[Call]:
    """Register a call of this thread for its duration: its tag on the thread's jobs, its slots given back at the end.

    Ctrl-C (in the main thread) cancels every registered call's jobs; a
    ``KeyboardInterrupt`` inside the scope cancels this call's.
    """
    planner = planner_for(kind)
    call = Call(planner, kind, what, current_label())
    install_interrupt_handler()
    planner.register(call)
    kind.add_tag(call.tag)
    try:
        yield call
    except KeyboardInterrupt:
        planner.interrupt()
        _cancel_in_background([planner])
        raise
    except Exception as error:
        if call.interrupted and not getattr(error, "_sparktf_cancelled", False):
            raise cancelled_error(what) from error  # the job Ctrl-C cancelled failed; say why
        raise
    finally:
        call.release()
        planner.unregister(call)
        with contextlib.suppress(Exception):  # a dead session's error is already on its way
            kind.remove_tag(call.tag)


# ---------------------------------------------------------------------- Ctrl-C

def _interrupt_every_call() -> None:
    planners = list(_PLANNERS)
    for planner in planners:
        planner.interrupt()  # flags first, in the handler itself: the calls must not relaunch what gets cancelled
    _cancel_in_background(planners)


def _cancel_in_background(planners: List[SlotPlanner]) -> None:
    """Cancel the interrupted calls' jobs now and again until those calls end (see the module docstring)."""
    def cancel_until_ended() -> None:
        deadline = time.monotonic() + INTERRUPT_CANCEL_SECONDS
        while sum(planner.cancel_jobs() for planner in planners) and time.monotonic() < deadline:
            time.sleep(_POLL_SECONDS)

    threading.Thread(target=cancel_until_ended, name="sparktf-interrupt", daemon=True).start()


class _InterruptHandler:
    """``SIGINT``: cancel every sparktf call, then whatever handler was there (PySpark's, or the default)."""

    def __init__(self, previous: Any):
        self.previous = previous

    def __call__(self, signum: int, frame: Any) -> None:
        _interrupt_every_call()
        if callable(self.previous):
            self.previous(signum, frame)
        else:
            raise KeyboardInterrupt


def install_interrupt_handler() -> None:
    """Chain :class:`_InterruptHandler` before the current ``SIGINT`` handler (main thread only; once)."""
    if threading.current_thread() is not threading.main_thread():
        return
    with contextlib.suppress(ValueError, TypeError):  # no signals here (an embedded interpreter)
        current = signal.getsignal(signal.SIGINT)
        if not isinstance(current, _InterruptHandler) and current not in (signal.SIG_IGN, None):
            signal.signal(signal.SIGINT, _InterruptHandler(current))


def _key(profile: Any) -> str:
    return describe_profile(profile) if profile is not None else ""


def _profile_words(key: str) -> str:
    return f"for {key}" if key else "of the session's default resource profile"
