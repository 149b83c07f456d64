"""Re-raising sparktf errors that happened on executors as themselves on the driver, from Spark's text.

An exception raised in an executor's Python worker reaches the driver as a
Py4J / Spark exception whose text contains the worker's traceback, e.g.
``sparktf.errors.DataError: partition 1, record 7: ...``. :func:`reraise_remote`
turns that back into a ``DataError`` (or whichever sparktf error it was) with
the original message, chained to the Spark exception for the full trace.

Only for jobs where that text is the one carrier: prediction's lazy RDDs
(the user's actions run them), record counts and the data layout, and
training without a job channel. A job with a channel (training, evaluation)
gets the task's :class:`~sparktf.errors.FailureRecord` through it instead
(see ``docs/internals.md``, "Where a failure goes").
"""

from __future__ import annotations

import contextlib
import re
from typing import Iterator, Optional

from sparktf import errors

__all__ = ["remote_sparktf_error", "reraise_remote"]

_REMOTE_ERROR = re.compile(r"sparktf\.errors\.(\w+): (.+)")


def remote_sparktf_error(exc: BaseException) -> Optional[errors.SparkTFError]:
    """The sparktf error reported inside ``exc``'s text, or ``None`` if there is none.

    The last report wins: it is the outermost exception of the worker's
    traceback.
    """
    found = None
    for name, message in _REMOTE_ERROR.findall(str(exc)):
        cls = getattr(errors, name, None)
        if isinstance(cls, type) and issubclass(cls, errors.SparkTFError):
            found = cls(message.strip())
    return found


@contextlib.contextmanager
def reraise_remote() -> Iterator[None]:
    """Run a Spark action; a sparktf error raised on an executor is re-raised as itself.

    Other exceptions pass through unchanged.
    """
    try:
        yield
    except errors.SparkTFError:
        raise
    except Exception as exc:
        remote = remote_sparktf_error(exc)
        if remote is None:
            raise
        raise remote from exc
