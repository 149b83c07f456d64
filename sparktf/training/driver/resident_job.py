"""The driver's side of a resident training job: one barrier job fed pass after pass, relaunched after a failure.

A :class:`ResidentJob` launches :func:`~sparktf.training.worker.resident.run_resident`
on ``workers`` barrier tasks once, with a job channel and the watchdog, and
keeps it up: passes submitted with :meth:`ResidentJob.submit` (staged
micro-batches) reach the ranks as orders through the channel, in submission
order, and each pass the ranks finish comes back as a :class:`PassResult`
(rank 0's state, the ranks' test totals added up, the per-iteration values),
handed to ``on_pass`` on a thread of its own, in order. The ranks train pass
``k + 1`` while ``on_pass`` writes the checkpoint of pass ``k``.

A job that fails is relaunched from the driver's state (``state()``, the
model after the last pass ``on_pass`` took), up to ``max_failures`` times,
and the passes not finished are trained again from their start. A failure
that a relaunch cannot mend (bad data, a model that cannot run, a setting),
an ``on_pass`` that raises, or too many failures end the job: :attr:`error`
holds the cause and every waiting call raises it.

Every wait here is bounded: the ranks' long polls by
:data:`~sparktf.training.worker.resident.ORDER_WAIT_SECONDS`, the job by its
watchdog, the back-pressure and the drain by the stall bound (the ranks'
``collective_timeout`` plus the watchdog's slack, twice).
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from sparktf.data.staged_batches import StagedBatch
from sparktf.errors import DataError, TrainingError, relaunch_helps
from sparktf.spark.calls import call_scope
from sparktf.spark.cluster import watchdog_slack
from sparktf.training.checkpoint import ModelState
from sparktf.training.driver.served_job import served_job
from sparktf.training.state_source import StateSource, joined_uploads
from sparktf.training.worker.resident import ORDER_WAIT_SECONDS, ResidentOrder, run_resident
from sparktf.training.worker.segment_spec import SegmentSpec

__all__ = ["PassResult", "ResidentJob"]

_LOG = logging.getLogger("sparktf.optimizer")


@dataclass
class PassResult:
    """One pass the ranks of a resident job finished.

    Attributes
    ----------
    order : ResidentOrder
        The pass (its staged micro-batch and first iteration).
    iteration : int
        The iteration after it.
    state : ModelState or None
        Rank 0's state after the pass (None when a loss was not finite: nothing of it was applied).
    non_finite_iteration : int or None
        The iteration whose loss or gradient was not finite.
    totals : list of numpy.ndarray
        The compiled metrics' states over the micro-batch with the weights from before the pass, summed over ranks.
    losses, learning_rates, wall_times, step_seconds : numpy.ndarray
        One entry per iteration, as a segment's.
    metrics : dict
        Compiled metric name -> one value per iteration (over the pass so far).
    """

    order: ResidentOrder
    iteration: int
    state: Optional[ModelState]
    non_finite_iteration: Optional[int]
    totals: List[np.ndarray]
    losses: np.ndarray
    learning_rates: np.ndarray
    wall_times: np.ndarray
    step_seconds: np.ndarray
    metrics: Dict[str, np.ndarray]


class ResidentJob:
    """A barrier job of ``workers`` ranks that trains every submitted pass until stopped.

    Parameters
    ----------
    session : SessionKind
        The classic session that runs it.
    spec : SegmentSpec
        The ranks' settings (payload, structure, clipping, timeouts, maps); the launch fills in the channel.
    workers : int
        Ranks.
    state : callable
        The driver's state to (re)launch from.
    on_pass : callable
        ``on_pass(result)`` for every finished pass, in order, on the job's own thread.
    max_failures : int
        Failed launches relaunched before the job gives up.
    profile : ResourceProfile, optional
        The barrier stage's.
    """

    def __init__(self, session: Any, spec: SegmentSpec, workers: int, state: Callable[[], ModelState],
                 on_pass: Callable[[PassResult], None], max_failures: int, profile: Any = None):
        self._session, self._spec, self._workers, self._state = session, spec, workers, state
        self._on_pass, self._max_failures, self._profile = on_pass, max_failures, profile
        self._lock = threading.Condition()
        self._pending: List[ResidentOrder] = []  # submitted, not finished by the ranks
        self._finishing = 0  # finished by the ranks, not yet taken by on_pass
        self._cursor: Dict[int, int] = {}  # rank -> the last batchId it was given (this launch)
        self._reports: Dict[int, Dict[int, Tuple[Dict[str, Any], List[np.ndarray]]]] = {}
        self._channel: Any = None
        self._next_first = 0
        self._stopping = False
        self.error: Optional[BaseException] = None
        self.stall_seconds = 2 * (spec.collective_timeout + watchdog_slack(session))
        self._finished: "queue.Queue[Optional[PassResult]]" = queue.Queue()
        self._threads: List[threading.Thread] = []

    # ------------------------------------------------------------------ the streaming side

    def start(self, iteration: int) -> None:
        """Launch the job, its first pass after ``iteration``."""
        self._next_first = iteration
        for target, name in ((self._launches, "sparktf-resident-job"), (self._finish_passes, "sparktf-resident-pass")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def submit(self, batch: StagedBatch, batch_size: int, shuffle_seed: Optional[int]) -> ResidentOrder:
        """Queue a staged micro-batch for one pass after the passes queued before it."""
        with self._lock:
            self._raise_error()
            order = ResidentOrder(batch, self._next_first, batch_size, shuffle_seed)
            self._next_first += order.iterations
            self._pending.append(order)
            self._lock.notify_all()
            return order

    @property
    def backlog(self) -> int:
        """Passes submitted and not yet taken by ``on_pass``."""
        with self._lock:
            return len(self._pending) + self._finishing

    def wait_for_backlog(self, at_most: int) -> float:
        """Wait until at most ``at_most`` passes are queued or finishing; the seconds waited.

        Raises
        ------
        TrainingError
            No pass finished for ``stall_seconds``; or the job's :attr:`error`.
        """
        started = time.monotonic()
        self._wait(lambda: self._pending_count() <= at_most, f"more than {at_most} micro-batches to train")
        return time.monotonic() - started

    def finish(self) -> None:
        """Train every submitted pass, then end the job (bounded: each pass within the stall bound)."""
        self._wait(lambda: self._pending_count() == 0, "the staged micro-batches to be trained")
        self.stop()

    def stop(self, timeout: Optional[float] = None) -> None:
        """End the job after the pass the ranks are training (the ones queued after it stay untrained)."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        bound = self.stall_seconds if timeout is None else timeout
        for thread in self._threads:
            thread.join(bound)
        if any(thread.is_alive() for thread in self._threads):
            _LOG.warning("the resident training job did not end within %.0f s of its stop; its tasks end when "
                         "their job channel closes", bound)

    # ------------------------------------------------------------------ waits

    def _pending_count(self) -> int:
        return len(self._pending) + self._finishing

    def _raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        """Wait for ``ready()`` (under the lock) while passes keep finishing."""
        with self._lock:
            progress, last_news = self._pending_count(), time.monotonic()
            while not ready():
                self._raise_error()
                if self._stopping:
                    raise TrainingError(f"the resident training job was stopped while waiting for {what}")
                if self._pending_count() != progress:
                    progress, last_news = self._pending_count(), time.monotonic()
                waited = time.monotonic() - last_news
                if waited > self.stall_seconds:
                    raise TrainingError(
                        f"the resident training job finished no micro-batch for {waited:.0f} s while waiting for "
                        f"{what} (bound: twice collective_timeout plus the watchdog's slack); see the executors' "
                        "logs, or raise collective_timeout")
                self._lock.wait(min(1.0, self.stall_seconds - waited))
            self._raise_error()

    # ------------------------------------------------------------------ the job

    def _launches(self) -> None:
        """Launch the job, relaunch it after failures that a relaunch can mend, until stopped."""
        failures = 0
        try:
            with call_scope(self._session, "optimize_stream") as call:
                while True:
                    call.hold(self._workers, self._profile)
                    try:
                        self._launch()
                        return
                    except Exception as error:  # noqa: BLE001 - decided below: relaunch or end
                        with self._lock:
                            if self._stopping:
                                return
                        failures += 1
                        if not relaunch_helps(error) or failures > self._max_failures:
                            raise
                        _LOG.warning("the resident training job failed (failure %d of the %d allowed); relaunching "
                                     "it from the last trained micro-batch: %s", failures, self._max_failures, error)
                        self._relaunch_point()
        except BaseException as error:  # noqa: BLE001 - the streaming side raises it
            self._fail(self._named(error))
        finally:
            self._finished.put(None)

    def _named(self, error: BaseException) -> BaseException:
        """A ``DataError`` of the job names the micro-batch its ranks were training (the first not finished)."""
        with self._lock:
            training = self._pending[0].batch if self._pending else None
        if isinstance(error, DataError) and training is not None and error.args:
            error.args = (f"micro-batch {training.batch_id} (staged in {training.folder}): {error.args[0]}",
                          *error.args[1:])
        return error

    def _launch(self) -> None:
        what = "the resident training job"
        with served_job(self._session, self._workers, self._state()) as job:
            if job.channel is None:
                raise TrainingError("a resident training job needs its job channel (spark.sparktf.rendezvous="
                                    "barrier has none)")
            with self._lock:
                self._channel, self._cursor, self._reports = job.channel, {}, {}
            job.channel.give_orders(self._order)
            spec = dataclasses.replace(self._spec, source=StateSource(job.address, job.secret, self._workers,
                                                                      self._spec.collective_timeout))
            placeholder = self._session_blocks()
            job.run(partial(placeholder.collect, partial(run_resident, spec), barrier=True, profile=self._profile),
                    what, self._spec.collective_timeout)

    def _session_blocks(self) -> Any:
        from sparktf.data.block_sets import RddBlockSet

        return RddBlockSet.of_items(self._session, list(range(self._workers)))

    def _relaunch_point(self) -> None:
        """After a failure: wait for ``on_pass`` to take the finished passes, then renumber the unfinished ones
        from the driver's state."""
        self._wait(lambda: self._finishing == 0, "the finished micro-batches' checkpoints")
        iteration = self._state().iteration
        with self._lock:
            renumbered = []
            for order in self._pending:
                renumbered.append(dataclasses.replace(order, first_iteration=iteration))
                iteration += order.iterations
            self._pending, self._next_first = renumbered, iteration

    def _order(self, rank: int, header: Dict[str, Any], arrays: List[np.ndarray]) -> Dict[str, Any]:
        """A rank's ``next_order``: take its report of the pass it finished, answer its next pass (or wait, or stop)."""
        done = header.get("done") or {}
        deadline = time.monotonic() + ORDER_WAIT_SECONDS
        with self._lock:
            if done:
                self._take_report(rank, done, arrays)
            while True:
                if self._stopping or self.error is not None:
                    return {"stop": True}
                given = self._cursor.get(rank, -1)
                order = next((order for order in self._pending if order.batch.batch_id > given), None)
                if order is not None:
                    self._cursor[rank] = order.batch.batch_id
                    return {"order": order.to_wire()}
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return {"wait": True}
                self._lock.wait(remaining)

    def _take_report(self, rank: int, done: Dict[str, Any], arrays: List[np.ndarray]) -> None:
        """Keep a rank's report of a pass (rank 0's with its uploaded state); all ranks' make a PassResult."""
        batch_id = int(done["batchId"])
        if rank == 0 and done.get("nonFinite") is None:
            done = dict(done, state=joined_uploads(self._channel.take_uploaded(), f"micro-batch {batch_id}'s pass"))
        reports = self._reports.setdefault(batch_id, {})
        reports[rank] = (done, arrays)
        if len(reports) < self._workers:
            return
        del self._reports[batch_id]
        order = next(order for order in self._pending if order.batch.batch_id == batch_id)
        self._pending.remove(order)
        self._finishing += 1
        self._finished.put(_pass_result(order, reports))
        self._lock.notify_all()

    def _finish_passes(self) -> None:
        """``on_pass`` for every finished pass, in order, until the job ends."""
        while True:
            result = self._finished.get()
            if result is None:
                return
            try:
                if self.error is None:
                    self._on_pass(result)
            except BaseException as error:  # noqa: BLE001 - the streaming side raises it
                self._fail(error)
            finally:
                with self._lock:
                    self._finishing -= 1
                    self._lock.notify_all()

    def _fail(self, error: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = error
            self._lock.notify_all()


def _pass_result(order: ResidentOrder, reports: Dict[int, Tuple[Dict[str, Any], List[np.ndarray]]]) -> PassResult:
    """The ranks' reports of one pass as one result: the test totals summed, rank 0's values."""
    per_rank = [arrays[: int(done["totals"])] for done, arrays in reports.values() if int(done["totals"])]
    totals = [np.sum(parts, axis=0) for parts in zip(*per_rank)] if per_rank else []
    done, arrays = reports[0]
    values = arrays[int(done["totals"]):]
    names = list(done["metrics"])
    return PassResult(order, int(done["iteration"]), done.get("state"), done.get("nonFinite"), totals,
                      *values[:4], metrics=dict(zip(names, values[4:])))
