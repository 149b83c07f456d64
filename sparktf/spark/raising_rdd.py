"""RDDs whose actions raise a sparktf error from an executor as itself.

``TFPredictor.predict()`` and ``TFNet.predict()`` return lazy RDDs: a record
the model rejects raises ``DataError`` in a Python worker when the user runs
an action, and Spark hands the driver a Py4J error whose text is the whole
job report, ending in Java stack frames. :class:`SparkTFErrorRDD` runs its
actions under :func:`~sparktf.spark.remote_errors.reraise_remote` and its
partition function reports its sparktf errors (``reporting_failures``), so
the user reads the ``DataError`` itself (chained to Spark's error). Narrow
transformations (``map``, ``filter``, ``mapPartitions`` ...) keep the class;
shuffles and unions give plain RDDs.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, Iterator

from pyspark import RDD
from pyspark.rdd import PipelinedRDD

from sparktf.spark.remote_errors import ActionFailures, reporting_failures, reraise_remote

__all__ = ["SparkTFErrorRDD", "raising_sparktf_errors"]

# The RDD methods that start a Spark job themselves; every other action
# (count, reduce, foreach, first, ...) runs one of these on a derived RDD,
# which a narrow transformation keeps a SparkTFErrorRDD.
_JOB_METHODS = (
    "collect",
    "collectWithJobGroup",
    "take",
    "lookup",
    "sumApprox",
    "meanApprox",
    "saveAsTextFile",
    "saveAsPickleFile",
    "saveAsSequenceFile",
    "saveAsHadoopFile",
    "saveAsHadoopDataset",
    "saveAsNewAPIHadoopFile",
    "saveAsNewAPIHadoopDataset",
)


def _reraising(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def run(self: "SparkTFErrorRDD", *args: Any, **kwargs: Any) -> Any:
        with reraise_remote(self.session_kind):
            return method(self, *args, **kwargs)

    return run


def _iterate_reraising(failures: ActionFailures, items: Iterable[Any]) -> Iterator[Any]:
    try:
        yield from items
    except Exception as exc:
        failures.reraise(exc)


class SparkTFErrorRDD(PipelinedRDD):
    """A ``PipelinedRDD`` whose jobs re-raise sparktf errors from executors as themselves.

    ``session_kind`` is the ``SessionKind`` of its session.
    """

    def __init__(self, prev: RDD, func: Callable[[int, Iterable[Any]], Iterable[Any]],
                 preservesPartitioning: bool, session_kind: Any):  # noqa: N803 - PySpark's name
        super().__init__(prev, func, preservesPartitioning)
        self.session_kind = session_kind

    def mapPartitionsWithIndex(  # noqa: N802 - PySpark's name
        self, f: Callable[[int, Iterable[Any]], Iterable[Any]], preservesPartitioning: bool = False  # noqa: N803
    ) -> "SparkTFErrorRDD":
        return SparkTFErrorRDD(self, f, preservesPartitioning, self.session_kind)

    def toLocalIterator(self, prefetchPartitions: bool = False) -> Iterator[Any]:  # noqa: N802,N803
        with reraise_remote(self.session_kind) as failures:  # the JVM thread serving the items keeps its key
            items = super().toLocalIterator(prefetchPartitions)
        return _iterate_reraising(failures, items)


for _name in _JOB_METHODS:
    setattr(SparkTFErrorRDD, _name, _reraising(getattr(RDD, _name)))


def raising_sparktf_errors(
    kind: Any, rdd: RDD, f: Callable[[int, Iterable[Any]], Iterable[Any]],
    preservesPartitioning: bool = False  # noqa: N803
) -> SparkTFErrorRDD:
    """``rdd.mapPartitionsWithIndex(f, preservesPartitioning)`` as a :class:`SparkTFErrorRDD` of ``kind``'s session."""
    return SparkTFErrorRDD(rdd, reporting_failures(kind, f), preservesPartitioning, kind)
