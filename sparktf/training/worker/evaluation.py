"""A worker's side of distributed evaluation: one partition's metric states (see
:mod:`sparktf.training.driver.evaluation`).

The task streams its partition batch by batch through Keras' own ``evaluate``
(fresh metric state, the last batch may be short) and yields the state
variables of the model's metrics; the driver sums them over partitions.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any, Iterable, Iterator, List, Optional

import numpy as np

from sparktf.collective.channel_client import DONE, NoHeartbeat
from sparktf.data.batch_maps import MappedElements
from sparktf.data.sparse import model_values
from sparktf.errors import task_record
from sparktf.training.metric_state import metric_variables
from sparktf.training.state_source import StateSource
from sparktf.training.tables.plan import ShardPlan
from sparktf.training.tables.sharded_evaluation import BatchRows

__all__ = ["evaluate_partition", "keras_arrays", "keras_element", "unkeyed"]


def evaluate_partition(
    payload: Any,
    state: Optional[StateSource],
    elements: MappedElements,
    element_structure: tuple,
    batch_size: int,
    gpus: Any,
    tables: Optional[ShardPlan],
    blocks: Iterable[tuple],
) -> Iterator[List[np.ndarray]]:
    """One evaluation task: ``model.evaluate`` over its partition's ``blocks``, yielding its metrics' state variables.

    The weights come from ``state`` (the driver's job channel or a broadcast) or the payload's own; the task
    reports its phase and batch to the channel's heartbeat, and a sparktf error's record before it raises.
    With sharded ``tables`` (and a channel), the model has working tables of a batch's rows, which each batch
    fetches from the driver by id (:class:`~sparktf.training.tables.sharded_evaluation.BatchRows`).
    """
    import keras
    from pyspark import TaskContext

    from sparktf.data.batching import inference_batches
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
        if first is not None and tables is not None:
            totals = _evaluate_with_batch_rows(payload, state, elements, element_structure, batch_size, tables,
                                               itertools.chain([first], batches), heartbeat, partition)
        elif first is not None:
            heartbeat.phase = "model_load"
            model = load_cached(payload)
            if state is not None:
                heartbeat.phase = "state_fetch"
                state.fetch(partition).apply_to(model)
            heartbeat.phase = "evaluate"
            mapped = batch_mapper(elements, model)
            inputs = (keras_element(mapped(arrays), element_structure)
                      for arrays in itertools.chain([first], batches))
            count_batches = keras.callbacks.LambdaCallback(
                on_test_batch_end=lambda batch, logs: setattr(heartbeat, "iteration", batch + 1))
            with warnings.catch_warnings():  # a generator's end is how Keras learns the number of batches
                warnings.filterwarnings("ignore", message="Your input ran out of data")
                # Keras' own evaluate: a Keras Hub task's would preprocess the batches again
                keras.Model.evaluate(model, inputs, verbose=0, callbacks=[count_batches])
            totals = [np.array(v) for v in metric_variables(model.metrics)]
    except BaseException as error:  # sparktf's own error (bad data, a store): its record reaches the driver first
        heartbeat.stop(failure=task_record(error, shard=partition))
        raise
    heartbeat.stop(DONE)
    if totals is not None:
        yield totals


def _evaluate_with_batch_rows(payload: Any, state: StateSource, elements: MappedElements, element_structure: tuple,
                              batch_size: int, tables: ShardPlan, batches: Iterator[list], heartbeat: Any,
                              partition: int) -> List[np.ndarray]:
    """The partition's summed metric states, each batch evaluated with the rows its ids look up in the sharded
    tables, fetched from the driver (the task never holds a whole table)."""
    import keras

    from sparktf.models.cache import batch_mapper

    heartbeat.phase = "model_load"
    rows = BatchRows(payload, tables, batch_size)
    heartbeat.phase = "state_fetch"
    rows.start(state.fetch(partition, rows.no_rows))
    heartbeat.phase = "evaluate"
    mapped = batch_mapper(elements, rows.model)
    totals: Optional[List[np.ndarray]] = None
    with state.rows_by_id(partition) as rows_by_id:
        for count, arrays in enumerate(batches, 1):
            features, *rest = keras_element(mapped(arrays), element_structure)
            # Keras' own test_on_batch (a Keras Hub task's would preprocess again); it resets the metrics first,
            # so each batch's states are added here, as the driver adds the partitions'
            keras.Model.test_on_batch(rows.model, rows.fill(features, rows_by_id), *rest)
            states = [np.array(v) for v in metric_variables(rows.model.metrics)]
            totals = states if totals is None else [a + b for a, b in zip(totals, states)]
            heartbeat.iteration = count
    return totals


def keras_element(leaves: List[np.ndarray], element_structure: tuple) -> tuple:
    """A mapped batch's leaves as the element Keras evaluates: ``(features, labels[, weights])``.

    Lists become tuples: tf.data (under Keras' generator input) takes a list for one tensor, so a list of feature
    columns (a multi-input model) would fail to build the input signature.
    """
    import keras

    from sparktf.data.specs import pack

    return keras.tree.lists_to_tuples(pack(element_structure, keras_arrays(leaves, element_structure)))


def unkeyed(task: Any, blocks: Iterable[tuple]) -> Any:
    """``task`` over keyed Blocks without their keys (the order of records does not change metrics)."""
    return task(block[1:] for block in blocks)


def keras_arrays(leaves: List[np.ndarray], element_structure: tuple) -> list:
    """The leaves as Keras' fit/evaluate take them: string (object) arrays as ``tf.string`` tensors, sparse ones
    (:func:`~sparktf.data.sparse.model_values`) as their specs say."""
    import tensorflow as tf

    from sparktf.data.specs import flatten

    leaves = model_values(flatten(element_structure), leaves)
    return [tf.constant(leaf, tf.string) if getattr(leaf, "dtype", None) == np.dtype(object) else leaf
            for leaf in leaves]
