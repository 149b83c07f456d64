"""The driver's watchdog over one barrier job: a rank that stops making progress gets the job cancelled.

Every rank reports its phase and iteration to the job channel (see
:class:`sparktf.collective.channel_client.Heartbeat`). The collective notices
a rank that stops answering inside an all-reduce, but not a stall before the
ring is up, a job of one worker, or a task that never starts. The watchdog
notices all of these: when a rank's ``(phase, iteration)`` has not changed
for ``stall_seconds`` (the collective timeout + 30 s), or a rank has not
reported at all for that long since the job started, it cancels the job's
Spark jobs (by job tag) and the job fails with a :class:`TrainingError`
naming the rank and its phase, which the optimizer treats like a lost
worker (a relaunch).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Callable, Optional, TypeVar

from sparktf.errors import TrainingError
from sparktf.spark.jobs import jvm_gone, run_job

__all__ = ["JobWatchdog", "STALL_SLACK_SECONDS"]

_LOG = logging.getLogger("sparktf.optimizer")
T = TypeVar("T")

STALL_SLACK_SECONDS = 30.0
_CHECK_SECONDS = 1.0


class JobWatchdog:
    """Runs a barrier job and cancels it when a rank stalls.

    Parameters
    ----------
    sc : pyspark.SparkContext
    channel : sparktf.collective.JobChannel
        The job's channel, which receives the ranks' reports.
    num_workers : int
        Ranks expected to report.
    stall_seconds : float
        How long a rank may go without progress.
    on_reports : callable, optional
        Called with the ranks' reports at every check (about once a second):
        the driver's live progress.
    """

    def __init__(self, sc: Any, channel: Any, num_workers: int, stall_seconds: float,
                 on_reports: Optional[Callable[[dict], None]] = None):
        self._sc = sc
        self._channel = channel
        self._num_workers = num_workers
        self._stall_seconds = stall_seconds
        self._tag = f"sparktf-segment-{uuid.uuid4().hex[:12]}"
        self._done = threading.Event()
        self._on_reports = on_reports
        self.reason: Optional[str] = None

    def run(self, action: Callable[[], T], what: str) -> T:
        """Run ``action`` (starts the job) under the watchdog.

        Raises
        ------
        TrainingError
            When the watchdog cancelled the job (naming the rank and phase).
        SparkTFError
            What the job itself failed with (see :func:`sparktf.spark.jobs.run_job`).
        """
        started = time.monotonic()
        watcher = threading.Thread(target=self._watch, args=(started,), name="sparktf-watchdog", daemon=True)
        self._sc.addJobTag(self._tag)
        watcher.start()
        try:
            return run_job(action, what=what)
        except Exception as error:
            if self.reason is not None:
                raise TrainingError(f"{what} was cancelled by sparktf's watchdog: {self.reason}") from error
            raise
        finally:
            self._done.set()
            watcher.join()
            try:
                self._sc.removeJobTag(self._tag)
            except Exception as error:
                if not jvm_gone(error):  # a dead JVM's error is already on its way
                    raise

    def _watch(self, started: float) -> None:
        while not self._done.wait(_CHECK_SECONDS):
            if self._on_reports is not None:
                try:
                    self._on_reports(self._channel.reports())
                except Exception:  # a progress display or user callback must not stop the watch
                    _LOG.exception("showing the training progress failed")
            reason = self._stall(time.monotonic(), started)
            if reason is not None:
                self.reason = reason
                _LOG.warning("cancelling the training job: %s", reason)
                try:
                    self._sc.cancelJobsWithTag(self._tag)
                except Exception as error:  # the JVM may be gone: the job's own call fails then
                    _LOG.warning("could not cancel the training job: %s", error)
                return

    def _stall(self, now: float, started: float) -> Optional[str]:
        reports = self._channel.reports()
        for rank in range(self._num_workers):
            report = reports.get(rank)
            if report is None and now - started > self._stall_seconds:
                return (f"rank {rank} did not report for {now - started:.0f} s since the job started (its "
                        "task did not start, or hung before it could report)")
            if report is not None and now - report.changed_at > self._stall_seconds:
                return (f"rank {rank} made no progress for {now - report.changed_at:.0f} s in phase "
                        f"{report.phase!r} at iteration {report.iteration}")
        return None
