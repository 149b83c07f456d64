"""What the driver hands a segment's barrier tasks (:class:`SegmentSpec`) and what rank 0 hands back
(:class:`SegmentResult`): the contract between :mod:`sparktf.training.driver.segment_job` and
:func:`sparktf.training.worker.loop.run_segment`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from sparktf.data.batch_maps import MappedElements
from sparktf.spark.task_devices import GpuPlan
from sparktf.training.batch_schedule import BatchSchedule, EndlessBatches
from sparktf.training.checkpoint import ModelState
from sparktf.training.clipping import GradientClipping
from sparktf.training.state_source import StateSource
from sparktf.training.tables.worker_tables import Replicated, WorkerTables
from sparktf.training.worker.class_weights import ClassWeights
from sparktf.training.worker.gradient_exchange import Traffic
from sparktf.training.worker.step_clock import RankAnatomy
from sparktf.triggers import TrainingProgress, Trigger

__all__ = ["SegmentResult", "SegmentSpec"]


@dataclass
class SegmentSpec:
    """What every barrier task of a segment needs (pickled into the task closure).

    The driver fills in the launch's fields (``local_batches``, ``feed``,
    ``source``) for each launch: they depend on its worker count and job
    channel.

    Attributes
    ----------
    payload : pyspark.Broadcast
        ``ModelPayload`` bytes of the model (architecture, compile config).
    element_structure : tuple
        ``(feature_spec, label_spec)`` or ``(feature_spec,)``.
    start : TrainingProgress
        Progress before the segment's first iteration.
    stop : Trigger
        The segment ends after the first iteration where it fires.
    clipping : GradientClipping
        Clipping of the global gradient.
    collective_timeout : float
        Seconds a worker waits for its peers in a collective operation.
    gradient_compression : {None, "bf16", "fp16"}
        The wire dtype of the gradients in the all-reduce (None: float32).
    local_batches : list of int
        Records each rank takes per iteration (they add up to the global
        batch and differ by at most one).
    feed : BlockFeed or TFRecordFeed
        ``feed.open(shard, partition, local_batch, start_batch)`` gives the
        worker's batches; where ``feed.moves_shards``,
        ``feed.ready_shard(local_batches, start_batch)`` the shard whose
        stream the process holds open, if any.
    source : StateSource, optional
        The launch's job: its secret (authenticating the collective's
        connections) and the driver's job channel (peer directory, start and
        final state, heartbeats), or, without a channel, the start state in a
        broadcast (addresses exchanged with ``BarrierTaskContext.allGather``).
    gpus : GpuPlan
        How the tasks get their GPUs (see :mod:`sparktf.spark.task_devices`).
    metric_state : numpy.ndarray, optional
        The compiled metrics' states summed over the epoch before ``start``
        (a previous :class:`SegmentResult`'s), for a segment that starts
        mid-epoch; None starts them from nothing.
    class_weight : ClassWeights, optional
        ``optimize``'s class weights, folded into each batch's sample weights.
    maps : MappedElements, optional
        The functions each batch goes through before the model (the dataset's
        maps, the model's preprocessing); ``element_structure`` is what they
        return.
    tables : WorkerTables
        How the launch's workers hold the model's embedding tables (see
        :mod:`sparktf.training.tables.worker_tables`): replicated, or split
        among them as planned on the driver.
    schedule : BatchSchedule
        How the ranks read their shards: endlessly (epochs), or each record
        once, the last batch partial (a stream's micro-batch: ``SinglePass``).
    profile_steps : tuple of int, optional
        ``(start, end)``: the iterations whose phases' wall-clock spans each
        rank keeps for the timeline.
    """

    payload: Any
    element_structure: tuple
    start: TrainingProgress
    stop: Trigger
    clipping: GradientClipping
    collective_timeout: float
    gradient_compression: Optional[str] = None
    local_batches: List[int] = field(default_factory=list)
    feed: Any = None
    source: Optional[StateSource] = None
    gpus: GpuPlan = GpuPlan()
    metric_state: Optional[np.ndarray] = None
    class_weight: Optional[ClassWeights] = None
    maps: Optional[MappedElements] = None
    tables: WorkerTables = Replicated()
    schedule: BatchSchedule = EndlessBatches()
    profile_steps: Optional[Tuple[int, int]] = None


@dataclass
class SegmentResult:
    """What rank 0 returns at the end of a segment.

    Attributes
    ----------
    iteration : int
        Absolute iteration of the last update applied.
    non_finite_iteration : int, optional
        The iteration whose loss was not finite (its update was not
        applied); None when training went fine.
    state : ModelState, optional
        Weights (non-trainable ones averaged over workers) and optimizer
        variables after ``iteration`` (set by :func:`run_segment`).
    losses, learning_rates, wall_times, step_seconds : numpy.ndarray
        One entry per iteration run: mean loss over workers, learning rate
        used, time the iteration ended, its duration.
    timings : dict
        Seconds spent in each phase (``threads``, ``data_cache``,
        ``model_load``, ``warm_up``, ``state_fetch``, ``connect``, the step
        phases of ``step_clock.STEP_PHASES`` (``data``, ``lookup``,
        ``compute``, ``exchange``, ``apply``), ``finish``, ``state_upload``)
        on rank 0.
    workers : int
        The workers the segment ran on (set by the driver).
    metrics : dict
        Compiled metric name -> one value per iteration run: the metric over
        the epoch up to that iteration, so an epoch's last is the epoch's.
    metric_state : numpy.ndarray, optional
        The metrics' states summed over the epoch after ``iteration``.
    traffic : Traffic, optional
        The gradient bytes rank 0 sent, and what a dense exchange would have sent.
    anatomy : list of RankAnatomy
        What each rank measured (set by the driver from the ranks' records).
    """

    iteration: int
    non_finite_iteration: Optional[int]
    state: Optional[ModelState]
    losses: np.ndarray
    learning_rates: np.ndarray
    wall_times: np.ndarray
    step_seconds: np.ndarray
    timings: Dict[str, float] = field(default_factory=dict)
    workers: int = 0
    metrics: Dict[str, np.ndarray] = field(default_factory=dict)
    metric_state: Optional[np.ndarray] = None
    traffic: Optional[Traffic] = None
    anatomy: List[RankAnatomy] = field(default_factory=list)
