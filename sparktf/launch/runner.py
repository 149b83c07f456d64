"""``sparktf.run``, driver side: checks, the log server, the barrier job, the result or the error."""

from __future__ import annotations

import functools
import logging
import math
import numbers
import os
import sys
import threading
import uuid
from typing import Any, Callable, Mapping, Optional

import cloudpickle
from sparktf.context import init_spark
from sparktf.errors import SparkTFError
from sparktf.launch.context import absolute_path
from sparktf.launch.logstream import LogServer
from sparktf.launch.program import pickle_program
from sparktf.launch.slots import check_task_slots
from sparktf.launch.task import TaskSpec, run_barrier_task
from sparktf.spark.sessions import session_kind
from sparktf.spark.calls import call_scope

__all__ = ["run"]

_LOG = logging.getLogger("sparktf.run")
_PRINT_LOCK = threading.Lock()
_MAX_SPARK_ERROR_LINES = 30


def _print_child_line(line: str, label: Optional[str] = None) -> None:
    """Show one line of a child on the driver: printed to stdout (after ``[label]`` for a call running beside
    others), and on the ``sparktf.run`` logger at DEBUG."""
    if label is not None:
        line = f"[{label}] {line}"
    with _PRINT_LOCK:
        print(line, file=sys.stdout, flush=True)
    _LOG.debug("%s", line)


