"""What sparktf keeps per Spark session on the driver, in one place.

One :class:`SessionState` per SparkContext (classic) or Connect session: the
:class:`~sparktf.spark.slot_admission.SlotPlanner` of its calls, the
package zip shipped to its executors, its failure inbox, and what to release
when it stops. It lives as long as the session object (kept weakly keyed by
it, never as an attribute on it); :func:`every_state` is what Ctrl-C's
handler walks.

PySpark has no stop hook, and sparktf does not replace the session's
``stop``: a stopped session's state is released when the next state is
looked up (``init_spark`` starting the next session does), when the session
object is collected, or at exit, whichever comes first.
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

from sparktf.collective.failure_inbox import FailureInbox
from sparktf.errors import ConfigurationError
from sparktf.spark.slot_admission import SlotPlanner

__all__ = ["SessionState", "session_state", "every_state", "failure_inbox", "at_stop"]

logger = logging.getLogger(__name__)


@dataclass
class SessionState:
    """The driver's state of one Spark session.

    Attributes
    ----------
    stopped : callable
        ``stopped(holder)``: whether the session object ``holder`` was stopped.
    planner : SlotPlanner
        Admission of the task slots its concurrent calls hold.
    shipped_package : str or None
        The zip of the ``sparktf`` package added to its executors' Python path, once shipped.
    inbox : FailureInbox or None
        Where its plain Spark tasks send their failure records, once opened.
    releases : list of callable
        Run once the session stopped (e.g. removing the shipped package's folder).
    """

    stopped: Callable[[Any], bool]
    planner: SlotPlanner = field(default_factory=SlotPlanner)
    shipped_package: Optional[str] = None
    inbox: Optional[FailureInbox] = None
    releases: List[Callable[[], None]] = field(default_factory=list)

    def release(self) -> None:
        """Close the inbox and run the releases (each once; one failing does not stop the others)."""
        if self.inbox is not None:
            self.inbox.close()
        releases, self.releases = self.releases, []
        for release in releases:
            try:
                release()
            except Exception as error:  # cleaning up after a stopped session must not fail the next one
                logger.warning("could not release a stopped Spark session's %s: %s", release, error)


_STATES: "weakref.WeakKeyDictionary[Any, SessionState]" = weakref.WeakKeyDictionary()
_RELEASERS: "weakref.WeakKeyDictionary[Any, weakref.finalize]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def session_state(kind: Any) -> SessionState:
    """The :class:`SessionState` of ``kind``'s session (a ``SessionKind``), made on first use.

    Releases the states of sessions stopped since the last call.
    """
    with _LOCK:
        for holder, state in list(_STATES.items()):
            if state.stopped(holder):
                _RELEASERS.pop(holder)()  # runs state.release once, and no more at exit
                del _STATES[holder]
        state = _STATES.get(kind.holder)
        if state is None:
            state = _STATES[kind.holder] = SessionState(type(kind).holder_stopped)
            _RELEASERS[kind.holder] = weakref.finalize(kind.holder, state.release)  # collected, or at exit
        return state


def at_stop(kind: Any, release: Callable[[], None]) -> None:
    """Run ``release`` once ``kind``'s session has stopped (see the module's docstring for when)."""
    session_state(kind).releases.append(release)


def every_state() -> List[SessionState]:
    """The states of the sessions alive now (safe in a signal handler: it takes no lock)."""
    return list(_STATES.values())


def failure_inbox(kind: Any) -> Optional[FailureInbox]:
    """The failure inbox of ``kind``'s session, opened on first use; None where executors cannot reach the driver.

    That is ``spark.sparktf.rendezvous=barrier``, or a driver address this
    process cannot listen on (a Connect client on another machine).
    """
    state = session_state(kind)
    if state.inbox is not None:
        return state.inbox
    try:
        host = kind.task_listener_host()
    except ConfigurationError as error:
        logger.info("sparktf's tasks cannot report failures to this driver (%s)", error)
        return None
    if host is None:
        return None
    with _LOCK:
        if state.inbox is None:
            state.inbox = FailureInbox(host)
        return state.inbox
