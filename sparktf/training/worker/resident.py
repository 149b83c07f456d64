"""A rank of a resident training job: one barrier task that trains pass after pass until the driver says stop.

A stream's resident job (see ``docs/design/streaming.md``) is launched once
and stays up across micro-batches. Each rank connects to its peers, loads
the model and traces its step once, then asks the driver's job channel for
its next order (``next_order``, a long poll: the rank's phase is ``idle``,
which the watchdog does not take for a stall). An order names a staged
micro-batch (:mod:`sparktf.data.staged_batches`) and the iteration before
it. The rank then, in the same task:

1. reads its contiguous share of the micro-batch's records (the shards of
   :func:`~sparktf.data.columnar.pass_bounds`, as a per-micro-batch job cuts
   them);
2. tests: evaluates its share with the weights from before the pass and
   keeps its metric states' totals (the driver adds the ranks' up);
3. trains one pass of ``ceil(n / batch_size)`` global batches with
   :func:`~sparktf.training.worker.loop.train_iterations`, the partial last
   batch masked (:class:`~sparktf.training.batch_schedule.SinglePass`);
4. averages the non-trainable variables; rank 0 uploads the state;
5. reports the pass with its next ``next_order``: its test totals and, on
   rank 0, the per-iteration losses and metrics.

The step is prepared (traced, compiled, given the start state) on a batch
of zeros before the first order arrives, while Spark plans the first
micro-batch. This module runs on executors: it never imports driver-only
modules.
"""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import Future
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np

from sparktf.collective.channel_client import IDLE, ChannelClient
from sparktf.data.columnar import Block, balanced_bounds, pass_bounds
from sparktf.data.staged_batches import StagedBatch, read_records
from sparktf.data.specs import leaf_specs
from sparktf.errors import task_record
from sparktf.models.cache import batch_mapper
from sparktf.spark.task_devices import prepare_tensorflow_task
from sparktf.training.batch_schedule import SinglePass
from sparktf.training.metric_state import metric_variables
from sparktf.training.tables.rank_tables import RankTables
from sparktf.training.worker.evaluation import keras_element
from sparktf.training.worker.loop import average_non_trainable, prepared_step, train_iterations
from sparktf.training.worker.segment_spec import SegmentResult, SegmentSpec
from sparktf.training.worker.step import TrainStep
from sparktf.training.worker.step_clock import PhaseClock
from sparktf.triggers import MaxIteration, TrainingProgress

__all__ = ["ResidentOrder", "run_resident", "ORDER_WAIT_SECONDS", "TEST_BATCH_FACTOR"]

_LOG = logging.getLogger("sparktf.optimizer")
#: The longest the driver holds a ``next_order`` request before it answers "wait" (the rank asks again).
ORDER_WAIT_SECONDS = 5.0
#: The test pass's batches hold this many local training batches (a forward pass keeps no gradients).
TEST_BATCH_FACTOR = 4


