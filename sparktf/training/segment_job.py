"""Driver side of training segments: relaunches, the barrier job, its secret, its job channel and its watchdog.

A segment is one Spark barrier job of ``num_workers`` tasks, each running
:func:`sparktf.training.loop.run_segment`. This module starts it with a fresh
secret and, on ``spark.driver.host``, a :class:`~sparktf.collective.JobChannel`
through which the ranks find each other, fetch the start state, report
their progress (watched by :class:`~sparktf.training.watchdog.JobWatchdog`)
and rank 0 uploads the final state: model state never rides in a Spark
broadcast or task result, so it never fills the driver JVM's heap.

With ``spark.sparktf.rendezvous=barrier`` (executors cannot reach the
driver), or when ``spark.driver.host`` cannot be listened on, there is no
channel: the ranks exchange addresses with ``BarrierTaskContext.allGather``,
the start state travels in a broadcast and the final state in rank 0's task
result, both through the JVM, and there is no watchdog beyond the
collective's own timeouts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import time
from functools import partial
from typing import Any, Callable, Iterator, Optional

from sparktf.collective import JobChannel
from sparktf.errors import DataError, DriverJVMGone, ModelError, TrainingError
from sparktf.spark.cluster import rendezvous_host, wait_for_free_slots
from sparktf.spark.jobs import run_job
from sparktf.training.checkpoint import ModelState
from sparktf.training.failures import reported_failure
from sparktf.training.loop import SegmentResult, SegmentSpec, run_segment, state_checksums
from sparktf.training.watchdog import JobWatchdog

__all__ = ["SegmentRunner", "run_segment_job", "job_channel", "SLOT_WAIT_SECONDS"]

_LOG = logging.getLogger("sparktf.optimizer")
#: Seconds a launch waits for task slots that a failed job's tasks still hold.
SLOT_WAIT_SECONDS = 30.0


class SegmentRunner:
    """The segments of one ``optimize`` call: launched on ``data``, relaunched after worker failures.

    Parameters
    ----------
    sc : pyspark.SparkContext
    data : pyspark.RDD
        The training RDD, one partition per worker.
    feed : BlockFeed or TFRecordFeed
        How the workers batch their partitions.
    num_workers : int
    max_failures : int
        Failed segments relaunched over the whole call before giving up.

    Attributes
    ----------
    failures : int
        The failures so far.
    """

    def __init__(self, sc: Any, data: Any, feed: Any, num_workers: int, max_failures: int):
        self.sc = sc
        self.data = data
        self.feed = feed
        self.num_workers = num_workers
        self.max_failures = max_failures
        self.failures = 0

    def run(self, spec: SegmentSpec, state: Callable[[], ModelState],
            on_reports: Optional[Callable[[dict], None]] = None) -> SegmentResult:
        """Run one segment from ``state()``, the driver's state, relaunching it from there after a failure.

        Raises
        ------
        DataError, ModelError, DriverJVMGone
            At once: the data or the model would fail again, or there is no JVM.
        TrainingError
            After more than ``max_failures`` failures, with the last one as cause.
        """
        while True:
            try:
                return run_segment_job(self.sc, self.data, spec, state(), self.num_workers, on_reports)
            except (DataError, ModelError, DriverJVMGone):
                raise
            except Exception as error:  # a worker failed: relaunch from the last good state
                self.failures += 1
                if self.failures > self.max_failures:
                    raise TrainingError(
                        f"training failed {self.failures} time(s) (max_failures={self.max_failures}) "
                        f"after iteration {spec.start.iteration}; the last failure was: {error}"
                    ) from error
                _LOG.warning(
                    "training segment after iteration %d failed (%d of %d allowed), relaunching "
                    "from the last good state: %s",
                    spec.start.iteration, self.failures, self.max_failures, error,
                )
                wait_for_free_slots(self.sc, self.num_workers, timeout=SLOT_WAIT_SECONDS)


def run_segment_job(
    sc: Any,
    blocks: Any,
    spec: SegmentSpec,
    state: ModelState,
    num_workers: int,
    on_reports: Optional[Callable[[dict], None]] = None,
) -> SegmentResult:
    """Run one segment on ``num_workers`` barrier tasks; return rank 0's result with its final state.

    Parameters
    ----------
    sc : pyspark.SparkContext
    blocks : pyspark.RDD
        The training Blocks, one partition per worker.
    spec : SegmentSpec
        The segment's settings; its ``state``, ``secret`` and ``directory``
        are filled in here.
    state : ModelState
        The state the workers start from.
    num_workers : int
    on_reports : callable, optional
        Called about once a second with the ranks' reports (live progress).

    Raises
    ------
    TrainingError
        The watchdog cancelled the job, or rank 0 sent no state.
    SparkTFError
        What the job's tasks raised (see :func:`sparktf.spark.jobs.run_job`).
    """
    secret = secrets.token_bytes(32)
    what = f"the training job after iteration {spec.start.iteration}"
    started = time.perf_counter()
    with job_channel(rendezvous_host(sc.getConf()), num_workers, secret) as channel:
        if channel is None:
            result = _run_with_broadcast(sc, blocks, dataclasses.replace(spec, secret=secret), state, what)
        else:
            channel.serve_state(*state.to_wire())
            job_spec = dataclasses.replace(spec, secret=secret, directory=channel.address)
            watchdog = JobWatchdog(sc, channel, num_workers, spec.collective_timeout, on_reports)
            try:
                result = _only_result(watchdog.run(partial(_collect, blocks, job_spec), what))
            except (DataError, ModelError):
                raise
            except Exception as error:  # a rank that failed deterministically said so before its peers failed
                reported = reported_failure(report.phase for _, report in sorted(channel.reports().items()))
                if reported is not None:
                    raise reported from error
                raise
            result.state = _uploaded_state(channel, what)
    worker_seconds = sum(result.timings.values())
    result.timings["launch"] = time.perf_counter() - started - worker_seconds
    return result


def _uploaded_state(channel: JobChannel, what: str) -> ModelState:
    """Rank 0's final state, checked against the checksums rank 0 computed."""
    uploaded = channel.take_uploaded()
    if uploaded is None:
        raise TrainingError(f"{what} ended but rank 0 sent no model state to the driver")
    meta, arrays = uploaded
    if meta.get("checksums") != state_checksums(arrays):
        raise TrainingError(f"the model state rank 0 sent after {what} arrived corrupted (checksums differ)")
    return ModelState.from_wire(meta, arrays)


