"""The driver's watchdog over one job: a task that stops making progress gets the job cancelled.

Every task reports its phase and counter (iteration, batch) to the job
channel (see :class:`sparktf.collective.channel_client.Heartbeat`). The
collective notices a rank that stops answering inside an all-reduce, but not
a stall before the ring is up, a job of one worker, a task that never starts,
or an evaluation task. The watchdog notices all of these and cancels the
job's Spark jobs (by job tag); the job then fails with a
:class:`TrainingError` naming the task and its phase, which the optimizer
treats like a lost worker (a relaunch). A task stalls when:

* its ``(phase, counter)`` has not changed for the collective timeout +
  ``spark.sparktf.watchdogSlack`` (30 s by default; see
  :func:`sparktf.spark.cluster.watchdog_slack`), unless it reported the
  phase ``"done"``;
* in a barrier job (every rank runs at once), a rank has not reported at all
  for that long since the job started;
* in an ordinary job (tasks wait for free slots), no task has reported
  anything new for that long: one hangs before it could report.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
import uuid
from typing import Any, Callable, Optional, TypeVar

from sparktf.collective.channel_client import DONE, IDLE
from sparktf.errors import TrainingError
from sparktf.spark.cluster import watchdog_slack
from sparktf.spark.jobs import run_job

__all__ = ["JobWatchdog"]

_LOG = logging.getLogger("sparktf.optimizer")
T = TypeVar("T")

_CHECK_SECONDS = 1.0


class JobWatchdog:
    """Runs a job and cancels it when a task stalls.

    Parameters
    ----------
    session : SessionKind
        The session that runs the job.
    channel : sparktf.collective.JobChannel
        The job's channel, which receives the tasks' reports.
    num_workers : int
        Tasks expected to report (ranks, or partitions).
    timeout : float
        The tasks' own timeout (``collective_timeout``); a task may go
        without progress for that long plus the watchdog's slack.
    on_reports : callable, optional
        Called with the tasks' reports at every check (about once a second),
        with the per-iteration values rank 0 sent since the last check: the
        driver's live progress and batch callbacks.
    barrier : bool
        Whether every task runs at once (a barrier job of ranks) or tasks
        may wait for slots (an ordinary job of partitions).
    stacks_folder : str, optional
        The local folder a hung job's stacks file goes to (``<tag>.txt``,
        e.g. under ``model_dir``); by default ``sparktf-stacks`` in the
        temporary folder.
    """

    def __init__(self, session: Any, channel: Any, num_workers: int, timeout: float,
                 on_reports: Optional[Callable[[dict], None]] = None, barrier: bool = True,
                 stacks_folder: Optional[str] = None):
        self._session = session
        self._channel = channel
        self._num_workers = num_workers
        self._stall_seconds = timeout + watchdog_slack(session)
        self._barrier = barrier
        self._task, self._counter = ("rank", "iteration") if barrier else ("partition", "batch")
        self._tag = f"sparktf-job-{uuid.uuid4().hex[:12]}"
        self._done = threading.Event()
        self._on_reports = on_reports
        self._stacks_folder = stacks_folder or os.path.join(tempfile.gettempdir(), "sparktf-stacks")
        self.reason: Optional[str] = None

    def run(self, action: Callable[[], T], what: str) -> T:
        """Run ``action`` (starts the job) under the watchdog.

        Raises
        ------
        SparkTFError
            First, the failure a task reported to the channel before it failed
            (the lowest task's, as its own class with its fields): its record
            decides, not Spark's text of its error nor a peer's lost
            connection. Without a record, what the job failed with (see
            :func:`sparktf.spark.jobs.run_job`).
        TrainingError
            When the watchdog cancelled the job and no task reported a failure
            (naming the rank and phase).
        """
        started = time.monotonic()
        watcher = threading.Thread(target=self._watch, args=(started, what), name="sparktf-watchdog", daemon=True)
        with self._session.tagged(self._tag):  # Ctrl-C cancels the job too
            watcher.start()
            try:
                return run_job(self._session, action, what=what)
            except Exception as error:
                reports = self._channel.reports()
                # a rank's own failure first; a peer's lost connection or timeout is what it caused
                reported = sorted((report.failure for _, report in sorted(reports.items()) if report.failure),
                                  key=lambda record: record.kind == "CollectiveError")
                # e.g. a rank's collective timeout: where the task it waited for was stuck, when one sent its stack
                if reported:  # its one cause: the worker's traceback (Spark's and Py4J's wrappers left out)
                    where = self._where_stuck(reports, besides=reported[0].rank)
                    remote = reported[0].to_error()
                    raise _with_text(remote, where) from (remote.__cause__ or error)
                if self.reason is not None:  # the reason names the stuck task and wrote the stacks already
                    raise TrainingError(f"{what} was cancelled by sparktf's watchdog: {self.reason}") from error
                raise _with_text(error, self._where_stuck(reports, besides=None))
            finally:
                self._done.set()
                watcher.join()

    def _watch(self, started: float, what: str) -> None:
        while not self._done.wait(_CHECK_SECONDS):
            if self._on_reports is not None:
                try:
                    self._on_reports(self._channel.reports(take_batches=True))
                except Exception:  # a progress display or user callback must not stop the watch
                    _LOG.exception("showing the training progress failed")
            reason = self._stall(time.monotonic(), started)
            if reason is not None:
                self.reason = reason
                _LOG.warning("cancelling %s: %s", what, reason)
                try:
                    self._session.cancel_tag(self._tag)
                except Exception as error:  # the JVM may be gone: the job's own call fails then
                    _LOG.warning("could not cancel %s: %s", what, error)
                return

    def _stall(self, now: float, started: float) -> Optional[str]:
        reports = self._channel.reports()
        for task, report in sorted(reports.items()):
            if report.phase not in (DONE, IDLE) and now - report.changed_at > self._stall_seconds:
                return (f"{self._task} {task} made no progress for {now - report.changed_at:.0f} s in phase "
                        f"{report.phase!r} at {self._counter} {report.iteration}{self._stacks(task, reports)}")
        if self._barrier:
            for rank in range(self._num_workers):
                if rank not in reports and now - started > self._stall_seconds:
                    return (f"rank {rank} did not report for {now - started:.0f} s since the job started (its "
                            "task did not start, or hung before it could report)")
            return None
        last_news = max([started] + [report.changed_at for report in reports.values()])
        waiting = sorted(set(range(self._num_workers)) - {t for t, r in reports.items() if r.phase == DONE})
        if waiting and now - last_news > self._stall_seconds:
            return (f"no task reported anything new for {now - last_news:.0f} s; partitions not done: "
                    f"{_some(waiting)} (a task hung before it could report, or found no free task slot)")
        return None


    def _where_stuck(self, reports: dict, besides: Optional[int]) -> str:
        """For a failed job's message: the task but ``besides`` longest in one place, with its frames (empty when no
        task sent its stack)."""
        stuck = _longest_in_place(reports, besides)
        if stuck is None:
            return ""
        report = reports[stuck]
        return (f"; {self._task} {stuck} stayed longest in phase {report.phase!r} at {self._counter} "
                f"{report.iteration}{self._stacks(stuck, reports)}")

    def _stacks(self, stuck: Optional[int], reports: dict) -> str:
        """The stuck task's innermost frames, and the file every task's last stack is written to (for a message;
        empty when no task sent its stack)."""
        if stuck is None or not any(report.stack for report in reports.values()):
            return ""
        os.makedirs(self._stacks_folder, exist_ok=True)
        path = os.path.join(self._stacks_folder, f"{self._tag}.txt")
        with open(path, "w") as out:
            for task, report in sorted(reports.items()):
                out.write(f"{self._task} {task}, phase {report.phase!r}, {self._counter} {report.iteration}:\n")
                out.write("".join(f"  {line}\n" for line in report.stack) or "  (no stack: it was making progress)\n")
        stack = list(reports[stuck].stack)
        threads = [i for i, line in enumerate(stack) if line.startswith("# thread ")]
        task_thread = stack[:threads[0]] if threads else stack
        innermost = " <- ".join(reversed(task_thread[-_INNERMOST:])) or "not reported"
        if threads:  # another thread runs Python for it (a tf.py_function): its innermost frame too
            innermost += f" (and {stack[threads[0]][2:]} at {stack[threads[1] - 1 if len(threads) > 1 else -1]})"
        return f"; its innermost frames: {innermost}; every {self._task}'s stack is in {path}"


def _longest_in_place(reports: dict, besides: Optional[int]) -> Optional[int]:
    """The task but ``besides`` that sent its stack and has been in its phase and iteration longest (None: none
    sent one)."""
    with_stacks = [(report.changed_at, task) for task, report in reports.items() if report.stack and task != besides]
    return min(with_stacks)[1] if with_stacks else None


def _with_text(error: BaseException, text: str) -> BaseException:
    """``error`` with ``text`` (naming where a task was stuck) appended to its message."""
    if text and error.args:
        error.args = (f"{error.args[0]}{text}",) + tuple(error.args[1:])
    return error


#: Frames of the stuck task a message shows.
_INNERMOST = 3


def _some(numbers: list) -> str:
    """The first few of ``numbers``, for a message."""
    shown = ", ".join(str(n) for n in numbers[:8])
    return shown + (f" and {len(numbers) - 8} more" if len(numbers) > 8 else "")
