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

from sparktf.collective.channel_client import start_heartbeat
from sparktf.data.block_feed import shards_for_claims
from sparktf.data.sparse import model_values
from sparktf.data.specs import flatten
from sparktf.errors import task_record
from sparktf.models.cache import batch_mapper, cached, derived, load_cached
from sparktf.models.payload import ModelPayload, payload_key
from sparktf.spark.task_devices import prepare_tensorflow_task
from sparktf.spark.worker_gc import freeze_alive
from sparktf.training.checkpoint import ModelState, RowRanges
from sparktf.training.state_source import StateSource
from sparktf.training.tables.sharded_tables import (HeldTables, RankShards, apply_start_state, state_rows,
                                                    working_features, working_model)
from sparktf.training.worker.class_weights import batch_parts
from sparktf.training.worker.failures import classified_failures
from sparktf.training.worker.gradient_exchange import GradientExchange
from sparktf.training.worker.segment_spec import SegmentResult, SegmentSpec
from sparktf.training.worker.step import TrainStep
from sparktf.training.worker.step_clock import PhaseClock
from sparktf.triggers import TrainingProgress

__all__ = ["run_segment", "train_iterations", "prepared_step", "state_source", "average_non_trainable"]


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
    world_size = len(context.getTaskInfos())
    address = context.getTaskInfos()[rank].address
    heartbeat = start_heartbeat(spec.directory, rank, world_size, spec.secret, spec.collective_timeout)
    heartbeat.step_window = partial(watch.take_window, address)
    failure = shard = None
    try:
        prepare_tensorflow_task(spec.gpus)
        watch.lap("threads")
        with ThreadPoolExecutor(2) as pool:  # connect and open the input while the model loads and compiles
            connecting = pool.submit(
                Communicator.from_barrier_context,
                context,
                spec.secret,
                spec.collective_timeout,
                spec.directory,
                spec.feed.ready_shard(spec.local_batches, spec.start.iteration),
            )
            opening = pool.submit(_open_input, spec, rank, blocks, connecting)
            try:
                step, held, kept = prepared_step(spec, opening, watch, heartbeat, rank, world_size)
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
            shards = _rank_shards(spec, held, kept, step, rank, communicator)
            held = None  # the shards hold their copy now
            result = train_iterations(spec, rank, shard, step, batches, communicator, watch, heartbeat, shards)
            heartbeat.phase = "finish"
            average_non_trainable(step.model, communicator)
            final, rows = _final_state(spec, step, shards, result.iteration, rank)
            watch.lap("finish")
            if final is not None:
                heartbeat.phase = "state_upload"
                result.state = state_source(spec, world_size).hand_back(rank, final, rows)
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
    shards: Optional[RankShards],
) -> SegmentResult:
    losses, learning_rates, wall_times, step_seconds, metrics = [], [], [], [], []
    progress = spec.start
    non_finite_iteration = None
    exchange = _TimedExchange(communicator, spec.gradient_compression, watch, heartbeat, shards)
    weight = spec.local_batches[shard] / sum(spec.local_batches)  # this rank's share of the global batch
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
        watch.lap("batches")
        heartbeat.phase = "compute" if shards is None else "lookup"
        iteration = progress.iteration + 1
        heartbeat.iteration = iteration
        if (iteration - 1) % per_epoch == 0:  # an epoch's first iteration
            step.set_metric_state(None)
        if spec.single_pass is not None:  # the pass's last batch is partial: its fill weighs nothing
            weight, mask = spec.single_pass.step(shard, iteration, spec.local_batches)
            sample_weight = spec.single_pass.masked(mask, sample_weight, spec.local_batches[shard])
        if shards is not None:
            features = shards.fetch_rows(features)
            watch.lap("lookup")
            heartbeat.phase = "compute"
        with classified_failures(rank, shard, iteration, warm_up=False):
            outcome = step.run(features, labels, exchange, weight, sample_weight=sample_weight)
        if not outcome.applied:  # a non-finite loss or gradient: nothing was applied
            non_finite_iteration = iteration
            break
        if shards is not None:
            shards.apply(spec.clipping)
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
    (``allreduce``) and its sends (``send``), and telling the heartbeat the step's phase (``exchange``, then
    ``apply``)."""

    def __init__(self, communicator: Any, compression: Optional[str], watch: PhaseClock, heartbeat: Any,
                 shards: Any = None):
        super().__init__(communicator, compression, shards)
        self._watch = watch
        self._heartbeat = heartbeat

    def __call__(self, layout: Any, parts: Any) -> Any:
        self._watch.lap("compute")
        self._heartbeat.phase = "exchange"
        sent = self.send_seconds
        summed = super().__call__(layout, parts)
        self._watch.lap("allreduce")
        self._heartbeat.phase = "apply"
        self._watch.add("send", self.send_seconds - sent)
        return summed


def prepared_step(
    spec: SegmentSpec,
    opening: Future,
    watch: PhaseClock,
    heartbeat: Any,
    rank: int,
    world_size: int,
    long_run: bool = False,
) -> Tuple[TrainStep, HeldTables, Optional[dict]]:
    """The process's TrainStep, traced and compiled (on the input's first batch), holding the segment's start state;
    the rank's rows of the sharded tables and their optimizer state from that state (none without any), and the ranks'
    shards kept with the step. A ``long_run`` (a stream's resident job) takes the XLA-compiled update at once.

    What loading the model or its warm-up step raises is classified (a model
    that cannot run is not relaunched); the input's errors are its own.
    """
    heartbeat.phase = "model_load"
    plan = spec.sharding
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
            if spec.single_pass is not None:  # a pass's batches all carry weights: traced once, here
                weights = spec.single_pass.masked(None, weights, spec.local_batches[shard])
            step.sharded = frozenset()
            step.warm_up(working_features(plan, step.model, features)[0] if plan.tables else features, labels, weights,
                         long_run)
        freeze_alive()  # the model and its traced graphs stay: keep them out of the daemon's gc after each task
        watch.lap("warm_up")
    heartbeat.phase = "state_fetch"
    rows = state_rows(step.model, plan, rank)  # the rank's rows of the sharded tables (none without)
    state = state_source(spec, world_size).fetch(rank, rows)  # also undoes the warm-up's update
    held = apply_start_state(state, step.model, plan), state.optimizer_state_folder
    watch.lap("state_fetch")
    return step, held, kept


def _rank_shards(spec: SegmentSpec, held: Tuple[HeldTables, Optional[str]], kept: Optional[dict], step: TrainStep,
                 rank: int, communicator: Any) -> Optional[RankShards]:
    """This rank's shards of the spec's sharded tables (None: none), holding its share of the start state and its
    optimizer state."""
    step.sharded = frozenset()
    plan = spec.sharding
    if not plan.tables:
        return None
    shards = RankShards(plan, step.model, rank, communicator, kept, spec.table_updates)
    shards.start(*held)
    step.sharded = shards.positions
    return shards


def state_source(spec: SegmentSpec, world_size: int) -> StateSource:
    """Where the segment's start state comes from and its final state goes: the job channel, or the broadcast."""
    return StateSource(spec.directory, spec.secret, world_size, spec.collective_timeout, spec.state)


def _final_state(spec: SegmentSpec, step: TrainStep, shards: Optional[RankShards], iteration: int,
                 rank: int) -> Tuple[Optional[ModelState], RowRanges]:
    """What the rank hands back and the rows of it that are its share of the sharded tables (None: nothing).

    Rank 0 hands back the model's state. With sharded tables, every rank writes its rows of their optimizer state
    to a new folder (the state names it) and hands back its rows of them, which the job channel joins; without a
    channel, the ranks gather them through the ring for rank 0's.
    """
    if shards is None:
        return (ModelState.capture(step.model, iteration) if rank == 0 else None), {}
    folder = shards.save_optimizer_state(spec.optimizer_state_root, iteration, spec.secret)
    if spec.directory is None:
        state, rows = shards.gathered_state(iteration), {}  # a collective: every rank takes part
    else:
        state, rows = shards.captured_state(iteration)
    state.optimizer_state_folder = folder  # the driver's next state names it (its own capture says which tables)
    return (state if rank == 0 or spec.directory is not None else None), rows


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
    start = spec.start.iteration if spec.single_pass is None else spec.single_pass.start_batch(spec.start.iteration)
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
    """The process's TrainStep (model + traced functions) for the payload, clipping and sharded tables, and the
    ranks' shards kept with the step (None without sharded tables).

    With sharded tables the step trains the model built with working tables instead, and the whole model is never
    built here (``training.tables``).
    """
    step = f"train-step/{spec.clipping!r}"  # kept on the model's cache entry: a reloaded model gets a new step
    plan = spec.sharding
    if not plan.tables:
        return derived(load_cached(spec.payload), step, lambda model: TrainStep(model, spec.clipping,
                                                                                 spec.table_updates)), None
    local_batch = max(spec.local_batches)
    model = cached(f"{payload_key(spec.payload.value)}/working/{spec.clipping!r}/{plan!r}/{local_batch}",
                   lambda: working_model(ModelPayload.from_bytes(spec.payload.value), plan, local_batch))
    return derived(model, step, lambda model: (TrainStep(model, spec.clipping, spec.table_updates), {}))


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
