"""Ctrl-C in the driver cancels every running sparktf call, in every thread.

While a call runs, this module's ``SIGINT`` handler (installed from the main
thread, chained to the one it finds: PySpark's cancels the SparkContext's
jobs) marks every call of every session's planner cancelled and cancels
their jobs by their call tags, so calls running in other threads stop
instead of relaunching, and the interrupt goes on in the main thread at once.
A call may be between two jobs when Ctrl-C comes and submit its next one
before it sees its flag: the cancelling goes on, every
:data:`~sparktf.spark.slot_admission.POLL_SECONDS`, until every cancelled
call has ended (at most :data:`INTERRUPT_CANCEL_SECONDS`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Any, List

from sparktf.spark.session_state import every_state
from sparktf.spark.slot_admission import POLL_SECONDS, SlotPlanner

__all__ = ["install_interrupt_handler", "interrupt_every_call", "cancel_in_background", "INTERRUPT_CANCEL_SECONDS"]

#: Seconds the jobs of cancelled calls that have not ended yet are cancelled again (jobs they submit late).
INTERRUPT_CANCEL_SECONDS = 300.0


def interrupt_every_call() -> None:
    """What Ctrl-C does: mark every call of every session cancelled, then cancel their jobs until they end."""
    planners = [state.planner for state in every_state()]
    for planner in planners:
        planner.interrupt()  # flags first, in the handler itself: the calls must not relaunch what gets cancelled
    cancel_in_background(planners)


def cancel_in_background(planners: List[SlotPlanner]) -> None:
    """Cancel the interrupted calls' jobs now and again until those calls end (see the module docstring)."""
    def cancel_until_ended() -> None:
        deadline = time.monotonic() + INTERRUPT_CANCEL_SECONDS
        while sum(planner.cancel_jobs() for planner in planners) and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)

    threading.Thread(target=cancel_until_ended, name="sparktf-interrupt", daemon=True).start()


class _InterruptHandler:
    """``SIGINT``: cancel every sparktf call, then whatever handler was there (PySpark's, or the default)."""

    def __init__(self, previous: Any):
        self.previous = previous

    def __call__(self, signum: int, frame: Any) -> None:
        interrupt_every_call()
        if callable(self.previous):
            self.previous(signum, frame)
        else:
            raise KeyboardInterrupt


def install_interrupt_handler() -> None:
    """Chain the handler before the current ``SIGINT`` handler (main thread only; once)."""
    if threading.current_thread() is not threading.main_thread():
        return
    with contextlib.suppress(ValueError, TypeError):  # no signals here (an embedded interpreter)
        current = signal.getsignal(signal.SIGINT)
        if not isinstance(current, _InterruptHandler) and current not in (signal.SIG_IGN, None):
            signal.signal(signal.SIGINT, _InterruptHandler(current))
