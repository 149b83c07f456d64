"""Records <-> columnar Blocks, the unit that moves between Spark and TensorFlow.

A *Block* is a tuple of NumPy arrays, one per leaf of the dataset's element
structure (features first, then labels), all with the same leading record
dimension, each C-contiguous and already of its leaf's dtype (``tf.string``
leaves are ``object`` arrays of ``bytes``). This module runs on the executors
and never imports TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from sparktf.data import specs
from sparktf.data.sparse import concat_columns
from sparktf.errors import DataError

__all__ = [
    "Block",
    "RecordFormat",
    "block_size",
    "concat_blocks",
    "slice_block",
    "pass_bounds",
    "to_leaf_array",
    "to_leaf_column",
    "records_per_block",
    "balanced_bounds",
    "count_records",
    "BlockRouter",
    "keyed_block",
]

Block = Tuple[np.ndarray, ...]

#: Blocks built from records hold about this many bytes (and at least one record).
TARGET_BLOCK_BYTES = 16 << 20


def block_size(block: Block) -> int:
    """The number of records in ``block``."""
    return len(block[0])


def slice_block(block: Block, start: int, stop: int) -> Block:
    """Records ``start:stop`` of ``block`` (views, no copy)."""
    return tuple(array[start:stop] for array in block)


def concat_blocks(blocks: Sequence[Block]) -> Block:
    """One block holding the records of ``blocks`` in order (no copy for a single block)."""
    if len(blocks) == 1:
        return tuple(blocks[0])
    return tuple(concat_columns(columns) for columns in zip(*blocks))


def records_per_block(leaves: Sequence[specs.LeafSpec]) -> int:
    """How many records of these leaves make a block of about :data:`TARGET_BLOCK_BYTES`."""
    record_bytes = sum(leaf.record_nbytes for leaf in leaves)
    return max(1, TARGET_BLOCK_BYTES // max(record_bytes, 1))


def balanced_bounds(total: int, parts: int) -> List[int]:
    """Record offsets splitting ``total`` records into ``parts`` contiguous ranges whose sizes differ by at most 1."""
    return [i * total // parts for i in range(parts + 1)]


def pass_bounds(total: int, batch: int, parts: int) -> List[int]:
    """Record offsets splitting ``total`` records into ``parts`` contiguous shards that one pass in global batches
    of ``batch`` uses up together: every shard holds a local batch (:func:`balanced_bounds` of ``batch``) for each
    full global batch, and its part of the last, partial one."""
    full, rest = divmod(total, batch)
    local, last = balanced_bounds(batch, parts), balanced_bounds(rest, parts)
    sizes = [full * (local[i + 1] - local[i]) + last[i + 1] - last[i] for i in range(parts)]
    return np.concatenate([[0], np.cumsum(sizes)]).astype(int).tolist()


def count_records(blocks: Iterable[Block]) -> List[int]:
    """``[number of records]`` of one partition of blocks (for ``mapPartitions``)."""
    return [sum(block_size(block) for block in blocks)]


def to_leaf_array(value: Any, leaf: specs.LeafSpec) -> np.ndarray:
    """One record's ``value`` as an array of ``leaf``'s dtype and shape.

    Raises
    ------
    DataError
        If ``value`` is ``None``, cannot be converted to the dtype, or has
        another shape. The message names ``leaf.path``; callers add where the
        value came from.
    """
    array = _converted(value, leaf)
    if array.shape != leaf.shape:
        raise DataError(f"{leaf.path} has shape {list(array.shape)}, expected {list(leaf.shape)}")
    return array


def to_leaf_column(values: Any, leaf: specs.LeafSpec) -> np.ndarray:
    """A column of records as a C-contiguous array of ``leaf``'s dtype, shape ``(n,) + leaf.shape``.

    Raises
    ------
    DataError
        As :func:`to_leaf_array`, for the per-record shape ``values.shape[1:]``.
    """
    array = _converted(values, leaf)
    if array.ndim == 0:
        raise DataError(
            f"{leaf.path} is a single {leaf.dtype_name} value, not a column of records: give an array whose "
            "first dimension counts the records (plain Python lists are read as lists of separate "
            "features: wrap each column in np.asarray(...))"
        )
    if array.shape[1:] != leaf.shape:
        raise DataError(
            f"{leaf.path} has records of shape {list(array.shape[1:])} (array shape {list(array.shape)}), "
            f"expected {list(leaf.shape)}"
        )
    return np.ascontiguousarray(array)


def _converted(value: Any, leaf: specs.LeafSpec) -> np.ndarray:
    if value is None:
        raise DataError(f"{leaf.path} is None, expected a {leaf.dtype_name} value of shape {list(leaf.shape)}")
    try:
        if leaf.is_string:
            return _strings_to_bytes(value)
        raw = np.asarray(value)  # NumPy's own type first: refuse what a cast would silently change
        if raw.dtype != leaf.dtype:
            _check_numbers(raw, leaf)
        return raw.astype(leaf.dtype, copy=False)
    except DataError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise DataError(
            f"{leaf.path} could not be converted to {leaf.dtype_name} with shape {list(leaf.shape)} "
            f"({type(value).__name__}: {exc})"
        ) from None


def _check_numbers(raw: np.ndarray, leaf: specs.LeafSpec) -> None:
    """Refuse values that a cast to ``leaf.dtype`` would turn into NaN, truncate or wrap around.

    Vectorized over the whole array: ``None`` among numbers, non-integral or
    out-of-range values for an integer dtype.
    """
    if raw.dtype == np.dtype(object):
        missing = np.equal(raw, None)
        if missing.any():
            raise DataError(
                f"{leaf.path} holds None{_where(missing)}, expected {leaf.dtype_name} numbers: "
                "fill in or drop missing values before creating the TFDataset"
            )
    if leaf.dtype.kind not in "iu" or raw.dtype.kind not in "iuf" or raw.size == 0:
        return
    if raw.dtype.kind == "f":
        fractional = ~np.isfinite(raw) | (raw != np.trunc(raw))
        if fractional.any():
            raise DataError(
                f"{leaf.path} holds the non-integral value {raw[_first(fractional)].item()!r}{_where(fractional)} for an "
                f"integer spec {leaf.dtype_name}: round the values or declare a float spec"
            )
    info = np.iinfo(leaf.dtype)
    outside = (raw < info.min) | (raw > info.max)
    if outside.any():
        raise DataError(
            f"{leaf.path} holds {raw[_first(outside)].item()!r}{_where(outside)}, outside the range of "
            f"{leaf.dtype_name} [{info.min}, {info.max}]: declare a wider integer spec (e.g. int64)"
        )


def _first(mask: np.ndarray) -> tuple:
    """The index of the first True in ``mask`` (a tuple, ``()`` for a 0-d mask)."""
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(mask)), mask.shape))


def _where(mask: np.ndarray) -> str:
    """`` at position [i, ...]`` of the first True in ``mask``; empty for a single value."""
    return f" at position {list(_first(mask))}" if mask.ndim else ""


def _strings_to_bytes(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray) and value.dtype.kind == "U":
        return np.char.encode(value, "utf-8").astype(object)
    if isinstance(value, np.ndarray) and value.dtype.kind == "S":
        return value.astype(object)
    array = np.array(value, dtype=object)  # a copy: the loop below rewrites it
    flat = array.reshape(-1)
    for i, item in enumerate(flat):
        if isinstance(item, str):
            flat[i] = item.encode("utf-8")
        elif isinstance(item, (bytes, np.bytes_)):
            flat[i] = bytes(item)
        else:
            raise TypeError(f"expected str or bytes, got {type(item).__name__} {item!r:.60}")
    return array


@dataclass(frozen=True)
class RecordFormat:
    """How records of a dataset map to and from Blocks; picklable, TensorFlow-free.

    Attributes
    ----------
    element : tuple
        The element structure ``(features, labels)`` or ``(features,)`` with a
        :class:`~sparktf.data.specs.LeafSpec` at every leaf.
    has_labels : bool
        Whether a record is ``(features, labels)`` (else just ``features``).
    has_weights : bool
        Whether a record is ``(features, labels, sample_weight)``; the weight
        is then the last leaf.
    """

    element: tuple
    has_labels: bool
    has_weights: bool = False

    @classmethod
    def from_specs(cls, feature_spec, label_spec=None, weight_spec=None) -> "RecordFormat":
        """The format of records with these ``tf.TensorSpec`` structures (``weight_spec``: sample weights)."""
        leaves = specs.leaf_specs(feature_spec, "features")
        structure = specs.element_structure(feature_spec, label_spec, weight_spec)
        if label_spec is not None:
            leaves += specs.leaf_specs(label_spec, "labels")
        if weight_spec is not None and label_spec is not None:
            leaves += specs.leaf_specs(weight_spec, "sample_weight")
        return cls(specs.pack(structure, leaves), label_spec is not None, len(structure) == 3)

    @property
    def leaves(self) -> List[specs.LeafSpec]:
        """The :class:`~sparktf.data.specs.LeafSpec` of every leaf, features first."""
        return specs.flatten(self.element)

    def as_element(self, record: Any) -> tuple:
        """A record as an element: ``(features, labels)`` stays, ``features`` becomes ``(features,)``."""
        return record if self.has_labels else (record,)

    def record_leaves(self, record: Any) -> list:
        """The leaf values of one record (unconverted), in leaf order."""
        if self.has_labels:
            parts, names = (3, "(features, labels, weight)") if self.has_weights else (2, "(features, labels)")
            if not isinstance(record, (list, tuple)) or len(record) != parts:
                raise DataError(
                    f"a record should be {names} because labels{' and weights' if self.has_weights else ''} "
                    f"were given, got {specs.describe(record)}"
                )
            paths = ("features", "labels", "sample_weight")
            return [leaf for structure, value, path in zip(self.element, record, paths)
                    for leaf in specs.flatten_like(structure, value, path)]
        return specs.flatten_like(self.element[0], record, "features")

    def to_blocks(self, partition: int, records: Iterable[Any]) -> Iterator[Block]:
        """Blocks of the records of one partition (for ``mapPartitionsWithIndex``).

        Raises
        ------
        DataError
            Naming the partition, the record's index in it, the leaf and the
            expected vs actual shape or dtype.
        """
        leaves = self.leaves
        capacity = records_per_block(leaves)
        buffers: List[np.ndarray] = []
        filled = 0
        for index, record in enumerate(records):
            if filled == 0:
                buffers = [np.empty((capacity,) + leaf.shape, leaf.dtype) for leaf in leaves]
            try:
                for buffer, leaf, value in zip(buffers, leaves, self.record_leaves(record)):
                    buffer[filled, ...] = to_leaf_array(value, leaf)
            except DataError as exc:
                raise DataError(
                    f"partition {partition}, record {index} (0-based within the partition): {exc}. "
                    "Fix the record or the spec given to TFDataset."
                ) from None
            filled += 1
            if filled == capacity:
                yield tuple(buffers)
                filled = 0
        if filled:
            yield tuple(buffer[:filled] for buffer in buffers)

    def to_records(self, block: Block) -> Iterator[Any]:
        """The records of ``block``, each nested like the element (a ``flatMap`` function)."""
        for i in range(block_size(block)):
            element = specs.pack(self.element, [array[i] for array in block])
            yield element if self.has_labels else element[0]


#: Most bytes of one piece a :class:`BlockRouter` sends through Spark's shuffle: PySpark's
#: ``partitionBy`` holds about 20 of them per flush, so small pieces keep that small.
ROUTED_PIECE_BYTES = 1 << 20


class BlockRouter:
    """Splits a partition's blocks among ``num_workers`` contiguous, balanced ranges.

    Worker ``w`` gets the records ``[w * n // W, (w + 1) * n // W)`` of the
    dataset in its global order (partition by partition), or those of
    ``bounds`` (the record offsets of the ``W + 1`` shard edges). Called with
    ``mapPartitionsWithIndex``, it yields ``((worker, partition, piece),
    block)`` pairs of at most :data:`ROUTED_PIECE_BYTES` to
    ``partitionBy(W, itemgetter(0))``; :func:`keyed_block` then keeps each
    piece's key with it, and the worker puts the pieces in key order.
    """

    def __init__(self, partition_counts: Sequence[int], num_workers: int, bounds: Optional[Sequence[int]] = None):
        self.offsets = np.concatenate([[0], np.cumsum(partition_counts)]).tolist()
        total = self.offsets[-1]
        self.bounds = list(bounds) if bounds is not None else balanced_bounds(total, num_workers)

    def __call__(self, partition: int, blocks: Iterable[Block]) -> Iterator[Tuple[tuple, Block]]:
        position = self.offsets[partition]
        piece = 0
        for block in blocks:
            start, end = position, position + block_size(block)
            worker = int(np.searchsorted(self.bounds, start, side="right")) - 1
            record_bytes = max(1, sum(array.nbytes for array in block) // max(1, block_size(block)))
            piece_records = max(1, ROUTED_PIECE_BYTES // record_bytes)
            while start < end:
                stop = min(end, self.bounds[worker + 1], start + piece_records)
                if stop > start:
                    yield (worker, partition, piece), slice_block(block, start - position, stop - position)
                    piece += 1
                start = stop
                if start == self.bounds[worker + 1]:
                    worker += 1
            position = end


def keyed_block(routed: Tuple[tuple, Block]) -> Block:
    """A routed ``(key, block)`` as one Block whose first array is the key (int64)."""
    key, block = routed
    return (np.asarray(key, np.int64), *block)

