"""The training loop of one barrier task (one worker), for one segment of training.

:func:`run_segment` is the segment's barrier job (see ``docs/design/training.md``,
"A segment on a worker"): it connects the worker to its peers, opens its
batches from ``spec.feed``, takes the model and its traced step from the
process's cache, assigns the segment's start state, runs
:meth:`TrainStep.run` until the segment's stop trigger fires on the progress
every worker sees, averages the non-trainable variables, and on rank 0
uploads the state and returns a :class:`SegmentResult`: the per-iteration
records and where the time went. A heartbeat reports the rank's phase and
iteration to the driver's watchdog throughout, and rank 0's carries every
iteration's loss and metrics for the driver's live callbacks.

This module runs on executors: it never imports driver-only modules.
"""

from __future__ import annotations

import itertools
import time
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple

import numpy as np

from sparktf.data.block_feed import shards_for_claims
from sparktf.data.sparse import model_values
from sparktf.data.specs import flatten
from sparktf.errors import task_record
from sparktf.models.cache import batch_mapper, derived
from sparktf.spark.task_devices import prepare_tensorflow_task
from sparktf.spark.worker_gc import freeze_alive
from sparktf.training.tables.rank_tables import RankTables
from sparktf.training.tables.sharded_tables import HeldTables
from sparktf.training.worker.class_weights import batch_parts
from sparktf.training.worker.failures import classified_failures
from sparktf.training.worker.gradient_exchange import GradientExchange
from sparktf.training.worker.segment_spec import SegmentResult, SegmentSpec
from sparktf.training.worker.step import TrainStep
from sparktf.training.worker.step_clock import PhaseClock
from sparktf.triggers import TrainingProgress

__all__ = ["run_segment", "train_iterations", "prepared_step", "average_non_trainable"]


def run_segment(spec: SegmentSpec, blocks: Iterable[tuple]) -> Iterator[SegmentResult]:
    """Run one training segment in a barrier task; rank 0 yields its :class:`SegmentResult`, every rank its
    :class:`~sparktf.training.worker.step_clock.RankAnatomy`.

    Parameters
    ----------
    spec : SegmentSpec
        The segment's settings.
    blocks : iterable
        This task's partition of the training RDD (what ``spec.feed`` reads).
    """
    from pyspark import BarrierTaskContext

    from sparktf.collective import Communicator

    watch = PhaseClock(spec.profile_steps)
    context = BarrierTaskContext.get()
    rank = context.partitionId()
    address = context.getTaskInfos()[rank].address
    heartbeat = spec.source.heartbeat(rank)
    heartbeat.step_window = partial(watch.take_window, address)
    failure = shard = None
    try:
        prepare_tensorflow_task(spec.gpus)
        watch.lap("threads")
        with ThreadPoolExecutor(2) as pool:  # connect and open the input while the model loads and compiles
            connecting = pool.submit(
                Communicator.from_barrier_context,
                context,
                spec.source.secret,
                spec.collective_timeout,
                spec.source.address,
                spec.feed.ready_shard(spec.local_batches, spec.start.iteration),
            )
            opening = pool.submit(_open_input, spec, rank, blocks, connecting)
            try:
                step, held, kept = prepared_step(spec, opening, watch, heartbeat, rank)
                heartbeat.phase = "data_cache"
                stream, first_batch, shard = opening.result()
                watch.lap("data_cache")
                heartbeat.phase = "connect"
            except BaseException:
                _close_when_opened(opening)
                _close_when_connected(connecting)
                raise
            communicator = connecting.result()
        watch.lap("connect")
        finished = False
        try:
            batches = itertools.chain([first_batch], stream)
            tables = spec.tables.on_rank(step.model, rank, communicator, kept, held)
            held = None  # the rank's tables hold their copy now
            result = train_iterations(spec, rank, shard, step, batches, communicator, watch, heartbeat, tables)
            heartbeat.phase = "finish"
            tables.end_segment(step.model)  # a boundary: the dynamic tables evict, alike on every rank
            average_non_trainable(step.model, communicator)
            final, rows = tables.finish(step.model, result.iteration, rank, spec.source.secret, spec.source.address is not None)
            watch.lap("finish")
            if final is not None:
                heartbeat.phase = "state_upload"
                result.state = spec.source.hand_back(rank, final, rows)
                watch.lap("state_upload")
            finished = True
        finally:
            communicator.close()
            stream.close(wait=finished, timeout=spec.collective_timeout)  # the task's input read to its end
            watch.lap("input_close")
    except BaseException as error:
        failure = task_record(error, rank, shard)  # told: the driver decides on the record, not on Spark's text
        raise
    finally:
        heartbeat.stop(failure=failure)
    if rank == 0:
        result.timings = watch.seconds
        yield result
    yield watch.anatomy(rank, address, address.rsplit(":", 1)[0])


