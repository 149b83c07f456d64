"""A training worker's batches from its partition of Blocks, within a memory budget.

The first segment that runs partition ``p`` on an executor spills the Blocks
Spark sends to local disk (:class:`~sparktf.data.shard_files.ShardFiles`).
From then on every segment on that executor reads the spill: a shard of at
most ``memory_budget`` bytes is loaded into memory once per Python worker
(kept, like the model cache, for later segments; an exact permutation every
pass), a larger one is streamed through the bounded shuffle window of
:class:`~sparktf.data.train_batches.TrainBatches`. The copy Spark still sends
to a later segment is read and dropped on a background thread, so the Python
worker stays reusable, while training runs. TensorFlow-free.
"""

from __future__ import annotations

import collections
import ctypes
import threading
from typing import Callable, Iterable, Iterator, List, Optional, Sequence

import numpy as np

from sparktf.data.batching import Shard
from sparktf.data.block_serializer import skipping_blocks
from sparktf.data.columnar import TARGET_BLOCK_BYTES, Block
from sparktf.data.shard_files import ShardFiles, spill_directory
from sparktf.data.train_batches import TrainBatches
from sparktf.errors import TrainingError
from sparktf.process_state import process_cache

__all__ = ["BlockFeed", "FeedStream", "shards_for_claims"]


def shards_for_claims(claims: Sequence[Optional[int]]) -> List[int]:
    """The input shard each rank of a training job reads, given what each one's process has ready.

    ``claims[r]`` is the shard rank ``r``'s feed offered (``ready_shard``) or
    None. A claimed shard goes to the lowest rank claiming it; every other
    rank reads its own shard when that is free, else the lowest free one.
    Every rank computes the same answer from the same claims.
    """
    shards: List[Optional[int]] = [None] * len(claims)
    taken = set()
    for rank, claim in enumerate(claims):
        if claim is not None and claim not in taken:
            shards[rank] = claim
            taken.add(claim)
    for rank, shard in enumerate(shards):
        if shard is None and rank not in taken:
            shards[rank] = rank
            taken.add(rank)
    free = iter(sorted(set(range(len(claims))) - taken))
    for rank, shard in enumerate(shards):
        if shard is None:
            shards[rank] = next(free)
    return shards  # type: ignore[return-value]


class FeedStream:
    """A worker's endless batches plus what must end with its task.

    Parameters
    ----------
    batches : iterator of list of numpy.ndarray
        The batches; closed by :meth:`close` when they have a ``close``.
    drain : threading.Thread, optional
        A thread reading the task's remaining input.
    park : callable, optional
        ``park(next_batch, batches)``: keeps the open batches for the next
        segment instead of closing them when the segment ends well.
    start_batch : int
        The index of the first batch (with ``park``).
    """

    def __init__(self, batches: Iterator[List[np.ndarray]], drain: Optional[threading.Thread] = None,
                 park: Optional[Callable[[int, Iterator], None]] = None, start_batch: int = 0):
        self._batches = batches
        self._drain = drain
        self._park = park
        self._next_batch = start_batch

    def __iter__(self) -> "FeedStream":
        return self

    def __next__(self) -> List[np.ndarray]:
        batch = next(self._batches)
        self._next_batch += 1
        return batch

    def close(self, wait: bool, timeout: float) -> None:
        """Stop reading (or park the batches); with ``wait``, first let the task's input be read to its end.

        ``wait`` is for a segment that ended well: only then are the batches
        parked, positioned at the next segment's first batch.

        Raises
        ------
        TrainingError
            If the input is not read to its end within ``timeout`` seconds.
        """
        close = getattr(self._batches, "close", None)
        if wait and self._park is not None:
            self._park(self._next_batch, self._batches)
        elif close is not None:
            close()
        if wait and self._drain is not None:
            self._drain.join(timeout)
            if self._drain.is_alive():
                raise TrainingError(
                    f"the training task could not read the rest of its Spark input within {timeout:.0f} s"
                )


