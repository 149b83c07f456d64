"""The barrier task on an executor: reserve a port, agree on ``TF_CONFIG``, run the child.

Runs inside Spark's Python worker, which is reused across tasks, so it never
imports TensorFlow itself; the user's program runs in a fresh child process.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

from pyspark import BarrierTaskContext

from sparktf.launch import failures
from sparktf.launch.child import ChildProcess
from sparktf.launch.context import RunContext
from sparktf.launch.logstream import LogClient
from sparktf.launch.ports import PortReservation
from sparktf.launch.tf_config import build_tf_config
from sparktf.spark.task_devices import inherited_visible_devices, visible_devices

__all__ = ["TaskSpec", "run_barrier_task", "child_environment"]

_DONE_POLL_S = 0.05
#: Seconds a child gets to exit once released (it polls for the release every 20 ms).
_EXIT_AFTER_RELEASE_S = 60.0


@dataclass(frozen=True)
class TaskSpec:
    """What every barrier task of one ``sparktf.run`` call gets from the driver."""

    program: bytes
    num_tasks: int
    master_node: Optional[str]
    log_address: Tuple[str, int]
    log_secret: bytes
    env: Dict[str, str]
    timeout: Optional[float]
    default_fs: str
    working_dir: str
    log_dir: Optional[str]


def child_environment(ctx: RunContext, user_env: Dict[str, str]) -> Dict[str, str]:
    """The child's environment: the task's, plus its ``sys.path``, GPUs, ``user_env`` and ``TF_CONFIG``.

    ``CUDA_VISIBLE_DEVICES`` comes from the task's Spark ``gpu`` resources,
    indexed into the executor's own ``CUDA_VISIBLE_DEVICES`` when it has one
    (``user_env`` may override it); ``TF_CONFIG`` always comes from sparktf.
    ``PYTHONPATH`` carries the worker's ``sys.path``, so the child imports
    what the task can (files shipped with ``--py-files``, sparktf's own zip).
    """
    env = dict(os.environ)
    path = [entry for entry in sys.path if entry and os.path.exists(entry)]
    path += [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    env["PYTHONUNBUFFERED"] = "1"
    if ctx.gpus:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices(ctx.gpus, inherited_visible_devices())
    env.update(user_env)
    env["TF_CONFIG"] = json.dumps(ctx.tf_config)
    return env


def _task_gpus(barrier: BarrierTaskContext) -> List[str]:
    gpu = barrier.resources().get("gpu")
    return list(gpu.addresses) if gpu is not None else []


def _wait_for_every_rank(child: ChildProcess, barrier: BarrierTaskContext, done_path: str, release_path: str,
                         timeout: Optional[float]) -> Tuple[Optional[int], Optional[str]]:
    """The child's exit code and why it failed, if it did, once every rank's ``main_fun`` returned.

    A child whose program returned waits for the release (see ``bootstrap``):
    the task creates it after Spark's barrier, which every task reaches once
    its own child's program returned. A failed child fails its task, and
    Spark then ends the barrier stage's other tasks.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    exit_code = None
    while exit_code is None and not os.path.exists(done_path):
        left = _DONE_POLL_S if deadline is None else min(_DONE_POLL_S, deadline - time.monotonic())
        if left <= 0:
            return None, f"timeout: still running after {timeout:g} s; killed"
        exit_code = child.wait(left)
    if exit_code not in (None, 0):
        return exit_code, None
    barrier.barrier()
    open(release_path, "w").close()
    exit_code = child.wait(_EXIT_AFTER_RELEASE_S) if exit_code is None else exit_code
    if exit_code is None:
        return None, f"still running {_EXIT_AFTER_RELEASE_S:g} s after its program returned; killed"
    return exit_code, None


def _run_child(spec: TaskSpec, ctx: RunContext, barrier: BarrierTaskContext) -> Optional[bytes]:
    """Run ``main_fun`` in a child; rank 0's pickled return value, None on other ranks."""
    scratch = tempfile.mkdtemp(prefix="sparktf-run-")
    try:
        program_path, result_path, done_path, release_path = (
            os.path.join(scratch, name) for name in ("program.pkl", "result.pkl", "done", "release"))
        with open(program_path, "wb") as file:
            pickle.dump((ctx, spec.program), file)
        log = LogClient(spec.log_address, spec.log_secret)
        try:
            child = ChildProcess([program_path, result_path, done_path, release_path],
                                 child_environment(ctx, spec.env), ctx.role, log)
            try:
                exit_code, reason = _wait_for_every_rank(child, barrier, done_path, release_path, spec.timeout)
            finally:
                child.close()
            if exit_code != 0:
                message = failures.failure_message(ctx.role, exit_code, list(child.tail), reason)
                log.report_failure(message)  # the driver raises it; Spark's copy of the text is for its own logs
                raise RuntimeError(message)
        finally:
            log.close()
        if ctx.worker_num == 0 and os.path.exists(result_path):
            with open(result_path, "rb") as file:
                return file.read()
        return None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_barrier_task(spec: TaskSpec, _partition: Iterable[int]) -> Iterator[Optional[bytes]]:
    """The ``mapPartitions`` function of the barrier job: yields rank 0's result (None elsewhere)."""
    barrier = BarrierTaskContext.get()
    rank = barrier.partitionId()
    host = barrier.getTaskInfos()[rank].address.rsplit(":", 1)[0]
    with PortReservation() as reservation:
        addresses = barrier.allGather(f"{host}:{reservation.port}")
        tf_config = build_tf_config(addresses, rank, spec.master_node)
        ctx = RunContext(
            job_name=tf_config["task"]["type"],
            task_index=tf_config["task"]["index"],
            worker_num=rank,
            num_workers=spec.num_tasks,
            cluster_spec=tf_config["cluster"],
            executor_id=rank,
            default_fs=spec.default_fs,
            working_dir=spec.working_dir,
            tf_config=tf_config,
            log_dir=spec.log_dir,
            gpus=_task_gpus(barrier),
        )
        yield _run_child(spec, ctx, barrier)
