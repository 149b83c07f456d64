"""Sample weights in the data: the weight leaf of an element and the checks of its values.

A dataset with sample weights has the element structure ``(features, labels,
sample_weight)``: one float per record (``fit``'s ``sample_weight``), the last
leaf of every Block, so code that reads only the features (prediction) takes
the Blocks' first leaves as before. A weight must be finite and >= 0;
:class:`WeightChecked` checks the weights of every Block as a source makes
them on the executors (naming the partition and the record), and
:func:`check_weights` checks an array where it is at hand (the driver's arrays of
``from_ndarrays``). TensorFlow-free, except :func:`weight_spec` and
:func:`check_weight_spec` (driver side).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

import numpy as np

from sparktf.errors import DataError

__all__ = ["WEIGHT_PATH", "weight_spec", "check_weight_spec", "check_weights", "weight_column", "WeightChecked",
           "checked_maker"]

#: The weight leaf's name in messages and ``LeafSpec.path``.
WEIGHT_PATH = "sample_weight"


def weight_spec() -> Any:
    """The ``tf.TensorSpec`` of one record's weight: a float32 scalar."""
    import tensorflow as tf

    return tf.TensorSpec([], tf.float32)


def check_weight_spec(spec: Any, source: str) -> Any:
    """``spec`` when it fits a weight (a scalar number per record), else a ``DataError`` naming ``source``."""
    import tensorflow as tf

    scalar = isinstance(spec, tf.TensorSpec) and spec.shape.rank == 0
    if not scalar or not (spec.dtype.is_floating or spec.dtype.is_integer):
        raise DataError(
            f"{source}: the sample weight must be one number per record (a scalar float or int tensor), got "
            f"{spec}. Return (features, labels, sample_weight) with a scalar sample_weight, e.g. "
            "tf.reshape(weight, [])"
        )
    return spec


def check_weights(weights: Any, where: Callable[[int], str], kind: str = "sample weight") -> None:
    """Refuse a negative or non-finite weight in ``weights`` (one per record, or per class): sparktf's one check
    of a weight's value.

    Parameters
    ----------
    weights : array
        The weights of consecutive records.
    where : callable
        ``where(i)``: where record ``i`` of ``weights`` comes from, e.g.
        ``"partition 3, record 17"``.
    kind : str
        What the weights are, for the message (``"class weight"``).

    Raises
    ------
    DataError
        Naming the first bad weight, its record and what to do.
    """
    values = np.asarray(weights, dtype=np.float64).reshape(-1)
    bad = ~np.isfinite(values) | (values < 0)
    if bad.any():
        index = int(np.argmax(bad))
        value = float(values[index])
        raise DataError(
            f"{where(index)}: {kind} {value!r} is {'negative' if value < 0 else 'not finite'}; "
            f"every {kind} must be a finite number >= 0 (0 gives no weight). Fix or filter these records"
        )


def weight_column(sample_weight: Any, records: int, name: str = WEIGHT_PATH) -> np.ndarray:
    """``from_ndarrays``' ``sample_weight`` (called ``name``) as float32 of shape ``(records,)``, its values checked.

    Raises
    ------
    DataError
        For another number of weights than ``records``, more than one
        weight per record, or a negative or non-finite weight (naming its index).
    """
    try:
        array = np.asarray(sample_weight, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{name} must be an array of numbers, one per record ({exc})") from None
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.shape != (records,):
        raise DataError(
            f"{name} has shape {list(array.shape)}, but there are {records} records: give one weight "
            f"per record, an array of shape [{records}]"
        )
    check_weights(array, lambda i: f"{name}[{i}]")
    return array.astype(np.float32)


class WeightChecked:
    """A Block maker whose Blocks' weights (their last leaf) are checked as they are made.

    Wraps a ``mapPartitionsWithIndex``-style function ``maker(partition,
    items) -> Blocks`` (records, Arrow batches, TFRecord files); a bad weight
    raises ``DataError`` naming the partition and the record's index in it.

    Parameters
    ----------
    maker : callable
        The source's Block maker.
    source : str
        What a partition's records are, for the message (e.g. ``"column 'w'"``).
    """

    def __init__(self, maker: Callable[[int, Iterable[Any]], Iterator[tuple]], source: str = WEIGHT_PATH):
        self.maker = maker
        self.source = source

    def __call__(self, partition: int, items: Iterable[Any]) -> Iterator[tuple]:
        first = 0
        for block in self.maker(partition, items):
            check_weights(block[-1], lambda i: self._where(partition, first + i))
            first += len(block[-1])
            yield block

    def _where(self, partition: int, record: int) -> str:
        return f"{self.source}, partition {partition}, record {record} (0-based within the partition)"


def checked_maker(maker: Callable, has_weights: bool, source: str = WEIGHT_PATH) -> Callable:
    """``maker`` with its weights checked (:class:`WeightChecked`) when the format has weights, else itself."""
    return WeightChecked(maker, source) if has_weights else maker

