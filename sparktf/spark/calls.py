"""The sparktf calls of one driver (``optimize``, ``evaluate``, ``sparktf.run``): their job tags, the task slots
they hold, their progress labels and their cancellation.

Every such call runs in a :func:`call_scope`: the jobs its thread starts
carry the call's tag (Ctrl-C cancels them by it), the slots it holds for its
barrier jobs are its session's planner's (:mod:`~sparktf.spark.slot_admission`)
and are given back when it ends, however it ends. The planner plans; Spark
still runs the jobs. A call holding its slots may still find some of them
busy for a moment (another call's validation or evaluation job, ordinary jobs
that take any free slot); it waits for them as before a relaunch, but for as
long as other calls of this driver are running, not only 30 s
(:meth:`Call.busy_wait`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from typing import Any, Iterator, Optional

from sparktf.errors import CancelledError
from sparktf.spark.cluster import TaskSlots, seconds_setting
from sparktf.spark.interrupts import cancel_in_background, install_interrupt_handler
from sparktf.spark.session_state import session_state
from sparktf.spark.slot_admission import SLOT_WAIT_CONF, SlotPlanner, profile_key

__all__ = ["Call", "call_scope", "labelled", "current_label", "task_slot_total", "BUSY_WAIT_SECONDS",
           "DEFAULT_SLOT_WAIT"]

_LOG = logging.getLogger("sparktf.slots")
DEFAULT_SLOT_WAIT = 3600.0
#: Seconds a call waits for slots busy with tasks while no other call of this driver runs (a failed job's).
BUSY_WAIT_SECONDS = 30.0
_THREAD = threading.local()  # the label of this thread's calls (see labelled)


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
        self.timeout = seconds_setting(kind, SLOT_WAIT_CONF, DEFAULT_SLOT_WAIT)
        self.held = 0
        self.key = ""
        self._profile: Any = None
        self.interrupted = False

    def check(self) -> None:
        """Raise the cancellation error once Ctrl-C cancelled this call."""
        if self.interrupted:
            raise self.cancelled()

    def cancelled(self) -> CancelledError:
        """The error this call raises once Ctrl-C cancelled it."""
        return CancelledError(f"{self.what} was cancelled: Ctrl-C (KeyboardInterrupt) in the driver cancelled the "
                              "jobs of every running sparktf call")

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
        if self.held and profile_key(profile) != self.key:
            self.release()
        if slots <= self.held:
            self.planner.release(self.held - slots, profile)
        elif self.held:
            if not self.planner.try_grow(slots - self.held, self.slots(profile).total, profile):
                return self.held
        else:
            self.planner.acquire(self, slots, lambda: self.slots(profile).total, self.timeout, profile)
        self.held, self.key, self._profile = slots, profile_key(profile), profile
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


def task_slot_total(session: Any, profile: Any = None) -> int:
    """Task slots of ``session``'s cluster (for ``profile``), held or not."""
    from sparktf.spark.sessions import session_kind

    return session_kind(session).slots(profile).total


@contextlib.contextmanager
def call_scope(kind: Any, what: str) -> Iterator[Call]:
    """Register a call of this thread for its duration: its tag on the thread's jobs, its slots given back at the end.

    Ctrl-C (in the main thread) cancels every registered call's jobs; a
    ``KeyboardInterrupt`` inside the scope cancels this call's.
    """
    planner = session_state(kind).planner
    call = Call(planner, kind, what, current_label())
    install_interrupt_handler()
    planner.register(call)
    kind.add_tag(call.tag)
    try:
        yield call
    except KeyboardInterrupt:
        planner.interrupt()
        cancel_in_background([planner])
        raise
    except Exception as error:
        if call.interrupted and not isinstance(error, CancelledError):
            raise call.cancelled() from error  # the job Ctrl-C cancelled failed; say why
        raise
    finally:
        call.release()
        planner.unregister(call)
        with contextlib.suppress(Exception):  # a dead session's error is already on its way
            kind.remove_tag(call.tag)
