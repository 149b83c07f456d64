"""What sparktf keeps per Spark session on the driver, in one place.

One :class:`SessionState` per SparkContext (classic) or Connect session: the
:class:`~sparktf.spark.slot_admission.SlotPlanner` of its calls and the
package zip shipped to its executors. It lives as long as the session object
(kept weakly keyed by it, never as an attribute on it); :func:`every_state`
is what Ctrl-C's handler walks.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, List, Optional

from sparktf.spark.slot_admission import SlotPlanner

__all__ = ["SessionState", "session_state", "every_state"]


@dataclass
class SessionState:
    """The driver's state of one Spark session.

    Attributes
    ----------
    planner : SlotPlanner
        Admission of the task slots its concurrent calls hold.
    shipped_package : str or None
        The zip of the ``sparktf`` package added to its executors' Python path, once shipped.
    """

    planner: SlotPlanner = field(default_factory=SlotPlanner)
    shipped_package: Optional[str] = None


_STATES: "weakref.WeakKeyDictionary[Any, SessionState]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def session_state(kind: Any) -> SessionState:
    """The :class:`SessionState` of ``kind``'s session (a ``SessionKind``), made on first use."""
    with _LOCK:
        state = _STATES.get(kind.holder)
        if state is None:
            state = _STATES[kind.holder] = SessionState()
        return state


def every_state() -> List[SessionState]:
    """The states of the sessions alive now (safe in a signal handler: it takes no lock)."""
    return list(_STATES.values())
