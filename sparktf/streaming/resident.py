"""``optimize_stream`` with a resident training job: ``foreachBatch`` stages, one long-lived job trains.

Each ``foreachBatch`` call stages its micro-batch (one Spark job writes it to
``model_dir/stream/staged/<batchId>/``, the manifest last:
:mod:`sparktf.data.staged_batches`) and returns, so Spark commits it and
plans the next one while the resident job
(:class:`~sparktf.training.driver.resident_job.ResidentJob`) trains it. The
staging is the log: the checkpoint written after a micro-batch's pass
records its ``batchId`` and its staging is then deleted, so a restart trains
every staged micro-batch after the checkpoint before the new ones, and a
micro-batch Spark replays that is staged already is not staged again.

``foreachBatch`` waits, before it stages, until fewer than ``max_staged``
micro-batches are staged and untrained (back-pressure: the wait is in the
progress as ``backpressure_seconds``, and ``backlog`` counts the staged and
untrained ones with it). See ``docs/design/streaming.md``.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, Optional, Sequence

import numpy as np

from sparktf.data.columnar import balanced_bounds
from sparktf.data.sparse import model_structure
from sparktf.data.staged_batches import StagedBatch, remove_staged, stage_micro_batch, staged_batches, staging_root
from sparktf.errors import TrainingError
from sparktf.spark.task_devices import gpu_plan
from sparktf.streaming.micro_batches import MicroBatchTrainer, Publishing, naming_micro_batch
from sparktf.training.driver import PassResult, ResidentJob, SegmentSpec, metrics_of_totals
from sparktf.triggers import MaxIteration, TrainingProgress

__all__ = ["ResidentTrainer", "MAX_STAGED"]

_LOG = logging.getLogger("sparktf.optimizer")
#: Micro-batches staged and untrained before ``foreachBatch`` waits (the default of ``optimize_stream``).
MAX_STAGED = 2


class ResidentTrainer(MicroBatchTrainer):
    """The ``foreachBatch`` function of ``optimize_stream`` with a resident training job.

    Its parameters are :class:`MicroBatchTrainer`'s (callbacks hear ``on_epoch_begin`` when a micro-batch is
    staged, ``on_epoch_end`` when it is trained), and ``max_staged``: the micro-batches staged and untrained
    before ``foreachBatch`` waits.
    """

    def __init__(self, optimizer: Any, publishing: Publishing, callbacks: Sequence[Any],
                 max_staged: int = MAX_STAGED):
        super().__init__(optimizer, publishing, callbacks)
        self._root = staging_root(optimizer.model_dir)
        self._max_staged = max_staged
        self._submitted: Dict[int, float] = {}  # batchId -> when it was staged
        self._waits: Dict[int, Dict[str, float]] = {}  # batchId -> its foreachBatch's staging and back-pressure
        self._job = self._resident_job()

    @property
    def error(self) -> Optional[BaseException]:
        return self._job.error

    def prepare(self) -> None:
        """Launch the resident job (it loads the model while the query starts)."""
        self._job.start(self._optimizer.iteration)

    def _resume(self) -> None:
        """The micro-batches a previous run of the query staged and did not train go first."""
        done, query_id = self._session.state.stream, self._query_id
        for staged in staged_batches(self._root):
            if staged.query_id != query_id:
                _LOG.warning("micro-batch %d staged in %s is of query %s, not of this query (%s): not trained; "
                             "delete the folder when its records are not needed", staged.batch_id, staged.folder,
                             staged.query_id, query_id)
            elif done is not None and done[0] == query_id and staged.batch_id <= done[1]:
                remove_staged(staged)  # trained: its checkpoint was written, its deletion was not
            else:
                _LOG.info("micro-batch %d was staged by a previous run and not trained: it trains first",
                          staged.batch_id)
                self._submit(staged)

    def __call__(self, batch: Any, batch_id: int) -> None:
        batch_id = int(batch_id)
        if self._trained_already(batch_id) or batch_id in self._submitted:
            return  # trained, or staged by a run that died before Spark's commit: it trains from its staging
        waited = self._job.wait_for_backlog(self._max_staged - 1)  # back-pressure: room for this one
        dataset = self._optimizer.dataset.micro_batch(batch)
        began = time.perf_counter()
        with naming_micro_batch(batch_id, batch):  # its records are converted as they are staged
            staged = stage_micro_batch(dataset.blocks, self._root, batch_id, self._query_id)
        staging = time.perf_counter() - began
        if staged.records == 0:
            remove_staged(staged)
            return
        for callback in self._callbacks:
            callback.on_epoch_begin(batch_id)
        self._waits[batch_id] = {"staging_seconds": staging, "backpressure_seconds": waited,
                                 "backlog": self._job.backlog + 1}  # known before training can take it
        self._submit(staged)

    def finish(self) -> None:
        """Train every staged micro-batch, then end the job (after the query ended)."""
        self._job.finish()

    def stop(self) -> None:
        """End the job after the micro-batch it trains (the staged ones after it train at the next start)."""
        self._job.stop()

    def _submit(self, staged: StagedBatch) -> None:
        dataset = self._optimizer.dataset
        self._submitted[staged.batch_id] = time.time()
        self._job.submit(staged, dataset.batch_size, dataset.seed if dataset.shuffle else None)

    def _resident_job(self) -> ResidentJob:
        optimizer = self._optimizer
        session, profile = optimizer.session, optimizer.resource_profile
        start = TrainingProgress(optimizer.iteration, 1, None, None)
        spec = SegmentSpec(self._session.payload(), model_structure(optimizer.model, self._elements.element),
                           start, MaxIteration(optimizer.iteration + 1), optimizer.clipping,
                           optimizer.collective_timeout, gradient_compression=optimizer.gradient_compression,
                           gpus=gpu_plan(session.conf, profile), maps=self._elements,
                           tables=self._session.tables.for_workers(),
                           local_batches=np.diff(balanced_bounds(optimizer.dataset.batch_size,
                                                                 optimizer.num_workers)).tolist())
        return ResidentJob(session, spec, optimizer.num_workers, self._session.capture, self._on_pass,
                           optimizer.max_failures, profile)

    def _on_pass(self, result: PassResult) -> None:
        """A pass the ranks finished: its checkpoint is written, then the driver's model takes its state, its staging
        goes, and its progress entry, version, summaries and callbacks follow."""
        optimizer, batch = self._optimizer, result.order.batch
        if result.state is None:
            raise TrainingError(f"the loss or a gradient was not finite at iteration {result.non_finite_iteration} "
                                f"of micro-batch {batch.batch_id} (its staging stays in {batch.folder}): nothing "
                                "of it was applied. Lower the learning rate, clip gradients or check the records")
        began = time.perf_counter()
        last_loss = float(result.losses[-1]) if len(result.losses) else None
        self._session.take_pass(result.state, (self._query_id, batch.batch_id), last_loss, optimizer.model_dir,
                                optimizer.keep_checkpoints, self._session.state.publish_due + 1)
        remove_staged(batch)
        tested = (metrics_of_totals(optimizer.model, model_structure(optimizer.model, self._elements.element),
                                    result.totals) if result.totals else {})
        timings = {"train_seconds": float(np.sum(result.step_seconds)),
                   "checkpoint_seconds": time.perf_counter() - began, **self._waits.pop(batch.batch_id, {})}
        staged_at = self._submitted.pop(batch.batch_id, time.time())
        self._record(batch.batch_id, staged_at, result.losses.tolist(), tested, batch.records, **timings)
