"""Running Spark actions from the driver with executor failures made readable.

A Python exception on an executor reaches the driver as a Py4J error whose
text buries the worker's own traceback in Java frames. :func:`run_job` runs an
action and turns such a failure into a sparktf error: a sparktf error a task
reported comes back as itself, any other one as a :class:`SparkTFError`
whose message is the worker's Python traceback (shown, never classified).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional, TypeVar

from sparktf.errors import DriverJVMGone, SparkTFError
from sparktf.spark.remote_errors import action_failures

__all__ = ["run_job", "worker_traceback", "jvm_gone", "unpersist", "fully_cached"]

T = TypeVar("T")

_TRACEBACK_START = "Traceback (most recent call last):"
_JAVA_TAIL = re.compile(r"\n\s*(at [\w$.]+\(|Driver stacktrace:|Caused by:| SQLSTATE:)")


def worker_traceback(error: BaseException) -> Optional[str]:
    """The Python traceback of the executor task inside ``error``'s text, if any."""
    text = str(error)
    start = text.find(_TRACEBACK_START)
    if start < 0:
        return None
    tail = text[start:]
    java = _JAVA_TAIL.search(tail)
    return (tail[: java.start()] if java else tail).rstrip()


def jvm_gone(error: BaseException) -> bool:
    """Whether ``error`` says Py4J lost its connection to the driver JVM."""
    from py4j.protocol import Py4JNetworkError

    return isinstance(error, (Py4JNetworkError, ConnectionRefusedError, ConnectionResetError, BrokenPipeError))


def unpersist(rdd) -> None:
    """Drop ``rdd``'s cache; a dead JVM (whose error is already on its way) has nothing to drop."""
    try:
        rdd.unpersist()
    except Exception as error:
        if not jvm_gone(error):
            raise


def fully_cached(rdd) -> bool:
    """Whether every partition of the persisted ``rdd`` is in Spark's cache right now."""
    target = rdd.id()
    for info in rdd.context._jsc.sc().getRDDStorageInfo():
        if info.id() == target:
            return info.numCachedPartitions() >= info.numPartitions()
    return False


def run_job(kind: Any, action: Callable[[], T], what: str = "a Spark job") -> T:
    """Run ``action`` (a function that starts Spark jobs) and return its result.

    Parameters
    ----------
    kind : SessionKind
        The session the jobs run in.
    action : callable
        Runs the Spark action(s), e.g. ``lambda: rdd.mapPartitions(f).collect()``.
    what : str
        What the job does, for the error message.

    Raises
    ------
    SparkTFError
        The sparktf error a task reported (as its own class, see
        :mod:`~sparktf.spark.remote_errors`), or, for any other task failure,
        a ``SparkTFError`` holding the worker's traceback.
    DriverJVMGone
        The driver JVM died while the job ran.
    """
    with action_failures(kind) as failures:
        try:
            return action()
        except SparkTFError:
            raise
        except Exception as error:
            if jvm_gone(error):
                raise DriverJVMGone(
                    f"the Spark driver JVM died while {what} ran (Py4J: {error}). It most likely ran out "
                    "of memory (raise spark.driver.memory: data collected to or broadcast from the driver "
                    "lives in its heap) or was killed; start a new session with sparktf.init_spark()"
                ) from None
            remote = failures.error_of(error)
            if remote is not None:
                raise remote from error
            trace = worker_traceback(error)
            if trace is None:
                raise
            raise SparkTFError(f"{what} failed on an executor; the worker's traceback follows.\n{trace}") from error
