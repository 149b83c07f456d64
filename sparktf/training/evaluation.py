"""Record-weighted distributed evaluation of a compiled Keras model.

Each partition runs ``model.evaluate`` over its records, streamed batch by
batch (fresh metric state, the last batch may be short), and returns the *state variables* of the model's
metrics (loss tracker included): totals and counts, confusion counts, ...
The driver sums them over partitions, loads the sums into its own model's
metric objects and asks them for ``result()``. The loss tracker weights each
batch's mean loss by its number of records, so the numbers equal a local
``model.evaluate`` over all records, however unevenly they are partitioned.

The weights to evaluate stream to the tasks from a job channel on the driver
(:mod:`sparktf.training.state_source`), not through the JVM. Each task
reports its phase and batch counter to that channel, and the driver's
:class:`~sparktf.training.watchdog.JobWatchdog` cancels the job when a task
stops making progress for the timeout + 30 s (``spark.sparktf.watchdogSlack``):
evaluation never waits forever.
"""

from __future__ import annotations

import itertools
import secrets
import warnings
from functools import partial
from typing import Any, Dict, Iterable, Iterator, List, Optional

import numpy as np

from sparktf.collective.channel_client import NoHeartbeat
from sparktf.data.batch_maps import MappedElements
from sparktf.data.sparse import model_structure, model_values
from sparktf.errors import DataError, FailureRecord, SparkTFError
from sparktf.training.metric_state import build_metrics, load_metric_totals, metric_variables
from sparktf.training.state_source import StateSource
from sparktf.training.watchdog import DONE

__all__ = ["evaluate_blocks"]


def evaluate_blocks(
    model: Any,
    blocks: Any,
    elements: MappedElements,
    batch_size: int,
    payload: Any,
    state: Optional[Any] = None,
    timeout: float = 300.0,
    profile: Any = None,
) -> Dict[str, float]:
    """Evaluate ``model``'s compiled loss and metrics over every record of ``blocks``.

    Parameters
    ----------
    model : keras.Model
        The driver's compiled model (its metric objects compute the result).
    blocks : BlockSet
        The Blocks (see ``docs/internals.md``); keyed ones (a training
        layout) too, their keys dropped.
    elements : MappedElements
        The blocks' element structure, the maps their batches go through (the
        dataset's, the model's preprocessing) and the structure after them.
    batch_size : int
        Records per batch in each partition.
    payload : Shared
        ``ModelPayload`` bytes of the model (``SessionKind.share``).
    state : ModelState, optional
        The weights to evaluate (default: the payload's own); optimizer
        variables in it are not needed.
    timeout : float
        Seconds a task waits for the driver's job channel; a task that makes
        no progress for ``timeout`` + 30 s (``spark.sparktf.watchdogSlack``)
        gets the job cancelled.
    profile : pyspark.resource.ResourceProfile, optional
        The evaluation stage's resource profile (None: the session's defaults).

    Returns
    -------
    dict
        Metric name -> value, as ``model.evaluate(..., return_dict=True)``.

    Raises
    ------
    TrainingError
        The watchdog cancelled the job (naming the partition and its phase).
    """
    from sparktf.spark.jobs import run_job
    from sparktf.spark.task_devices import gpu_plan
    from sparktf.training.segment_job import job_channel
    from sparktf.training.watchdog import JobWatchdog

    secret = secrets.token_bytes(32)
    element_structure = model_structure(model, elements.element)  # sparse features as the model's inputs take them
    session = blocks.kind
    partitions = blocks.num_partitions
    host = session.rendezvous_host() if state is not None else None
    with job_channel(host, partitions, secret) as channel:
        broadcast = None
        if channel is not None:
            channel.serve_state(*state.to_wire())
        elif state is not None:
            broadcast = session.spark_context("evaluation without a job channel", "").broadcast(state)
        source = StateSource(channel and channel.address, secret, partitions, timeout, broadcast)
        task = partial(_evaluate_partition, payload, source if state is not None else None, elements,
                       element_structure, batch_size, gpu_plan(session.conf, profile))
        if blocks.keyed:
            task = partial(_unkeyed, task)
        collect = lambda: blocks.collect(task, profile=profile)  # noqa: E731
        try:
            if channel is None:
                per_partition = run_job(session, collect, what="the evaluation job")
            else:
                watchdog = JobWatchdog(session, channel, partitions, timeout, barrier=False)
                per_partition = watchdog.run(collect, what="the evaluation job")
        finally:
            if broadcast is not None:
                broadcast.destroy()
    if not per_partition:
        raise DataError("cannot evaluate: the dataset has no records")
    totals = [np.sum(values, axis=0) for values in zip(*per_partition)]
    _build_metrics(model, element_structure)
    return load_metric_totals(model, totals)


