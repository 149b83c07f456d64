"""Task slots for the barrier job: checked before it starts, so a job that cannot fit fails at once.

Spark's own check for a barrier stage that does not fit retries for minutes.
"""

from __future__ import annotations

import time

from sparktf.errors import SparkTFError
from sparktf.spark.session_kind import SessionKind

__all__ = ["check_task_slots"]

_POLL_S = 0.5


def check_task_slots(kind: SessionKind, needed: int) -> None:
    """Return once the cluster runs ``needed`` tasks at once; raise ``SparkTFError`` if it does not.

    With ``local[N]`` the slots are known at once. On a cluster, executors
    that are still registering (a session that just started) are waited
    for, at most ``kind.executor_wait`` seconds.
    """
    executor_wait = 0.0 if kind.is_local else kind.executor_wait
    deadline = time.monotonic() + executor_wait
    slots = kind.task_slots()
    while slots < needed and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        slots = kind.task_slots()
    if slots < needed:
        waited = f" after waiting {executor_wait:g} s for executors" if executor_wait else ""
        raise SparkTFError(
            f"sparktf.run needs {needed} tasks running at once (num_workers={needed}) but the cluster runs at "
            f"most {slots}{waited} (executors x cores / spark.task.cpus, and task resources such as GPUs); "
            "lower num_workers or add executors or cores"
        )
