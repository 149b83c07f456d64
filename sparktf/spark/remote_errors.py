"""Sparktf errors of plain Spark tasks, re-raised as themselves on the driver.

A job with a job channel (training, evaluation) gets its tasks'
:class:`~sparktf.errors.FailureRecord` through the channel. The other jobs
(record counts, the data layout, a dataset's Blocks, prediction's lazy RDDs)
use the session's failure inbox (:mod:`sparktf.collective.failure_inbox`):

* on the executors, :func:`reporting_failures` wraps the partition functions
  sparktf hands to Spark: a sparktf error raised while they run is sent to
  the inbox as a record, under the keys of the actions running the task (its
  job tags), and acknowledged, before it fails the task;
* on the driver, :func:`action_failures` runs an action under a fresh key
  (a job tag of this thread) and, when the action fails, gives the error
  its tasks reported; :func:`reraise_remote` raises it.

Only where the executors cannot reach the driver
(``spark.sparktf.rendezvous=barrier``) is Spark's text of the failed task the
one carrier: there the wrapped function raises, from the sparktf error, a
:class:`RecordCarrier` whose message is one marked line holding the record
as JSON (every field, the message whole), and the driver reads that line
back (``_error_in_text``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from typing import Any, Callable, Iterator, List, Optional

from sparktf import errors
from sparktf.collective.failure_inbox import KEY_PREFIX, FailureInbox, InboxAddress, new_key, send_failure
from sparktf.spark.session_state import failure_inbox

__all__ = ["ActionFailures", "RecordCarrier", "action_failures", "reporting_failures", "reraise_remote"]

logger = logging.getLogger(__name__)

_JOB_TAGS = "spark.job.tags"  # the local property Spark keeps a job's tags in, comma-separated
_RECORD_MARK = "sparktf-failure-record: "
_RECORD_LINE = re.compile(re.escape(_RECORD_MARK) + r"(\{.*\})")


class RecordCarrier(Exception):
    """Carries a task's :class:`~sparktf.errors.FailureRecord` through Spark's text of the failed task: its
    message is one marked line of JSON, raised from the sparktf error (without an inbox)."""

    def __init__(self, record: errors.FailureRecord):
        super().__init__(_RECORD_MARK + json.dumps(record.to_wire()))


class ActionFailures:
    """What the tasks of one driver action reported (see :func:`action_failures`)."""

    def __init__(self, inbox: Optional[FailureInbox], key: str):
        self._inbox = inbox
        self.key = key

    def error_of(self, failure: BaseException) -> Optional[errors.SparkTFError]:
        """The sparktf error a task of this action failed with, as itself; None if none reported one.

        ``failure`` is Spark's error of the action; it is read only when the
        session has no inbox (``spark.sparktf.rendezvous=barrier``).
        """
        if self._inbox is None:
            return _error_in_text(failure)
        record = self._inbox.take(self.key)
        return None if record is None else record.to_error()

    def reraise(self, failure: Exception) -> None:
        """Raise the sparktf error a task reported (chained to ``failure``), else ``failure`` itself."""
        if isinstance(failure, errors.SparkTFError):
            raise failure
        remote = self.error_of(failure)
        if remote is None:
            raise failure
        raise remote from (remote.__cause__ or failure)  # the worker's traceback, not Spark's wrappers of it


@contextlib.contextmanager
def action_failures(kind: Any) -> Iterator[ActionFailures]:
    """Run the Spark actions of the ``with`` block under a fresh key; the failures its tasks report.

    Parameters
    ----------
    kind : SessionKind
        The session the actions run in.
    """
    inbox = failure_inbox(kind)
    key = new_key()
    with kind.tagged(key):
        try:
            yield ActionFailures(inbox, key)
        finally:
            if inbox is not None:
                inbox.take(key)  # a record the action did not ask for (it succeeded after a retry)


@contextlib.contextmanager
def reraise_remote(kind: Any) -> Iterator[ActionFailures]:
    """Run Spark actions; a sparktf error a task reported is re-raised as itself.

    Other exceptions pass through unchanged. Jobs that outlive the block
    (a ``toLocalIterator``'s, started by a JVM thread made inside it) keep
    its key: their failures are the yielded ``ActionFailures``' to re-raise.
    """
    with action_failures(kind) as failures:
        try:
            yield failures
        except Exception as exc:
            failures.reraise(exc)


def reporting_failures(kind: Any, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` (for ``mapPartitions``, ``mapPartitionsWithIndex`` or ``mapInArrow``) reporting its sparktf errors:
    to the session's inbox, or (without one) in a :class:`RecordCarrier` raised from the error."""
    inbox = failure_inbox(kind)
    return _ReportingFailures(function, None if inbox is None else inbox.for_tasks)


class _ReportingFailures:
    """A partition function whose sparktf errors reach the driver's inbox before they fail the task."""

    def __init__(self, function: Callable[..., Any], inbox: Optional[InboxAddress]):
        self._function = function
        self._inbox = inbox

    def __call__(self, *args: Any) -> Iterator[Any]:
        try:
            yield from self._function(*args)
        except BaseException as error:
            record = _record_of(error)
            if record is None:  # not sparktf's: Spark's own failure tells it
                raise
            if self._inbox is None:
                raise RecordCarrier(record) from error
            _report(self._inbox, record)
            raise


def _report(inbox: InboxAddress, record: errors.FailureRecord) -> None:
    from pyspark import TaskContext

    context = TaskContext.get()
    keys = _action_keys(context.getLocalProperty(_JOB_TAGS) if context is not None else None)
    if not keys:
        return  # not run by a sparktf action (e.g. the user's own action on a derived RDD)
    if not send_failure(inbox, keys, record):
        logger.warning("could not report a %s to the driver at %s; it arrives as Spark's task failure",
                       record.kind, inbox.address)


def _record_of(error: BaseException) -> Optional[errors.FailureRecord]:
    """What this task reports of ``error`` (:func:`~sparktf.errors.task_record`), its partition as the shard."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return errors.task_record(error, shard=context.partitionId() if context is not None else None)


def _action_keys(tags: Optional[str]) -> List[str]:
    """The action keys among a task's job tags (Spark Connect prefixes each tag with its session's)."""
    found = []
    for tag in (tags or "").split(","):
        start = tag.find(KEY_PREFIX)
        if start >= 0:
            found.append(tag[start:])
    return found


def _error_in_text(failure: BaseException) -> Optional[errors.SparkTFError]:
    """The sparktf error whose :class:`RecordCarrier` line is in Spark's text of a failed task, or None.

    The last one wins: it is the outermost exception of the traceback.
    """
    found = None
    for line in _RECORD_LINE.findall(str(failure)):
        try:
            found = errors.FailureRecord.from_wire(json.loads(line)).to_error()
        except ValueError as malformed:  # not a record sparktf wrote: Spark's own error stands
            logger.debug("ignored a malformed failure record in a task's text: %s", malformed)
    return found