class BlockFeed:
    """Picklable description of how training workers batch their partitions of Blocks.

    Parameters
    ----------
    key : str
        Names the training data on the executors' disks (unique per
        application and training RDD).
    shuffle, seed, sequential_order
        The dataset's ordering options (see :class:`TrainBatches`).
    memory_budget : int
        Most bytes of records one worker holds (``spark.sparktf.trainDataMemory``).
    keyed : bool
        The partitions hold keyed Blocks in no particular order (after a
        shuffle), put in key order when spilled.
    """

    def __init__(self, key: str, shuffle: bool, seed: int, sequential_order: bool, memory_budget: int,
                 keyed: bool = False):
        self.key = key
        self.shuffle = shuffle
        self.seed = seed
        self.sequential_order = sequential_order
        self.memory_budget = memory_budget
        self.keyed = keyed

    #: A task reads the partition Spark gives it: its shard never moves to another rank.
    moves_shards = False

    def ready_shard(self, local_batches: Sequence[int], start_batch: int) -> Optional[int]:
        """None: see :attr:`moves_shards` (and :meth:`TFRecordFeed.ready_shard`)."""
        return None

    def open(self, rank: int, blocks: Iterable[Block], local_batch: int, start_batch: int) -> FeedStream:
        """The batches of partition ``rank`` from batch ``start_batch`` on.

        ``blocks`` is the task's input: spilled to disk the first time, read
        and dropped in the background after that.
        """
        directory = spill_directory(self.key, rank)
        files = ShardFiles.open(directory)
        drain = None
        if files is None:
            files = ShardFiles.write(directory, blocks, self.keyed)
            release_freed_memory()  # the Blocks that passed through are gone
        else:
            drain = threading.Thread(target=_read_to_end, args=(blocks,), name="sparktf-input-drain", daemon=True)
            drain.start()
        if files.nbytes <= self.memory_budget:
            source, window = process_cache("in_memory_shards", _InMemoryShards).get(files, self.memory_budget), None
        else:
            record_bytes = max(1, files.nbytes // max(1, files.num_records))
            source, window = files, max(1, _window_bytes(self.memory_budget) // record_bytes)
        batches = TrainBatches(source, local_batch, self.shuffle, self.seed, rank, self.sequential_order,
                               window_records=window, start_batch=start_batch)
        return FeedStream(batches, drain)


def _window_bytes(budget: int) -> int:
    """Bytes of one streaming window: two windows, a Block arriving from Spark and room for one more fit ``budget``.

    Measured: a worker's memory peaks at about two windows plus one Block
    (a freed Block's memory stays with the process), so a Block's worth of
    room is left for the batches and the allocator.
    """
    return max(budget // 4, (budget - 2 * TARGET_BLOCK_BYTES) // 2)


def release_freed_memory() -> None:
    """Hand memory the process has freed back to the OS (glibc's ``malloc_trim``; nothing elsewhere).

    glibc keeps freed blocks of up to about 32 MB in the process's heap once
    large allocations have been freed (its thresholds adapt), so a worker
    that has just passed a partition of 16 MB Blocks through would keep a
    couple of them on top of its budget.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _read_to_end(blocks: Iterable[Block]) -> None:
    with skipping_blocks():
        for _ in blocks:
            pass


class _InMemoryShards:
    """This process's shards that fit the budget, loaded from their spills; least recently used dropped first."""

    def __init__(self) -> None:
        self._shards: "collections.OrderedDict[str, tuple]" = collections.OrderedDict()  # spill -> (bytes, Shard)
        self._lock = threading.Lock()

    def get(self, files: ShardFiles, budget: int) -> Shard:
        """The shard of ``files`` in memory; the spills' own sizes count against ``budget``."""
        with self._lock:
            if files.directory in self._shards:
                self._shards.move_to_end(files.directory)
                return self._shards[files.directory][1]
            while self._shards and sum(size for size, _ in self._shards.values()) + files.nbytes > budget:
                self._shards.popitem(last=False)
            shard = Shard(files.read([(0, files.num_records)]))
            self._shards[files.directory] = (files.nbytes, shard)
            return shard

    def clear(self) -> None:
        with self._lock:
            self._shards.clear()