def _check_arguments(main_fun, num_workers, num_ps, master_node, env, timeout) -> None:
    if not callable(main_fun):
        raise TypeError(f"main_fun must be a function main_fun(args, ctx), got {main_fun!r}")
    if num_workers is not None and not (isinstance(num_workers, numbers.Integral) and num_workers >= 1):
        raise ValueError(
            f"num_workers must be a positive integer (or None for sc.defaultParallelism), got {num_workers!r}"
        )
    if not (isinstance(num_ps, numbers.Integral) and num_ps >= 0):
        raise ValueError(f"num_ps must be an integer >= 0, got {num_ps!r}")
    if num_ps > 0:
        raise NotImplementedError(
            f"sparktf.run does not start parameter servers (num_ps={num_ps}). ParameterServerStrategy needs "
            "a coordinator process driving ps and worker servers that serve until they are killed "
            "(server.join()); Spark barrier tasks must end, and the coordinator would not run in one. "
            "Run the program with MultiWorkerMirroredStrategy and num_ps=0 (for the TensorFlow models "
            "ResNet examples: --ds=multi_worker_mirrored)."
        )
    if master_node not in (None, "chief"):
        raise ValueError(
            f"master_node must be None or 'chief', got {master_node!r}; for a program that reads a "
            "'master' task from TF_CONFIG use master_node='chief' and sparktf.launch.tf_config.master_to_chief"
        )
    if env is not None:
        if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise TypeError(f"env must map str to str, got {env!r}")
        if "TF_CONFIG" in env:
            raise ValueError("env must not set TF_CONFIG: sparktf.run writes it for every task")
    if timeout is not None and not (isinstance(timeout, numbers.Real) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be None or a positive number of seconds, got {timeout!r}")


def _spark_failure(error: Exception) -> SparkTFError:
    """The ``SparkTFError`` for a barrier job that failed without a child's failure: Spark's message, short."""
    lines = [line for line in str(error).splitlines() if line.strip() and not line.lstrip().startswith("at ")]
    return SparkTFError(
        "sparktf.run: the barrier job failed outside main_fun:\n" + "\n".join(lines[:_MAX_SPARK_ERROR_LINES])
    )


def run(
    main_fun: Callable[[Any, Any], Any],
    args: Any = None,
    num_workers: Optional[int] = None,
    num_ps: int = 0,
    master_node: Optional[str] = None,
    tensorboard: bool = False,
    log_dir: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    timeout: Optional[float] = None,
) -> Any:
    """Run a ``tf.distribute`` program, ``main_fun(args, ctx)``, on Spark executors with ``TF_CONFIG``.

    Starts ``num_workers`` Spark barrier tasks; each starts a fresh child
    Python process (``sys.executable``) that calls ``main_fun(args, ctx)`` with
    ``TF_CONFIG`` set for its role. The children's output is printed on the
    driver as it is written, each line prefixed with its role
    (``[worker 1] ...``), and also logged on the ``sparktf.run`` logger at
    DEBUG level.

    Parameters
    ----------
    main_fun : callable
        ``main_fun(args, ctx)``; ``ctx`` is a ``sparktf.launch.context.RunContext``.
        Pickled with cloudpickle (by value when its module is not an installed
        package); it imports TensorFlow itself.
    args : any, optional
        Passed to ``main_fun`` as is (e.g. an ``argparse.Namespace``); must pickle.
    num_workers : int, optional
        Number of tasks (default ``sc.defaultParallelism``); at most the
        cluster's task slots.
    num_ps : int
        Parameter server tasks; must be 0 (see Raises).
    master_node : {None, "chief"}
        None: every task is a ``worker`` (index = rank). ``"chief"``: task 0
        is ``chief`` 0 and the others are ``worker`` 0 .. n-2.
    tensorboard : bool
        Give the program a TensorBoard directory in ``ctx.log_dir``
        (``log_dir``, or ``tensorboard`` under the working directory). sparktf
        starts no TensorBoard server; run ``tensorboard --logdir`` on it.
    log_dir : str, optional
        Summary directory for ``ctx.log_dir`` (resolved with ``ctx.absolute_path``).
    env : mapping of str to str, optional
        Extra environment variables of the children, set before the program
        starts (e.g. ``{"TF_USE_LEGACY_KERAS": "1"}``); may override
        ``CUDA_VISIBLE_DEVICES``, must not set ``TF_CONFIG``.
    timeout : float, optional
        Seconds each child may run; a child still running then is killed and
        the call raises. None: no limit on the program itself.

    Returns
    -------
    any
        What ``main_fun`` returned in task 0 (the chief with
        ``master_node="chief"``); at most 32 MiB pickled.

    Raises
    ------
    SparkTFError
        A child failed (the message names its role and exit and holds its
        last traceback), a child ran past ``timeout``, or the cluster has
        fewer task slots than ``num_workers``.
    NotImplementedError
        ``num_ps > 0``: parameter servers are not supported.
    TypeError, ValueError
        An argument that cannot work (checked before any Spark job).
    """
    _check_arguments(main_fun, num_workers, num_ps, master_node, env, timeout)
    kind = session_kind(init_spark())
    num_tasks = int(kind.default_parallelism() if num_workers is None else num_workers)
    check_task_slots(kind, num_tasks)
    with call_scope(kind, "sparktf.run") as call:
        call.hold(num_tasks)  # beside other calls of this driver: waits its turn for the slots
        return _run_program(kind, call, num_tasks, main_fun, args, master_node, tensorboard, log_dir, env, timeout)


def _run_program(kind: Any, call: Any, num_tasks: int, main_fun: Callable[[Any, Any], Any], args: Any,
                 master_node: Optional[str], tensorboard: bool, log_dir: Optional[str],
                 env: Optional[Mapping[str, str]], timeout: Optional[float]) -> Any:
    """The barrier job of :func:`run`, once its slots are held."""
    program = pickle_program(main_fun, args)
    default_fs = kind.default_fs()
    working_dir = os.getcwd()
    summaries = log_dir if log_dir is not None else ("tensorboard" if tensorboard else None)
    with LogServer(kind.driver_host(), functools.partial(_print_child_line, label=call.label)) as server:
        spec = TaskSpec(
            program=program,
            num_tasks=num_tasks,
            master_node=master_node,
            log_address=server.address,
            log_secret=server.secret,
            env=dict(env or {}),
            timeout=None if timeout is None else float(timeout),
            default_fs=default_fs,
            working_dir=working_dir,
            log_dir=None if summaries is None else absolute_path(summaries, default_fs, working_dir),
        )
        tag = f"sparktf-run-{uuid.uuid4().hex}"
        try:
            results = kind.run_tasks(num_tasks, functools.partial(run_barrier_task, spec), tag, barrier=True)
        except Exception as error:
            reported = server.failures()  # a task that saw its child fail said why before it raised
            if reported:
                raise SparkTFError(reported[0]) from None
            raise _spark_failure(error) from error
        finally:
            kind.cancel_tag(tag)
    return None if results[0] is None else cloudpickle.loads(results[0])
