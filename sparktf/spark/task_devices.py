"""Each Spark task's TensorFlow on that task's own GPUs, and on ``spark.task.cpus`` threads.

Spark gives a task GPU addresses (``TaskContext.resources()["gpu"]``) but
runs it in a reused Python worker, and TensorFlow reads
``CUDA_VISIBLE_DEVICES`` once, when it first looks for devices in the
process. So every sparktf task that runs TensorFlow (a training segment,
evaluation, prediction, TFNet, TFRecord parsing) first calls
:func:`prepare_tensorflow_task`, before any TensorFlow op:

* a worker whose TensorFlow has not looked for devices yet is bound to the
  task's GPUs: ``CUDA_VISIBLE_DEVICES`` is set to them (indexed into the
  executor's own ``CUDA_VISIBLE_DEVICES`` when it has one);
* a worker already bound to the same GPUs just goes on (executors with one GPU
  keep their workers, TensorFlow and cached models across tasks);
* where a later task on the executor may get other GPUs (an executor with
  more GPUs than one task takes), the worker ends after its task instead of
  being reused (:func:`~sparktf.spark.worker_reuse.end_worker_after_task`),
  so the next task starts in a fresh worker;
* tasks that share a GPU (a fractional ``spark.task.resource.gpu.amount``)
  get ``TF_FORCE_GPU_ALLOW_GROWTH=true`` unless it is set, so the first does
  not take the whole GPU's memory.

Without ``gpu`` resources nothing changes. The driver decides what may happen
to a stage's workers (:func:`gpu_plan`) and ships the :class:`GpuPlan` with
the task.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from sparktf.errors import SparkTFError
from sparktf.spark.cluster import use_task_threads
from sparktf.spark.worker_logging import configure_worker_logging
from sparktf.spark.worker_reuse import end_worker_after_task
from sparktf.tf_startup import list_devices, quietly

__all__ = [
    "GpuPlan",
    "gpu_plan",
    "visible_devices",
    "inherited_visible_devices",
    "bind_task_gpus",
    "prepare_tensorflow_task",
]

_LOG = logging.getLogger(__name__)
VISIBLE = "CUDA_VISIBLE_DEVICES"
ALLOW_GROWTH = "TF_FORCE_GPU_ALLOW_GROWTH"


@dataclass(frozen=True)
class GpuPlan:
    """The GPUs of one stage's tasks, decided on the driver.

    Attributes
    ----------
    per_task : float
        ``gpu`` amount each task asks for (0: no GPU scheduling).
    per_executor : int
        ``gpu`` amount of each executor.
    """

    per_task: float = 0.0
    per_executor: int = 0

    @property
    def reuses_workers(self) -> bool:
        """Whether every task of an executor gets the same GPUs, so a bound worker can serve the next one."""
        return self.per_executor <= max(1, math.ceil(self.per_task))

    @property
    def shares_gpus(self) -> bool:
        """Whether several tasks run on one GPU at once."""
        return 0 < self.per_task < 1


def _gpu_amount(requests: Any) -> Optional[float]:
    request = (requests or {}).get("gpu")
    return float(request.amount) if request is not None else None


def gpu_plan(conf: Any, profile: Any = None) -> GpuPlan:
    """The :class:`GpuPlan` of a stage run with ``profile`` (a ``ResourceProfile``; None: the session's default).

    ``conf`` is the session's settings (``SessionKind.conf``, ``sc.getConf()``).

    A profile's own task or executor ``gpu`` request wins over the
    application's ``spark.task.resource.gpu.amount`` and
    ``spark.executor.resource.gpu.amount``.
    """
    per_task = _gpu_amount(profile.taskResources) if profile is not None else None
    per_executor = _gpu_amount(profile.executorResources) if profile is not None else None
    if per_task is None:
        per_task = float(conf.get("spark.task.resource.gpu.amount", "0"))
    if per_executor is None:
        per_executor = float(conf.get("spark.executor.resource.gpu.amount", "0"))
    return GpuPlan(per_task=per_task, per_executor=int(per_executor))


def visible_devices(addresses: Sequence[str], inherited: Optional[str]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a task given ``addresses`` by Spark.

    Parameters
    ----------
    addresses : sequence of str
        The task's ``gpu`` resource addresses.
    inherited : str, optional
        The executor's own ``CUDA_VISIBLE_DEVICES`` (e.g. set by YARN or a
        container runtime). An address that is an index into it is replaced
        by the entry at that index; one that is an entry itself stays.

    Raises
    ------
    SparkTFError
        An address is neither an index into nor an entry of ``inherited``.
    """
    if not inherited:
        return ",".join(addresses)
    entries = [entry.strip() for entry in inherited.split(",") if entry.strip()]
    mapped = []
    for address in addresses:
        if address.isdigit() and int(address) < len(entries):
            mapped.append(entries[int(address)])
        elif address in entries:
            mapped.append(address)
        else:
            raise SparkTFError(
                f"Spark gave this task GPU address {address!r}, which is neither an index into nor an entry of "
                f"the executor's CUDA_VISIBLE_DEVICES={inherited!r}. Make the GPU discovery script report "
                "indices into CUDA_VISIBLE_DEVICES (or the same IDs), or unset CUDA_VISIBLE_DEVICES for executors"
            )
    return ",".join(mapped)


_bound: Optional[str] = None  # the CUDA_VISIBLE_DEVICES this process's TensorFlow was bound to
_inherited: Optional[str] = None  # the process's own CUDA_VISIBLE_DEVICES before the binding


def inherited_visible_devices() -> Optional[str]:
    """The executor's ``CUDA_VISIBLE_DEVICES``, as it was before a task bound this worker."""
    return _inherited if _bound is not None else os.environ.get(VISIBLE)


def _tensorflow_found_devices() -> bool:
    """Whether TensorFlow has looked for devices in this process (it then ignores ``CUDA_VISIBLE_DEVICES``)."""
    if "tensorflow" not in sys.modules:
        return False
    from tensorflow.python.eager import context

    return getattr(context.context(), "_physical_devices", None) is not None


def _cannot_switch(current: Optional[str], wanted: str) -> SparkTFError:
    return SparkTFError(
        f"this Python worker's TensorFlow already runs with CUDA_VISIBLE_DEVICES={current!r}, but Spark gave "
        f"this task GPU(s) {wanted!r}, and TensorFlow cannot move to other GPUs in a running process. "
        "Code outside sparktf started TensorFlow in this worker first, or this PySpark cannot end such workers "
        "(sparktf needs PySpark 4.3+ for that): set spark.python.worker.reuse=false, or give each executor "
        "one GPU (spark.executor.resource.gpu.amount=1)"
    )


def bind_task_gpus(plan: GpuPlan) -> Optional[str]:
    """Bind this worker's TensorFlow to the running task's GPUs (see the module docstring).

    Returns
    -------
    str or None
        The ``CUDA_VISIBLE_DEVICES`` in effect; None when the task has no GPUs
        (or there is no task), which leaves everything as it was.

    Raises
    ------
    SparkTFError
        TensorFlow in this process already runs on other GPUs.
    """
    global _bound, _inherited
    from pyspark import TaskContext

    context = TaskContext.get()
    gpu = context.resources().get("gpu") if context is not None else None
    if gpu is None or not gpu.addresses:
        return None
    inherited = inherited_visible_devices()
    wanted = visible_devices(list(gpu.addresses), inherited)
    if _bound is None:
        if _tensorflow_found_devices() and os.environ.get(VISIBLE) != wanted:
            raise _cannot_switch(os.environ.get(VISIBLE), wanted)
        _bound, _inherited = wanted, inherited
        os.environ[VISIBLE] = wanted
        if plan.shares_gpus:
            os.environ.setdefault(ALLOW_GROWTH, "true")
        _LOG.debug("TensorFlow in this worker runs on GPU(s) %s", wanted)
    elif _bound != wanted:
        raise _cannot_switch(_bound, wanted)
    if not plan.reuses_workers and not end_worker_after_task():
        _LOG.warning("this PySpark cannot end a Python worker bound to GPU(s) %s: a later task given other "
                     "GPUs will fail in it (set spark.python.worker.reuse=false)", wanted)
    return wanted


def prepare_tensorflow_task(plan: Optional[GpuPlan]) -> None:
    """Before a Spark task runs TensorFlow: its GPUs (:func:`bind_task_gpus`) and ``spark.task.cpus`` threads.

    TensorFlow then lists its devices; both with its start-up lines filtered.
    The worker's ``sparktf`` loggers write to the executor's log from here on
    (:func:`~sparktf.spark.worker_logging.configure_worker_logging`).
    Nothing happens outside a Spark task.
    """
    from pyspark import TaskContext

    if TaskContext.get() is None:
        return
    configure_worker_logging()
    bind_task_gpus(plan or GpuPlan())
    with quietly():  # TensorFlow's runtime starts here: its start-up lines stay out of the worker's output
        use_task_threads()
        if not _tensorflow_found_devices():
            list_devices()
