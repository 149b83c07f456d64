"""TFRecord files -> Blocks: spec tracing (driver), reading (executors); paths are ``tfrecord_files``'."""

from __future__ import annotations

import inspect
from typing import Callable, Iterable, Iterator, Optional, Tuple

import cloudpickle
import tensorflow as tf

from sparktf.data import specs
from sparktf.data.columnar import Block, RecordFormat, records_per_block, to_leaf_column
from sparktf.data.tfrecord_files import record_dataset, reads_natively
from sparktf.data.sample_weights import check_weight_spec
from sparktf.errors import DataError
from sparktf.spark.task_devices import GpuPlan, prepare_tensorflow_task
from sparktf.spark.user_code import pickle_by_value

__all__ = ["trace_parse_fn", "TFRecordReader", "load_parse_fn"]

#: Most records per block read from TFRecords: tf.data's ``batch`` slows down
#: sharply with huge batch sizes (about 2 s for 2M, even on a 5-record file).
MAX_RECORDS_PER_BLOCK = 4096


def trace_parse_fn(parse_fn: Callable) -> Tuple[object, Optional[object], Optional[object]]:
    """``(feature_spec, label_spec, weight_spec)`` of what ``parse_fn`` returns, by tracing it.

    ``parse_fn(serialized)`` returning a tuple of two is read as ``(features,
    labels)``, a tuple of three as ``(features, labels, sample_weight)``;
    anything else is features only (``label_spec`` and ``weight_spec`` are ``None``).

    Raises
    ------
    DataError
        If ``parse_fn`` fails while traced, an output is not a dense
        tensor of a fully known shape, or a sample weight is not a scalar number.
    """
    serialized = tf.data.Dataset.from_tensors(tf.constant(b"", dtype=tf.string))
    try:
        element = serialized.map(parse_fn).element_spec
    except Exception as exc:  # anything the user's function raises while TensorFlow traces it
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        name = getattr(parse_fn, "__qualname__", repr(parse_fn))
        raise DataError(
            f"parse_fn {name} failed while sparktf traced it to learn the record specs: "
            f"{type(exc).__name__}: {(lines[-1] if lines else '')[:300]}. It is called as "
            "parse_fn(serialized) on one scalar tf.string tensor inside tf.data; make it work there "
            "(tf.io.parse_single_example, TensorFlow ops only)"
        ) from exc
    for path, leaf in specs.flatten_with_paths(element, "output"):
        if not isinstance(leaf, tf.TensorSpec):
            raise DataError(
                f"parse_fn output {path} is a {type(leaf).__name__}; return dense tensors of a fixed "
                "shape (e.g. tf.sparse.to_dense / tf.io.FixedLenFeature, then tf.reshape)"
            )
    if isinstance(element, tuple) and len(element) in (2, 3):
        weight = check_weight_spec(element[2], "parse_fn's third output") if len(element) == 3 else None
        return specs.parse_spec(element[0], "features"), specs.parse_spec(element[1], "labels"), weight
    return specs.parse_spec(element, "features"), None, None


def load_parse_fn(parse_fn_bytes: bytes) -> Callable:
    """The ``parse_fn`` of :func:`~sparktf.spark.user_code.pickle_by_value`'s bytes, on an executor.

    A function that travelled by value has no source file there, so AutoGraph
    cannot convert it: it runs as it is, and TensorFlow would warn about it in
    every task. Such a function is marked ``do_not_convert`` (the same
    behaviour, without the warning); one whose source is there is left to AutoGraph.
    """
    parse_fn = cloudpickle.loads(parse_fn_bytes)["parse_fn"]
    try:
        inspect.getsource(parse_fn)
    except (OSError, TypeError):
        return tf.autograph.experimental.do_not_convert(parse_fn)
    return parse_fn


class TFRecordReader:
    """TFRecord file paths -> Blocks of parsed records (a ``BlockSet.map_partitions`` maker).

    Parameters
    ----------
    parse_fn : callable
        ``parse_fn(serialized)`` as given to ``TFDataset.from_tfrecord_file``.
        It travels by value when it comes from the user's own module (which
        the executors may not be able to import).
    record_format : RecordFormat
        The format traced from ``parse_fn``.
    gpus : GpuPlan
        The reading stage's GPUs (see :mod:`sparktf.spark.task_devices`).
    """

    def __init__(self, parse_fn: Callable, record_format: RecordFormat, gpus: GpuPlan):
        self.parse_fn_bytes = pickle_by_value({"parse_fn": parse_fn})
        self.record_format = record_format
        self.gpus = gpus

    def __call__(self, partition: int, paths: Iterable[str]) -> Iterator[Block]:
        prepare_tensorflow_task(self.gpus)
        parse_fn = load_parse_fn(self.parse_fn_bytes)
        leaves = self.record_format.leaves
        batch = min(records_per_block(leaves), MAX_RECORDS_PER_BLOCK)
        for path in paths:
            parsed = record_dataset(path, reads_natively([path])).map(
                parse_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            first = 0
            try:
                for element in parsed.batch(batch).as_numpy_iterator():
                    values = specs.flatten(self.record_format.as_element(element))
                    block = tuple(to_leaf_column(value, leaf) for value, leaf in zip(values, leaves))
                    yield block
                    first += len(block[0])
            except tf.errors.OpError as exc:
                raise DataError(
                    f"TFRecord file {path} (partition {partition}): reading or parsing failed after "
                    f"record {first}: {' '.join(exc.message.split())[:400]}"
                ) from None

