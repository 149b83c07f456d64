"""Worker-side records of one partition: a :class:`Shard` in memory, and order-keeping inference batches.

A :class:`Shard` holds a partition as one array per leaf (evaluation, and
training shards that fit ``spark.sparktf.trainDataMemory``; training batches
come from :mod:`sparktf.data.train_batches`). Prediction and evaluation
(:func:`inference_batches`) stream the blocks in order and keep every record.
Batches are lists of leaf arrays, one per leaf of the element structure
(``specs.pack`` turns one back into ``(features, labels)``). TensorFlow-free.
"""

from __future__ import annotations

from typing import Iterable, Iterator, List, Sequence, Tuple

import numpy as np

from sparktf.data.columnar import Block, block_size, concat_blocks, slice_block
from sparktf.data.sparse import concat_columns
from sparktf.errors import DataError

__all__ = ["Shard", "inference_batches"]


class Shard:
    """All records of one training partition, one array per leaf.

    Parameters
    ----------
    arrays : sequence of numpy.ndarray
        One array per leaf, all with the same number of records.
    """

    def __init__(self, arrays: Sequence[np.ndarray]):
        self.arrays = list(arrays)
        self.num_records = len(self.arrays[0]) if self.arrays else 0

    @classmethod
    def from_blocks(cls, blocks: Iterable[Block]) -> "Shard":
        """Concatenate a partition's blocks (e.g. the iterator of ``mapPartitions``)."""
        blocks = list(blocks)
        return cls(concat_blocks(blocks) if blocks else ())

    def read(self, ranges: Sequence[Tuple[int, int]]) -> List[np.ndarray]:
        """The records of ``ranges`` (``[start, stop)`` pairs) in order; the arrays themselves for the whole shard."""
        if list(ranges) == [(0, self.num_records)]:
            return self.arrays
        return [concat_columns([array[start:stop] for start, stop in ranges]) for array in self.arrays]


def inference_batches(blocks: Iterable[Block], batch: int) -> Iterator[List[np.ndarray]]:
    """Batches of at most ``batch`` records of a partition, in order.

    Every record is kept: only the last batch may be short. Batches that fit
    inside one block are views of it.
    """
    if batch <= 0:
        raise DataError(f"the inference batch size must be positive, got {batch}")
    pending: List[Block] = []
    pending_records = 0
    for block in blocks:
        start, size = 0, block_size(block)
        while start < size:
            take = min(batch - pending_records, size - start)
            pending.append(slice_block(block, start, start + take))
            pending_records += take
            start += take
            if pending_records == batch:
                yield list(concat_blocks(pending))
                pending, pending_records = [], 0
    if pending_records:
        yield list(concat_blocks(pending))