def _collect(blocks: Any, spec: SegmentSpec) -> list:
    return blocks.barrier().mapPartitions(partial(run_segment, spec)).collect()


def _run_with_broadcast(sc: Any, blocks: Any, spec: SegmentSpec, state: ModelState, what: str) -> SegmentResult:
    """The segment without a job channel: state in a broadcast and in rank 0's task result."""
    state_broadcast = sc.broadcast(state)
    try:
        return _only_result(run_job(partial(_collect, blocks, dataclasses.replace(spec, state=state_broadcast)), what))
    finally:
        state_broadcast.destroy()


def _only_result(results: list) -> SegmentResult:
    if len(results) != 1:
        raise TrainingError(f"the training job returned {len(results)} results instead of rank 0's one")
    return results[0]


@contextlib.contextmanager
def job_channel(host: Optional[str], num_workers: int, secret: bytes) -> Iterator[Optional[JobChannel]]:
    """A job channel on ``host`` for one barrier job, or None to go through Spark instead.

    None for ``host=None`` (``spark.sparktf.rendezvous=barrier``) and, with a
    warning, when ``host`` cannot be listened on (e.g. a ``spark.driver.host``
    that names a proxy or service address).
    """
    if host is None:
        yield None
        return
    try:
        channel = JobChannel(num_workers, secret, host)
    except OSError as error:
        _LOG.warning(
            "cannot listen on spark.driver.host=%s for the job channel (%s); the workers exchange "
            "addresses through BarrierTaskContext.allGather and the model state travels through "
            "the JVM instead",
            host, error,
        )
        yield None
        return
    with channel:
        yield channel
