"""A Keras model's metrics as state variables that add up across workers and batches.

Keras' metrics keep their state in variables (a ``Mean``'s total and
count, an ``AUC``'s confusion counts, ...) from which ``result()``
computes the value. Those states add up: the sum of the states of several
workers' (or partitions') records is the state of all of them, so loading
the sums into a model's metric objects gives exactly the value a single
process would compute over every record. Distributed evaluation
(:mod:`sparktf.training.driver.evaluation`) sums the states of partitions; training
(:mod:`sparktf.training.worker.step`) sums each iteration's states across the
workers and over the epoch.

Metrics whose state does not add up (none of Keras' own) are not supported.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Mapping, Sequence, Tuple

import numpy as np

from sparktf.models.keras_internals import compiled_losses

__all__ = ["metric_variables", "training_metrics", "build_metrics", "metric_results", "result_names",
           "load_metric_totals", "epoch_ends"]


def metric_variables(metrics: Sequence[Any]) -> list:
    """The state variables of ``metrics`` (e.g. ``model.metrics``), in a fixed order."""
    return [variable for metric in metrics for variable in metric.variables]


def training_metrics(model: Any) -> list:
    """The metrics of ``model`` that training reports: all but the loss tracker (the loss travels by itself)."""
    return [metric for metric in model.metrics if metric.name != "loss"]


def build_metrics(model: Any, features: Any, labels: Any) -> None:
    """Create the state variables of the compiled metrics (built lazily by Keras) from one batch.

    Traces the model, its loss and its metrics on the batch into a graph (as
    the training and evaluation steps will: a batch that does not fit fails
    with the same message) without running it, then resets the model's
    metric states. A model whose compiled loss and metrics are built already
    is left as it is: the driver's model takes every validation's totals.
    Only tracing, never calling, keeps TensorFlow from counting these graphs
    (one per model, all of the same Python function) as retracing and
    warning about it from the sixth model of a process on.
    """
    import tensorflow as tf

    compiled = compiled_losses(model)
    if all(part is None or part.built for part in compiled):
        return

    def build(features: Any, labels: Any) -> Any:
        predictions = model(features, training=False)
        loss = model.compute_loss(x=features, y=labels, y_pred=predictions, training=False)  # per-output trackers
        model.compute_metrics(features, labels, predictions, sample_weight=None)
        return loss

    tf.function(build, autograph=False).get_concrete_function(features, labels)
    model.reset_metrics()


def load_metric_totals(model: Any, totals: Sequence[np.ndarray]) -> Dict[str, float]:
    """Load summed states (one array per :func:`metric_variables` entry) into ``model``'s metrics; their values.

    Returns
    -------
    dict
        Metric name -> value, as ``model.evaluate(..., return_dict=True)``.
    """
    for variable, total in zip(metric_variables(model.metrics), totals):
        variable.assign(np.asarray(total).astype(np.dtype(variable.dtype)))
    return {name: float(np.asarray(value)) for name, value in model.get_metrics_result().items()}


def epoch_ends(first: int, iterations_per_epoch: int,
               metrics: Mapping[str, Sequence[float]]) -> Iterator[Tuple[int, Dict[str, float]]]:
    """``(iteration, {metric: value})`` of each epoch that ends among consecutive iterations from ``first``.

    ``metrics`` holds each metric's running epoch value of every iteration
    (a segment's records): the value at an epoch's last iteration is the
    epoch's.
    """
    count = min((len(values) for values in metrics.values()), default=0)
    for offset in range(count):
        iteration = first + offset
        if iteration % iterations_per_epoch == 0:
            yield iteration, {name: float(values[offset]) for name, values in metrics.items()}


def metric_results(metrics: Sequence[Any]) -> Dict[str, Any]:
    """Name -> ``result()`` of ``metrics``; a container's results (the compiled metrics) flattened into it.

    The same as ``model.get_metrics_result()`` for ``model.metrics``.
    """
    results: Dict[str, Any] = {}
    for metric in metrics:
        result = metric.result()
        if isinstance(result, dict):
            results.update(result)
        else:
            results[metric.name] = result
    return results


def result_names(results: Mapping[str, Any]) -> List[str]:
    """The names of the flat values of ``results`` (:func:`metric_results`).

    A scalar result keeps its name; the elements of a vector-valued one
    (e.g. ``F1Score(average=None)``) are ``<name>_0``, ``<name>_1``, ...
    """
    names = []
    for name, value in results.items():
        size = int(np.size(value))
        names += [name] if np.ndim(value) == 0 else [f"{name}_{i}" for i in range(size)]
    return names