@dataclasses.dataclass(frozen=True)
class ResidentOrder:
    """One pass of a resident job: a staged micro-batch, trained after ``first_iteration``.

    Attributes
    ----------
    batch : StagedBatch
        The micro-batch.
    first_iteration : int
        The iteration before the pass.
    batch_size : int
        The global batch.
    shuffle_seed : int, optional
        Shuffle each rank's share with this seed (None: records in order).
    """

    batch: StagedBatch
    first_iteration: int
    batch_size: int
    shuffle_seed: Optional[int] = None

    @property
    def iterations(self) -> int:
        """The pass's global batches."""
        return -(-self.batch.records // self.batch_size)

    def to_wire(self) -> Dict[str, Any]:
        return {"batch": self.batch.to_wire(), "first": self.first_iteration, "batchSize": self.batch_size,
                "seed": self.shuffle_seed}

    @classmethod
    def from_wire(cls, message: Dict[str, Any]) -> "ResidentOrder":
        seed = message.get("seed")
        return cls(StagedBatch.from_wire(message["batch"]), int(message["first"]), int(message["batchSize"]),
                   None if seed is None else int(seed))


def run_resident(spec: SegmentSpec, partition: Iterable[Any]) -> Iterator[Any]:
    """The barrier task of a resident job (its partition is a placeholder): passes until the driver says stop.

    Yields the rank's anatomy (what the passes report goes to the driver with each ``next_order``).
    """
    from pyspark import BarrierTaskContext

    from sparktf.collective import Communicator

    for _ in partition:  # the placeholder's items: nothing to read
        pass
    watch = PhaseClock(spec.profile_steps)
    context = BarrierTaskContext.get()
    rank, world_size = context.partitionId(), len(context.getTaskInfos())
    address = context.getTaskInfos()[rank].address
    heartbeat = spec.source.heartbeat(rank)
    failure = None
    try:
        prepare_tensorflow_task(spec.gpus)
        communicator = Communicator.from_barrier_context(context, spec.source.secret, spec.collective_timeout,
                                                         spec.source.address)
        watch.lap("connect")
        try:
            with ChannelClient(spec.source.address, rank, world_size, spec.source.secret,
                               spec.collective_timeout) as orders:
                rank_pass = _RankPasses(spec, rank, world_size, communicator, watch, heartbeat)
                rank_pass.prepare()  # while Spark plans the first micro-batch
                done: Tuple[Dict[str, Any], List[np.ndarray]] = ({}, [])
                while True:
                    order = _next_order(orders, heartbeat, *done, spec.collective_timeout)
                    if order is None:
                        break
                    done = rank_pass.run(order)
        finally:
            communicator.close()
    except BaseException as error:
        failure = task_record(error, rank, rank)
        raise
    finally:
        heartbeat.stop(failure=failure)
    yield rank_pass.watch.anatomy(rank, address, address.rsplit(":", 1)[0])  # the last pass's


def _next_order(orders: ChannelClient, heartbeat: Any, done: Dict[str, Any], arrays: List[np.ndarray],
                timeout: float) -> Optional[ResidentOrder]:
    """The driver's next order (None: stop), reporting ``done`` (the pass finished, if any) with the first ask."""
    heartbeat.phase = IDLE
    while True:
        answer, _ = orders.request({"op": "next_order", "done": done}, timeout + ORDER_WAIT_SECONDS, arrays,
                                   what="asking the driver for the next micro-batch")
        done, arrays = {}, []
        if answer.get("stop"):
            return None
        if "order" in answer:
            return ResidentOrder.from_wire(answer["order"])


class _RankPasses:
    """One rank's passes: the step is prepared on the first pass's first batch and kept for every later one."""

    def __init__(self, spec: SegmentSpec, rank: int, world_size: int, communicator: Any, watch: PhaseClock,
                 heartbeat: Any):
        self.spec, self.rank, self.world_size = spec, rank, world_size
        self.communicator, self.watch, self.heartbeat = communicator, watch, heartbeat
        self.step: Optional[TrainStep] = None
        self.tables: Optional[RankTables] = None

    def prepare(self) -> None:
        """Load the model, trace and compile its step and Keras' test function on a batch of zeros (empty strings)
        of the records' structure, and take the start state, before the first micro-batch arrives. A model or map
        that cannot take such a batch is prepared on the first micro-batch's instead."""
        spec, local = self.spec, self.spec.local_batches
        leaves = leaf_specs(spec.maps.stored, "records")
        if any(leaf.sparse for leaf in leaves):  # sparse columns' Blocks have a layout of their own
            return
        zeros = [np.full((local[self.rank], *leaf.shape), b"", object) if leaf.is_string
                 else np.zeros((local[self.rank], *leaf.shape), leaf.dtype) for leaf in leaves]
        opened: Future = Future()
        opened.set_result((None, zeros, self.rank))
        ready = dataclasses.replace(spec, schedule=SinglePass(spec.start.iteration, tuple(local)))
        try:
            self._prepare(ready, opened, self.watch)
            test_batch = [np.concatenate([array] * TEST_BATCH_FACTOR) for array in zeros]
            _test_totals(self.step, ready, tuple(test_batch), len(test_batch[0]))  # Keras' test function traced too
        except Exception as error:  # noqa: BLE001 - traced on the first micro-batch instead, which raises what is wrong
            _LOG.info("rank %d prepares its step on the first micro-batch: a batch of zeros failed (%s)", self.rank,
                      error)

    def run(self, order: ResidentOrder) -> Tuple[Dict[str, Any], List[np.ndarray]]:
        """Test then train one pass, timed by a clock of its own (a job that lives for days keeps no row of every
        step it ran); what the rank reports of it."""
        if self.step is not None:
            self.watch = PhaseClock(self.spec.profile_steps)
        spec, rank, heartbeat, watch = self.spec, self.rank, self.heartbeat, self.watch
        heartbeat.phase = "data"
        records = order.batch.records
        bounds = pass_bounds(records, order.batch_size, self.world_size)
        local = np.diff(balanced_bounds(order.batch_size, self.world_size)).tolist()
        shard = _shard(order, bounds[rank], bounds[rank + 1], local[rank])
        watch.lap("data_cache")
        pass_spec = dataclasses.replace(
            spec, local_batches=local, metric_state=None,
            start=TrainingProgress(order.first_iteration, order.iterations, None, None),
            stop=MaxIteration(order.first_iteration + order.iterations),
            schedule=SinglePass(order.first_iteration, tuple(np.diff(bounds).tolist())))
        batches = _pass_batches(shard, local[rank], order.iterations)
        if self.step is None:
            opened: Future = Future()
            opened.set_result((None, next(batches), rank))
            self._prepare(pass_spec, opened, watch)
            batches = _pass_batches(shard, local[rank], order.iterations)
        real = shard if bounds[rank + 1] > bounds[rank] else None
        heartbeat.phase = "test"
        totals = _test_totals(self.step, pass_spec, real, TEST_BATCH_FACTOR * local[rank])
        watch.lap("test")
        result = train_iterations(pass_spec, rank, rank, self.step, batches, self.communicator, watch, heartbeat,
                                  self.tables)
        self.tables.end_segment(self.step.model)  # a micro-batch's end: the dynamic tables evict, alike everywhere
        average_non_trainable(self.step.model, self.communicator)
        if result.non_finite_iteration is None:
            final, rows = self.tables.finish(self.step.model, result.iteration, rank, spec.source.secret, channel=True)
            if final is not None:
                heartbeat.phase = "state_upload"
                spec.source.hand_back(rank, final, rows)
                watch.lap("state_upload")
        return _report(order, rank, totals, result)

    def _prepare(self, spec: SegmentSpec, opened: Future, watch: PhaseClock) -> None:
        """The process's step, warmed up on the batch ``opened`` holds, with the job's start state; the rank's tables."""
        self.step, held, kept = prepared_step(spec, opened, watch, self.heartbeat, self.rank, long_run=True)
        self.tables = spec.tables.on_rank(self.step.model, self.rank, self.communicator, kept, held)


def _shard(order: ResidentOrder, start: int, stop: int, local_batch: int) -> Block:
    """The rank's records of the pass; a rank with none reads the micro-batch's first records as its batches'
    fill (weighted 0)."""
    if stop == start:
        start, stop = 0, min(order.batch.records, local_batch)
    shard = read_records(order.batch.files, start, stop)
    if order.shuffle_seed is None:
        return shard
    order_of = np.random.default_rng([order.shuffle_seed, order.batch.batch_id, start]).permutation(stop - start)
    return tuple(array[order_of] for array in shard)


def _pass_batches(shard: Block, local_batch: int, iterations: int) -> Iterator[List[np.ndarray]]:
    """The rank's batches of the pass: its records in order, the last batch filled from its first records."""
    size = len(shard[0])
    for index in range(iterations):
        picks = (index * local_batch + np.arange(local_batch)) % size
        yield [array[picks] for array in shard]


def _test_totals(step: TrainStep, spec: SegmentSpec, shard: Optional[Block], batch: int) -> List[np.ndarray]:
    """The model's compiled metric states summed over the rank's real records (none: an empty list), with the
    weights from before the pass."""
    import keras

    if shard is None:
        return []
    model = step.model
    mapped = batch_mapper(spec.maps, model)
    totals: Optional[List[np.ndarray]] = None
    for start in range(0, len(shard[0]), batch):
        arrays = [array[start:start + batch] for array in shard]
        keras.Model.test_on_batch(model, *keras_element(mapped(arrays), spec.element_structure))
        states = [np.array(v, np.float64) for v in metric_variables(model.metrics)]
        totals = states if totals is None else [a + b for a, b in zip(totals, states)]
    return totals or []


def _report(order: ResidentOrder, rank: int, totals: List[np.ndarray],
            result: SegmentResult) -> Tuple[Dict[str, Any], List[np.ndarray]]:
    """What the rank tells the driver of its pass: the header and arrays of its next ``next_order``."""
    header: Dict[str, Any] = {"batchId": order.batch.batch_id, "totals": len(totals)}
    arrays = list(totals)
    if rank == 0:
        names = sorted(result.metrics)
        header.update(iteration=result.iteration, nonFinite=result.non_finite_iteration, metrics=names)
        arrays += [result.losses, result.learning_rates, result.wall_times, result.step_seconds,
                   *(result.metrics[name] for name in names)]
    return header, arrays
