"""Driver side of training segments: launches on a worker count, relaunches, the barrier job, its channel and watchdog.

A segment is one Spark barrier job over the training Blocks (an RDD, or in
Spark Connect a barrier ``mapInArrow``), each task running
:func:`sparktf.training.worker.loop.run_segment`, on as many workers as
:class:`~sparktf.training.driver.membership.Membership` picks (``num_workers``
unless elastic training goes on with fewer). This module starts it as a served job
(:mod:`~sparktf.training.driver.served_job`: a fresh secret and, on the
driver's address, ``spark.sparktf.driverHost``, else ``spark.driver.host``, a
:class:`~sparktf.collective.JobChannel`) through which the ranks find each other, fetch the start state, report
their progress (watched by :class:`~sparktf.training.driver.watchdog.JobWatchdog`)
and rank 0 uploads the final state: model state never rides in a Spark
broadcast or task result, so it never fills the driver JVM's heap.

With ``spark.sparktf.rendezvous=barrier`` (executors cannot reach the
driver), or when that address cannot be listened on, a classic session
goes without a channel: the ranks exchange addresses with ``BarrierTaskContext.allGather``,
the start state travels in a broadcast and the final state in rank 0's task
result, both through the JVM, and there is no watchdog beyond the
collective's own timeouts. A Spark Connect session always has its channel.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from functools import partial
from typing import Any, Callable, Optional

from sparktf.errors import SparkTFError, TrainingError, relaunch_helps
from sparktf.spark.jobs import run_job
from sparktf.training.checkpoint import ModelState
from sparktf.training.driver.inputs import WorkerInputs
from sparktf.training.driver.membership import Membership
from sparktf.training.driver.served_job import served_job
from sparktf.training.state_source import StateSource, joined_uploads
from sparktf.training.worker.loop import run_segment
from sparktf.training.worker.segment_spec import SegmentResult, SegmentSpec
from sparktf.training.worker.step_clock import RankAnatomy
from sparktf.triggers import EveryEpoch, TriggerOr

__all__ = ["SegmentRunner", "run_segment_job"]

_LOG = logging.getLogger("sparktf.optimizer")


class SegmentRunner:
    """The segments of one ``optimize`` call: launched, relaunched after worker failures, on a changing worker count.

    Parameters
    ----------
    session : SessionKind
        The session that runs the jobs.
    inputs : WorkerInputs
        The training data and local batches for each worker count.
    membership : Membership
        Picks the worker count of every launch (waiting for lost slots).
    max_failures : int
        Failed segments relaunched over the whole call before giving up; a
        failure after which training goes on with a different worker count
        is a membership change instead (bounded by ``Membership`` itself).
    profile : pyspark.resource.ResourceProfile, optional
        The training stage's resource profile (see :mod:`sparktf.spark.resources`).
    call : sparktf.spark.calls.Call, optional
        The ``optimize`` call: every launch first holds its workers' slots
        there (the first one waits its turn among the driver's concurrent
        calls), and a call cancelled by Ctrl-C is not relaunched.
    stacks_folder : str, optional
        A local folder for the ranks' stacks when a job hangs (see :class:`JobWatchdog`).

    Attributes
    ----------
    failures : int
        The failures counted so far.
    """

    def __init__(self, session: Any, inputs: WorkerInputs, membership: Membership, max_failures: int,
                 profile: Any = None, call: Any = None, stacks_folder: Optional[str] = None):
        self.session = session
        self.stacks_folder = stacks_folder
        self.call = call
        self.profile = profile
        self.inputs = inputs
        self.membership = membership
        self.max_failures = max_failures
        self.failures = 0
        self._next: Optional[int] = None

    def start(self, iteration: int) -> int:
        """Check the rendezvous address and decide the first launch's worker count, before any training job.

        Parameters
        ----------
        iteration : int
            The driver's iteration (the first segment starts after it).

        Raises
        ------
        ConfigurationError
            This process cannot listen on the address its tasks connect to,
            or (Spark Connect) the executors cannot reach it.
        SparkTFError
            Too few task slots.
        """
        self.session.rendezvous_host()
        self._next = self.membership.next_launch(iteration)
        return self._next

    def run(self, spec: SegmentSpec, state: Callable[[], ModelState],
            on_reports: Optional[Callable[[dict], None]] = None,
            on_launch: Optional[Callable[[int], None]] = None) -> SegmentResult:
        """Run one segment from ``state()``, the driver's state, relaunching it from there after a failure.

        ``spec``'s ``local_batches`` and ``feed`` are set here for the
        launch's worker count; while that count is below ``num_workers`` the
        segment also ends at the epoch's end, so that growth is noticed.
        ``on_launch(workers)`` is called before every launch.

        Raises
        ------
        DataError, ModelError, ConfigurationError, StorageError, DriverJVMGone
            At once, as themselves, whatever ``max_failures`` is: the data, the
            model, a setting or a path the store refuses would fail again, or
            there is no JVM (see :func:`sparktf.errors.relaunch_helps`).
        TrainingError
            After more than ``max_failures`` failures (the last one as
            cause), or when fewer than ``min_workers`` task slots are left.
        """
        workers, self._next = self._next or self.membership.next_launch(spec.start.iteration), None
        while True:
            workers = self._hold(workers)
            data, feed = self.inputs.get(workers)  # finishes (or cancels) a layout built while waiting
            self.membership.wait_free(workers)  # e.g. a failed job's tasks still ending
            if on_launch is not None:
                on_launch(workers)
            try:
                result = run_segment_job(self.session, data, self._spec_for(spec, workers, feed), state(), workers,
                                         on_reports, self.profile, self.stacks_folder)
                result.workers = workers
                return result
            except Exception as error:  # a worker failed: relaunch from the last good state, if that can help
                if not relaunch_helps(error):
                    raise
                workers = self._relaunch(spec, workers, error)

    def _hold(self, workers: int) -> int:
        """Hold the launch's slots in the call (waiting its turn); an elastic launch that cannot grow keeps its count."""
        if self.call is None:
            return workers
        held = self.call.hold(workers, self.profile)
        if held != workers:
            self.membership.current = held
        return held

    def _spec_for(self, spec: SegmentSpec, workers: int, feed: Any) -> SegmentSpec:
        # fewer workers end segments at epoch ends (to grow back there); a single pass ends only at its end
        grows_back = workers < self.membership.num_workers and spec.schedule.grows_back
        stop = TriggerOr(spec.stop, EveryEpoch()) if grows_back else spec.stop
        return dataclasses.replace(spec, local_batches=self.inputs.local_batches(workers), feed=feed, stop=stop,
                                   tables=spec.tables.on(workers),
                                   schedule=spec.schedule.on(lambda: self.inputs.shard_records(workers)))

    def _relaunch(self, spec: SegmentSpec, workers: int, error: Exception) -> int:
        """The worker count of the relaunch after ``error``; raises when training cannot go on."""
        if self.call is not None and self.call.interrupted:
            raise self.call.cancelled() from error
        self.failures += 1
        if self.failures > self.max_failures and not self.membership.lost_slots():
            raise self._gave_up(spec, error) from error
        _LOG.warning(
            "training segment after iteration %d failed on %d workers, relaunching from the last good state: %s",
            spec.start.iteration, workers, error,
        )
        try:
            relaunch = self.membership.next_launch(spec.start.iteration, failed=True)
        except SparkTFError as stopped:
            raise stopped from error
        if relaunch != workers:
            self.failures -= 1  # a change of membership, counted apart from max_failures
        elif self.failures > self.max_failures:
            raise self._gave_up(spec, error) from error
        else:
            _LOG.warning("that was failure %d of the %d allowed (max_failures)", self.failures, self.max_failures)
        return relaunch

    def _gave_up(self, spec: SegmentSpec, error: Exception) -> TrainingError:
        return TrainingError(
            f"training failed {self.failures} time(s) (max_failures={self.max_failures}) in the segment that "
            f"started after iteration {spec.start.iteration}; the last failure was: {error}"
        )


