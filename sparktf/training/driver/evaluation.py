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
:class:`~sparktf.training.driver.watchdog.JobWatchdog` cancels the job when a task
stops making progress for the timeout + 30 s (``spark.sparktf.watchdogSlack``):
evaluation never waits forever.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Dict, List, Optional

import numpy as np

from sparktf.data.batch_maps import MappedElements
from sparktf.data.sparse import model_structure
from sparktf.errors import DataError
from sparktf.training.metric_state import build_metrics, load_metric_totals
from sparktf.training.state_source import StateSource
from sparktf.training.tables.plan import ShardPlan
from sparktf.training.worker.evaluation import evaluate_partition, keras_arrays, unkeyed

__all__ = ["evaluate_blocks", "metrics_of_totals"]


def evaluate_blocks(
    model: Any,
    blocks: Any,
    elements: MappedElements,
    batch_size: int,
    payload: Any,
    state: Optional[Any] = None,
    timeout: float = 300.0,
    profile: Any = None,
    tables: Optional[ShardPlan] = None,
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
    tables : ShardPlan, optional
        The model's sharded tables: with a job channel, each task holds a
        batch's rows of them, fetched by id, never a whole table
        (:mod:`sparktf.training.tables.sharded_evaluation`).

    Returns
    -------
    dict
        Metric name -> value, as ``model.evaluate(..., return_dict=True)``.

    Raises
    ------
    TrainingError
        The watchdog cancelled the job (naming the partition and its phase).
    """
    from sparktf.spark.task_devices import gpu_plan
    from sparktf.training.driver.served_job import served_job

    element_structure = model_structure(model, elements.element)  # sparse features as the model's inputs take them
    session = blocks.kind
    partitions = blocks.num_partitions
    with served_job(session, partitions, state, with_channel=state is not None) as job:
        broadcast = None
        if job.channel is None and state is not None:
            broadcast = session.spark_context("evaluation without a job channel", "").broadcast(state)
        source = StateSource(job.address, job.secret, partitions, timeout, broadcast)
        by_rows = tables if tables is not None and tables.tables and job.channel is not None else None
        task = partial(evaluate_partition, payload, source if state is not None else None, elements,
                       element_structure, batch_size, gpu_plan(session.conf, profile), by_rows)
        if blocks.keyed:
            task = partial(unkeyed, task)
        try:
            per_partition = job.run(lambda: blocks.collect(task, profile=profile), "the evaluation job", timeout,
                                    barrier=False)
        finally:
            if broadcast is not None:
                broadcast.destroy()
    if not per_partition:
        raise DataError("cannot evaluate: the dataset has no records")
    return metrics_of_totals(model, element_structure, [np.sum(values, axis=0) for values in zip(*per_partition)])


def metrics_of_totals(model: Any, element_structure: tuple, totals: List[np.ndarray]) -> Dict[str, float]:
    """The compiled loss and metrics of summed metric states ``totals`` (the tasks' or ranks', added up), as
    ``model.evaluate(..., return_dict=True)``; ``element_structure`` as the model takes its batches."""
    _build_metrics(model, element_structure)
    return load_metric_totals(model, totals)


def _build_metrics(model: Any, element_structure: tuple) -> None:
    """Create the driver model's metric variables from one all-zero record."""
    from sparktf.data.specs import flatten, pack

    leaves = [
        np.full((1, *spec.shape), b"", dtype=object)
        if spec.dtype.name == "string"
        else np.zeros((1, *spec.shape), dtype=spec.dtype.as_numpy_dtype)
        for spec in flatten(element_structure)
    ]
    element = pack(element_structure, keras_arrays(leaves, element_structure))
    build_metrics(model, element[0], element[1] if len(element) > 1 else None)
