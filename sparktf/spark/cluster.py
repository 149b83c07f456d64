"""Cluster resources: free task slots for a barrier job, TensorFlow threads per task, the watchdog's slack, memory settings.

Spark's own check for a barrier stage that does not fit retries for minutes;
sparktf fails within seconds instead, naming the numbers.
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from pyspark import SparkContext

from sparktf.errors import ConfigurationError, SparkTFError
from sparktf.spark.resources import describe_profile

__all__ = [
    "TaskSlots",
    "task_slots",
    "total_task_slots",
    "busy_task_slots",
    "wait_for_free_slots",
    "slot_shortage",
    "configure_task_threads",
    "use_task_threads",
    "WATCHDOG_SLACK_CONF",
    "watchdog_slack",
    "TRAIN_DATA_MEMORY_CONF",
    "train_data_memory",
    "size_setting",
]

_LOG = logging.getLogger(__name__)
WATCHDOG_SLACK_CONF = "spark.sparktf.watchdogSlack"


def total_task_slots(sc: SparkContext, profile: Any = None) -> int:
    """How many tasks of ``profile`` the cluster runs at once.

    ``profile`` is a registered ``ResourceProfile`` (see
    :func:`sparktf.spark.resources.stage_profile`); None counts the session's default profile.
    """
    scala_context = sc._jsc.sc()
    java_profile = (profile._java_resource_profile if profile is not None
                    else scala_context.resourceProfileManager().defaultResourceProfile())
    return int(scala_context.maxNumConcurrentTasks(java_profile))


def busy_task_slots(sc: SparkContext) -> dict:
    """Running tasks per executor, from the executors' own counts.

    Unlike the active stages' counts, this includes a task whose stage is
    over but whose Python worker is still running (a cancelled barrier task
    stuck in TensorFlow), which keeps its slot.
    """
    infos = sc._jsc.sc().statusTracker().getExecutorInfos()
    busy = {}
    for info in infos:
        if info.numRunningTasks() > 0:
            busy[f"{info.host()}:{info.port()}"] = int(info.numRunningTasks())
    return busy


@dataclass(frozen=True)
class TaskSlots:
    """The cluster's task slots at one moment.

    Attributes
    ----------
    total : int
        Tasks of the counted resource profile the live executors run at once
        (an executor being removed no longer counts).
    busy : dict
        Running tasks per executor (``"host:port"``), see :func:`busy_task_slots`.
    profile : str
        The resource profile counted, described for messages (empty: the
        session's defaults).
    """

    total: int
    busy: Dict[str, int]
    profile: str = ""

    @property
    def free(self) -> int:
        """Slots a barrier job could take now."""
        return self.total - sum(self.busy.values())

    def describe_busy(self) -> str:
        """``"host:port runs 1, ..."`` for a message (empty when nothing runs)."""
        return ", ".join(f"{executor} runs {count}" for executor, count in sorted(self.busy.items()))


def task_slots(sc: SparkContext, profile: Any = None) -> TaskSlots:
    """The total and busy task slots right now, counted for ``profile`` (default: the session's)."""
    described = describe_profile(profile) if profile is not None else ""
    return TaskSlots(total_task_slots(sc, profile), busy_task_slots(sc), described)


def wait_for_free_slots(
    kind: Any, num_workers: int, timeout: float = 0.0, probe: Optional[Callable[[], TaskSlots]] = None
) -> None:
    """Return once ``num_workers`` barrier tasks can start; raise ``SparkTFError`` otherwise.

    A cluster with fewer task slots in total fails at once. Slots taken by
    running tasks (e.g. those of a failed job that Spark or sparktf is still
    ending) are waited for, at most ``timeout`` seconds.

    Parameters
    ----------
    kind : SessionKind
        The session that will run the barrier job.
    num_workers : int
        Number of barrier tasks (one per training worker).
    timeout : float
        Seconds to wait for busy slots to be released; 0 checks once.
    probe : callable, optional
        Returns the :class:`TaskSlots` to check (default: ``kind.slots()``).
    """
    probe = probe or kind.slots
    deadline = time.monotonic() + timeout
    while True:
        slots = probe()
        if num_workers <= slots.free:
            return
        if slots.total < num_workers or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    raise slot_shortage(kind, "num_workers", num_workers, slots, timeout)


def slot_shortage(kind: Any, setting: str, needed: int, slots: TaskSlots, waited: float = 0.0) -> SparkTFError:
    """The error for ``needed`` barrier tasks that ``slots`` cannot hold, naming ``setting`` (e.g. ``"num_workers"``).

    Parameters
    ----------
    kind : SessionKind
    setting : str
        The parameter that asked for ``needed`` workers.
    needed : int
    slots : TaskSlots
        What the cluster had.
    waited : float
        Seconds waited for busy slots (said when the slots exist but are busy).
    """
    busy = slots.describe_busy()
    return SparkTFError(
        f"{setting}={needed} training workers need {needed} free task slots, "
        f"but the cluster has only {slots.free} free (of {slots.total} in total, "
        + (f"for {slots.profile}" if slots.profile else
           f"at spark.task.cpus={kind.conf.get('spark.task.cpus', '1')} cores each")
        + (f"; busy: {busy}" if busy else "") + "). "
        + (f"Use {setting} <= {slots.total}, or add executors / cores." if slots.total < needed else
           f"The busy slots were not released within {waited:g} s: end the Spark jobs that hold them.")
    )


def configure_task_threads(cpus: int) -> int:
    """Make TensorFlow in this Python worker use ``cpus`` intra-op and inter-op threads.

    Must run before TensorFlow initialises its runtime in the process. In a
    reused Python worker where it already did with other values, the old values
    stay (TensorFlow cannot change them) and a warning is logged.

    Returns
    -------
    int
        The intra-op thread count in effect.
    """
    import tensorflow as tf

    threading = tf.config.threading
    try:
        threading.set_intra_op_parallelism_threads(cpus)
        threading.set_inter_op_parallelism_threads(cpus)
    except RuntimeError:
        current = threading.get_intra_op_parallelism_threads()
        if current != cpus:
            _LOG.warning(
                "TensorFlow was already initialised in this Python worker with %d intra-op "
                "threads; keeping them instead of spark.task.cpus=%d",
                current,
                cpus,
            )
    return threading.get_intra_op_parallelism_threads()


def use_task_threads() -> None:
    """:func:`configure_task_threads` for this Spark task's ``spark.task.cpus``; nothing outside a task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is not None:
        configure_task_threads(context.cpus())


def watchdog_slack(kind: Any) -> float:
    """Seconds beyond ``collective_timeout`` that a task may make no progress before its job is cancelled.

    ``spark.sparktf.watchdogSlack`` (default 30), read from this thread's
    local properties (``sc.setLocalProperty``: for the jobs this thread
    starts; classic sessions) or else from the session's settings.

    Raises
    ------
    ConfigurationError
        The value is not a number of seconds >= 0.
    """
    return seconds_setting(kind, WATCHDOG_SLACK_CONF, 30.0)


def seconds_setting(kind: Any, key: str, default: float) -> float:
    """Seconds of the setting ``key`` (``"90"`` or ``"90s"``), read from this thread's local properties or else
    from the session's settings.

    Raises
    ------
    ConfigurationError
        The value is not a number of seconds >= 0.
    """
    text = str(kind.setting(key, str(default)))
    try:
        seconds = float(text.strip().removesuffix("s"))
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ConfigurationError(f"{key} must be a number of seconds >= 0, got {text!r}")
    return seconds


TRAIN_DATA_MEMORY_CONF = "spark.sparktf.trainDataMemory"
DEFAULT_TRAIN_DATA_MEMORY = "512m"
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def train_data_memory(kind: Any) -> int:
    """Bytes of training records one training worker may hold in memory.

    ``spark.sparktf.trainDataMemory`` (a Spark size string such as ``512m``
    or ``2g``; plain numbers are bytes; default 512m), read from this
    thread's local properties or else from the session's settings.
    A worker whose shard is larger streams it through a bounded shuffle window.

    Raises
    ------
    ConfigurationError
        The value is not a positive size.
    """
    return size_setting(kind, TRAIN_DATA_MEMORY_CONF, DEFAULT_TRAIN_DATA_MEMORY)


def size_setting(kind: Any, key: str, default: str) -> int:
    """Bytes of the size setting ``key`` (a Spark size string such as ``512m``; plain numbers are bytes), read
    from this thread's local properties or else from the session's settings.

    Raises
    ------
    ConfigurationError
        The value is not a positive size.
    """
    text = kind.setting(key, default)
    match = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)b?\s*", text.lower())
    size = int(match.group(1)) * _SIZE_UNITS[match.group(2)] if match else 0
    if size <= 0:
        raise ConfigurationError(f"{key} must be a positive size such as 512m or 2g, got {text!r}")
    return size
