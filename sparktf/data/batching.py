"""Worker-side batch iterators over the Blocks of one partition.

Training (:class:`TrainBatches`) reads a whole partition into a
:class:`Shard` and cycles over it forever in batches of exactly the local
batch size; prediction and evaluation (:func:`inference_batches`) stream the
blocks in order and keep every record. Batches are lists of leaf arrays, one
per leaf of the element structure (``specs.pack`` turns one back into
``(features, labels)``). TensorFlow-free.
"""

from __future__ import annotations

from typing import Iterable, Iterator, List, Sequence

import numpy as np

from sparktf.data.columnar import Block, block_size, concat_blocks, slice_block
from sparktf.errors import DataError

__all__ = ["Shard", "TrainBatches", "inference_batches"]


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


class TrainBatches:
    """Endless training batches of exactly ``local_batch`` records from a shard.

    Each pass over the shard visits every record once; a batch that runs past
    the end of a pass continues with the next pass, so batches are never
    short. With ``shuffle`` every pass is a new permutation; otherwise records
    come in shard order, starting at record 0 when ``sequential_order`` and at
    a random offset otherwise (as BigDL does, so workers and runs differ). All
    randomness derives from ``(seed, rank, pass number)``: the same arguments
    give the same batches.

    Parameters
    ----------
    shard : Shard
        The worker's records.
    local_batch : int
        Records per batch (the global batch divided by the number of workers).
    shuffle : bool
        Reshuffle the shard for every pass.
    seed : int
        Seed of the dataset.
    rank : int
        The worker's rank; part of the random stream.
    sequential_order : bool
        Without ``shuffle``, start at record 0 instead of a random offset.

    Raises
    ------
    DataError
        If the shard is empty or ``local_batch`` is not positive.
    """

    def __init__(
        self,
        shard: Shard,
        local_batch: int,
        shuffle: bool,
        seed: int,
        rank: int,
        sequential_order: bool = False,
    ):
        if shard.num_records == 0:
            raise DataError(
                f"training worker rank {rank} got no records: use a dataset with at least one "
                "record per training worker, or fewer workers"
            )
        if local_batch <= 0:
            raise DataError(f"the local batch size must be positive, got {local_batch}")
        self.shard = shard
        self.local_batch = local_batch
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.sequential_order = sequential_order
        self.passes = 0
        self._order = np.empty(0, dtype=np.int64)
        self._position = 0

    def __iter__(self) -> "TrainBatches":
        return self

    def __next__(self) -> List[np.ndarray]:
        pieces = []
        needed = self.local_batch
        while needed:
            if self._position == len(self._order):
                self._start_pass()
            take = min(needed, len(self._order) - self._position)
            pieces.append(self._order[self._position : self._position + take])
            self._position += take
            needed -= take
        indices = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        return [np.take(array, indices, axis=0) for array in self.shard.arrays]

    def _start_pass(self) -> None:
        n = self.shard.num_records
        if self.shuffle:
            self._order = self._rng(self.passes).permutation(n)
        elif self.sequential_order:
            self._order = np.arange(n)
        else:
            offset = int(self._rng(0).integers(n))
            self._order = np.roll(np.arange(n), -offset)
        self._position = 0
        self.passes += 1

    def _rng(self, pass_number: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.rank, pass_number])


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