def train_iterations(
    spec: SegmentSpec,
    rank: int,
    shard: int,
    step: TrainStep,
    batches: Iterator[List[np.ndarray]],
    communicator: Any,
    watch: PhaseClock,
    heartbeat: Any,
    tables: RankTables,
) -> SegmentResult:
    losses, learning_rates, wall_times, step_seconds, metrics = [], [], [], [], []
    progress = spec.start
    non_finite_iteration = None
    exchange = _TimedExchange(communicator, spec.gradient_compression, watch, heartbeat, tables)
    per_epoch = progress.iterations_per_epoch
    mapped = batch_mapper(spec.maps, step.model)  # once a segment, not a cache lookup per batch
    step.set_metric_state(spec.metric_state if progress.iteration % per_epoch else None)
    if rank == 0:
        heartbeat.set_batch_names(["loss", *step.metric_names])
    while True:  # the heartbeat tells the step's phase (STEP_PHASES): where a rank that hangs was
        heartbeat.phase = "data"
        watch.step(progress.iteration + 1)
        started = time.perf_counter()
        features, labels, sample_weight = _features_labels(spec, mapped, next(batches))
        watch.lap("data")
        heartbeat.phase = tables.lookup_phase
        iteration = progress.iteration + 1
        heartbeat.iteration = iteration
        if (iteration - 1) % per_epoch == 0:  # an epoch's first iteration
            step.set_metric_state(None)
        # this rank's share of the global batch, and its sample weights (a pass's partial last batch: masked)
        weight, sample_weight = spec.schedule.weights(shard, iteration, spec.local_batches, sample_weight)
        features = tables.lookup(features)
        watch.lap("lookup")
        heartbeat.phase = "compute"
        with classified_failures(rank, shard, iteration, warm_up=False):
            outcome = step.run(features, labels, exchange, weight, sample_weight=sample_weight)
        if not outcome.applied:  # a non-finite loss or gradient: nothing was applied
            non_finite_iteration = iteration
            break
        tables.apply(spec.clipping)
        ended = watch.lap("apply")
        learning_rates.append(outcome.learning_rate)
        losses.append(outcome.loss)
        metrics.append(outcome.metrics)
        heartbeat.loss = float(outcome.loss)
        if rank == 0:
            heartbeat.add_batch(iteration, (outcome.loss, *outcome.metrics))
        wall_times.append(time.time())
        step_seconds.append(ended - started)
        progress = TrainingProgress(
            iteration, progress.iterations_per_epoch, outcome.loss, progress.score
        )
        if spec.stop(progress):
            break
    return SegmentResult(
        iteration=progress.iteration,
        non_finite_iteration=non_finite_iteration,
        state=None,
        losses=np.array(losses, np.float64),
        learning_rates=np.array(learning_rates, np.float64),
        wall_times=np.array(wall_times, np.float64),
        step_seconds=np.array(step_seconds, np.float64),
        metrics={name: np.array([row[i] for row in metrics], np.float64)
                 for i, name in enumerate(step.metric_names)},
        metric_state=step.metric_state(),
        traffic=exchange.traffic,
    )


class _TimedExchange(GradientExchange):
    """The step's gradient exchange (see ``training.worker.gradient_exchange``), timing ``compute`` before it, itself
    (``exchange``) and its ring traffic (``send``, ``receive``, ``waited``), and telling the heartbeat the step's phase
    (``exchange``, then ``apply``)."""

    def __init__(self, communicator: Any, compression: Optional[str], watch: PhaseClock, heartbeat: Any,
                 tables: RankTables):
        super().__init__(communicator, compression, tables)
        self._watch = watch
        self._heartbeat = heartbeat

    def __call__(self, layout: Any, parts: Any) -> Any:
        self._watch.lap("compute")
        self._heartbeat.phase = "exchange"
        before = self.wire_seconds
        summed = super().__call__(layout, parts)
        self._watch.lap("exchange")
        self._heartbeat.phase = "apply"
        for column, seconds, earlier in zip(before._fields, self.wire_seconds, before):
            self._watch.add(column, seconds - earlier)
        return summed