def _evaluate_partition(
    payload: Any,
    state: Optional[StateSource],
    elements: MappedElements,
    element_structure: tuple,
    batch_size: int,
    gpus: Any,
    blocks: Iterable[tuple],
) -> Iterator[List[np.ndarray]]:
    import keras
    from pyspark import TaskContext

    from sparktf.data.batching import inference_batches
    from sparktf.data.specs import pack
    from sparktf.models.cache import batch_mapper, load_cached
    from sparktf.spark.task_devices import prepare_tensorflow_task

    partition = TaskContext.get().partitionId()
    heartbeat = state.heartbeat(partition) if state is not None else NoHeartbeat()
    try:
        prepare_tensorflow_task(gpus)  # reported: starting TensorFlow's devices may take seconds
        heartbeat.phase = "data"
        batches = inference_batches(blocks, batch_size)  # one batch in memory at a time
        first = next(batches, None)
        totals = None
        if first is not None:
            heartbeat.phase = "model_load"
            model = load_cached(payload)
            if state is not None:
                heartbeat.phase = "state_fetch"
                state.fetch(partition).apply_to(model)
            heartbeat.phase = "evaluate"
            mapped = batch_mapper(elements, model)
            # lists as tuples: tf.data (under Keras' generator input) takes a list for one tensor, so a
            # list of feature columns (a multi-input model) would fail to build the input signature
            inputs = (keras.tree.lists_to_tuples(pack(element_structure, _keras_arrays(mapped(arrays),
                                                                                       element_structure)))
                      for arrays in itertools.chain([first], batches))
            count_batches = keras.callbacks.LambdaCallback(
                on_test_batch_end=lambda batch, logs: setattr(heartbeat, "iteration", batch + 1))
            with warnings.catch_warnings():  # a generator's end is how Keras learns the number of batches
                warnings.filterwarnings("ignore", message="Your input ran out of data")
                # Keras' own evaluate: a Keras Hub task's would preprocess the batches again
                keras.Model.evaluate(model, inputs, verbose=0, callbacks=[count_batches])
            totals = [np.array(v) for v in metric_variables(model.metrics)]
    except SparkTFError as error:  # sparktf's own error (bad data, a store): its record reaches the driver first
        heartbeat.stop(failure=FailureRecord.of(error, shard=partition))
        raise
    except BaseException:
        heartbeat.stop()
        raise
    heartbeat.stop(DONE)
    if totals is not None:
        yield totals


def _unkeyed(task: Any, blocks: Iterable[tuple]) -> Any:
    """``task`` over keyed Blocks without their keys (the order of records does not change metrics)."""
    return task(block[1:] for block in blocks)


def _build_metrics(model: Any, element_structure: tuple) -> None:
    """Create the driver model's metric variables from one all-zero record."""
    from sparktf.data.specs import flatten, pack

    leaves = [
        np.full((1, *spec.shape), b"", dtype=object)
        if spec.dtype.name == "string"
        else np.zeros((1, *spec.shape), dtype=spec.dtype.as_numpy_dtype)
        for spec in flatten(element_structure)
    ]
    element = pack(element_structure, _keras_arrays(leaves, element_structure))
    build_metrics(model, element[0], element[1] if len(element) > 1 else None)


def _keras_arrays(leaves: List[np.ndarray], element_structure: tuple) -> list:
    """The leaves as Keras' fit/evaluate take them: string (object) arrays as ``tf.string`` tensors, sparse ones
    (:func:`~sparktf.data.sparse.model_values`) as their specs say."""
    import tensorflow as tf

    from sparktf.data.specs import flatten

    leaves = model_values(flatten(element_structure), leaves)
    return [tf.constant(leaf, tf.string) if getattr(leaf, "dtype", None) == np.dtype(object) else leaf
            for leaf in leaves]