def run_segment_job(
    session: Any,
    blocks: Any,
    spec: SegmentSpec,
    state: ModelState,
    num_workers: int,
    on_reports: Optional[Callable[[dict], None]] = None,
    profile: Any = None,
    stacks_folder: Optional[str] = None,
) -> SegmentResult:
    """Run one segment on ``num_workers`` barrier tasks; return rank 0's result with its final state.

    Parameters
    ----------
    session : SessionKind
    blocks : BlockSet
        The training Blocks, one partition per worker.
    spec : SegmentSpec
        The segment's settings; its ``state``, ``secret`` and ``directory``
        are filled in here.
    state : ModelState
        The state the workers start from.
    num_workers : int
    on_reports : callable, optional
        Called about once a second with the ranks' reports (live progress),
        which carry rank 0's per-iteration values since the previous call.
    profile : pyspark.resource.ResourceProfile, optional
        The barrier stage's resource profile (None: the session's defaults).
    stacks_folder : str, optional
        Where the ranks' stacks go when the job hangs (see :class:`JobWatchdog`).

    Raises
    ------
    TrainingError
        The watchdog cancelled the job, or rank 0 sent no state.
    SparkTFError
        What the job's tasks raised (see :func:`sparktf.spark.jobs.run_job`).
    """
    what = f"the training job after iteration {spec.start.iteration}"
    started = time.perf_counter()
    with served_job(session, num_workers, state) as job:
        if job.channel is None:
            result = _run_with_broadcast(session, blocks, spec, job.secret, num_workers, state, what, profile)
        else:
            job_spec = dataclasses.replace(spec, source=StateSource(job.address, job.secret, num_workers,
                                                                    spec.collective_timeout))
            # a rank that failed knowingly reported its record first: the watchdog raises that
            result = _only_result(job.run(partial(_collect, blocks, job_spec, profile), what, spec.collective_timeout,
                                          on_reports=on_reports, stacks_folder=stacks_folder))
            result.state = joined_uploads(job.channel.take_uploaded(), what)
    worker_seconds = sum(result.timings.values())
    result.timings["launch"] = time.perf_counter() - started - worker_seconds
    return result


def _collect(blocks: Any, spec: SegmentSpec, profile: Any) -> list:
    return blocks.collect(partial(run_segment, spec), barrier=True, profile=profile)


def _run_with_broadcast(session: Any, blocks: Any, spec: SegmentSpec, secret: bytes, num_workers: int,
                        state: ModelState, what: str, profile: Any) -> SegmentResult:
    """The segment without a job channel (classic sessions): state in a broadcast and in rank 0's task result."""
    state_broadcast = session.spark_context(what, "").broadcast(state)
    try:
        job_spec = dataclasses.replace(spec, source=StateSource(None, secret, num_workers, spec.collective_timeout,
                                                                state_broadcast))
        return _only_result(run_job(session, partial(_collect, blocks, job_spec, profile), what))
    finally:
        state_broadcast.destroy()


def _only_result(results: list) -> SegmentResult:
    """Rank 0's result, holding every rank's anatomy."""
    segment = [result for result in results if isinstance(result, SegmentResult)]
    if len(segment) != 1:
        raise TrainingError(f"the training job returned {len(segment)} results instead of rank 0's one")
    segment[0].anatomy = sorted((result for result in results if isinstance(result, RankAnatomy)),
                                key=lambda record: record.rank)
    return segment[0]