def prepared_step(
    spec: SegmentSpec,
    opening: Future,
    watch: PhaseClock,
    heartbeat: Any,
    rank: int,
    long_run: bool = False,
) -> Tuple[TrainStep, HeldTables, Optional[dict]]:
    """The process's TrainStep, traced and compiled (on the input's first batch), holding the segment's start state;
    the rank's rows of the sharded tables and their optimizer state from that state (none without any), and the ranks'
    shards kept with the step. A ``long_run`` (a stream's resident job) takes the XLA-compiled update at once.

    What loading the model or its warm-up step raises is classified (a model
    that cannot run is not relaunched); the input's errors are its own.
    """
    heartbeat.phase = "model_load"
    with classified_failures(rank, None, spec.start.iteration + 1, warm_up=True):
        step, kept = _cached_step(spec)
    watch.lap("model_load")
    if not step.warmed_up or (long_run and step.compile_pending):
        heartbeat.phase = "data_cache"
        _, batch, shard = opening.result()
        watch.lap("data_cache")
        heartbeat.phase = "warm_up"
        with classified_failures(rank, shard, spec.start.iteration + 1, warm_up=True):
            features, labels, weights = _features_labels(spec, batch_mapper(spec.maps, step.model), batch)
            weights = spec.schedule.warm_up_weights(weights, spec.local_batches[shard])
            step.warm_up(spec.tables.warm_up_features(step.model, features), labels, weights, long_run)
        freeze_alive()  # the model and its traced graphs stay: keep them out of the daemon's gc after each task
        watch.lap("warm_up")
    heartbeat.phase = "state_fetch"
    rows = spec.tables.start_rows(step.model, rank)  # the rank's rows of the sharded tables (none without)
    state = spec.source.fetch(rank, rows)  # also undoes the warm-up's update
    held = spec.tables.take_start_state(state, step.model)
    watch.lap("state_fetch")
    return step, held, kept


def _features_labels(spec: SegmentSpec, mapped: Callable[[list], list], arrays: List[np.ndarray]) -> tuple:
    """``(features, labels, sample_weight)`` of one batch after ``mapped``, its maps (see
    ``training.worker.class_weights.batch_parts``)."""
    arrays = mapped(arrays)
    arrays = model_values(flatten(spec.element_structure), arrays)  # sparse leaves as the model's inputs take them
    return batch_parts(spec.element_structure, arrays, spec.class_weight)


def _open_input(spec: SegmentSpec, rank: int, blocks: Iterable[tuple], connecting: Future) -> tuple:
    """``(stream, first batch, shard)``: the batches of the input shard the rank reads, from the segment's first
    iteration on.

    The shard is the rank's own unless the feed's shards move
    (``feed.moves_shards``) and the ranks' processes hold other shards'
    streams open (``feed.ready_shard``, published when the ranks connect):
    then each keeps reading the one it has, which spares rebuilding a
    ``tf.data`` pipeline when Spark gives the ranks each other's Python
    workers. Only then does opening wait for the ranks to connect.
    """
    shard = shards_for_claims(connecting.result().claims)[rank] if spec.feed.moves_shards else rank
    start = spec.schedule.start_batch(spec.start.iteration)
    stream = spec.feed.open(shard, blocks, spec.local_batches[shard], start)
    try:
        return stream, next(stream), shard
    except BaseException:
        stream.close(wait=False, timeout=0)
        raise


def _close_when_opened(opening: Future) -> None:
    """Close the input a failed task opened (without waiting for its reads)."""
    if opening.exception() is None:
        opening.result()[0].close(wait=False, timeout=0)


def _close_when_connected(connecting: Future) -> None:
    """Wait for the connection a failed task started (its peers connect too), then close it."""
    if connecting.exception() is None:
        connecting.result().close()


def _cached_step(spec: SegmentSpec) -> Tuple[TrainStep, Optional[dict]]:
    """The process's TrainStep (model + traced functions) for the payload, clipping and tables, kept on its model's
    cache entry (a reloaded model gets a new step), and what the rank's tables keep with the step (None: nothing)."""
    model = spec.tables.step_model(spec.payload, max(spec.local_batches), spec.clipping)
    return derived(model, f"train-step/{spec.clipping!r}", lambda model: (
        TrainStep(model, spec.clipping, spec.tables.updates, spec.tables.owned_positions(model)),
        spec.tables.kept_with_step()))


def average_non_trainable(model: Any, communicator: Any) -> None:
    """All-reduce (mean) the non-trainable float variables, e.g. BatchNorm moving statistics."""
    trainable = {id(v) for v in model.trainable_variables}
    variables = [
        v
        for v in model.weights
        if id(v) not in trainable and np.dtype(v.dtype).kind == "f"
    ]
    if not variables:
        return
    values = [np.asarray(v, dtype=np.float32).ravel() for v in variables]
    fused = np.concatenate(values)
    communicator.allreduce(fused, op="mean")
    offset = 0
    for variable, value in zip(variables, values):
        piece = fused[offset : offset + value.size]
        variable.assign(piece.reshape(tuple(variable.shape)).astype(np.dtype(variable.dtype)))
        offset += value.size
