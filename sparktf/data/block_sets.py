"""``BlockSet``: where a dataset's Blocks live, and the jobs that read them, whatever the session's kind.

A classic session keeps them in an RDD (:class:`RddBlockSet`); a Spark
Connect session, which has no RDDs, in a DataFrame
(:class:`~sparktf.data.frame_blocks.FrameBlockSet`). The engines see only
this interface: record counts, the balanced layout of one partition per
training worker, caching, and ``collect(function)``, which runs
``function(blocks of a partition)`` in every partition (optionally as one
barrier stage) and returns what the partitions yielded, in partition order.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from operator import itemgetter
from typing import Any, Callable, Iterable, Iterator, List, Optional

from pyspark import RDD

from sparktf.data.block_serializer import block_rdd, cached
from sparktf.data.columnar import Block, BlockRouter, count_records, keyed_block
from sparktf.spark.jobs import fully_cached, unpersist
from sparktf.spark.remote_errors import reporting_failures
from sparktf.spark.resources import with_profile

__all__ = ["BlockSet", "RddBlockSet", "PartitionFunction", "BlockMaker"]

#: What :meth:`BlockSet.collect` runs in a partition: its Blocks in, picklable values out.
PartitionFunction = Callable[[Iterator[Block]], Iterator[Any]]
#: What :meth:`BlockSet.map_partitions` runs: ``maker(partition index, elements) -> Blocks``.
BlockMaker = Callable[[int, Iterable[Any]], Iterator[Block]]


class BlockSet(ABC):
    """The Blocks of a dataset, in partitions.

    Parameters
    ----------
    kind : SessionKind
        The session they live in.
    keyed : bool
        Whether each Block's first array is its routing key
        (:func:`~sparktf.data.columnar.keyed_block`), to be put in key order
        by the reader (the balanced layouts).
    """

    def __init__(self, kind: Any, keyed: bool = False):
        self.kind = kind
        self.keyed = keyed

    @property
    @abstractmethod
    def num_partitions(self) -> int:
        """Number of partitions."""

    @property
    @abstractmethod
    def rdd(self) -> RDD:
        """The Blocks as an RDD (classic sessions; Spark Connect raises ``SparkTFError``)."""

    @property
    @abstractmethod
    def cache_key(self) -> str:
        """A name unique to these Blocks in the application, usable in file names."""

    @property
    @abstractmethod
    def is_cached(self) -> bool:
        """Whether the Blocks are persisted."""

    @abstractmethod
    def persist(self, name: str) -> None:
        """Persist the Blocks (``name``: "training", "validation", ...)."""

    @abstractmethod
    def unpersist(self) -> None:
        """Drop them from the cache."""

    @abstractmethod
    def fully_cached(self) -> bool:
        """Whether every partition is in Spark's cache right now (False where the kind cannot tell)."""

    @abstractmethod
    def compute(self) -> None:
        """Compute every partition (filling the cache of persisted Blocks): a Spark job of this thread."""

    @abstractmethod
    def balanced(self, counts: List[int], num_workers: int, bounds: Optional[List[int]] = None) -> "BlockSet":
        """The records in ``num_workers`` contiguous, balanced partitions, as keyed Blocks (see :class:`BlockRouter`).

        Parameters
        ----------
        counts : list of int
            Records per partition of these Blocks.
        num_workers : int
        bounds : list of int, optional
            The record offsets of the partitions' edges (default: balanced).
        """

    @abstractmethod
    def map_partitions(self, maker: BlockMaker, name: str, cache: bool) -> "BlockSet":
        """The Blocks ``maker`` makes of each partition's elements (e.g. file paths -> parsed records).

        ``cache``: computed once and persisted (``name`` names the cache),
        else computed by every job that reads them.
        """

    @abstractmethod
    def placeholder(self, num_partitions: int) -> "BlockSet":
        """``num_partitions`` partitions of one placeholder element each, no Blocks, in the same session.

        For jobs whose tasks read their data themselves (``cache=False`` TFRecords).
        """

    @abstractmethod
    def collect(self, function: PartitionFunction, barrier: bool = False, profile: Any = None) -> List[Any]:
        """Run ``function`` over each partition's Blocks; the values it yields, in partition order.

        Parameters
        ----------
        function : callable
            ``function(blocks) -> iterator of picklable values``.
        barrier : bool
            Run the partitions as one barrier stage.
        profile : pyspark.resource.ResourceProfile, optional
            The stage's resource profile.
        """

    def count_records(self) -> List[int]:
        """Records per partition (one Spark job)."""
        return self.collect(count_records)


class RddBlockSet(BlockSet):
    """Blocks in an RDD of a classic session (see :mod:`sparktf.data.block_serializer`)."""

    def __init__(self, kind: Any, rdd: RDD, keyed: bool = False):
        super().__init__(kind, keyed)
        self._rdd = rdd

    @property
    def num_partitions(self) -> int:
        return self._rdd.getNumPartitions()

    @property
    def rdd(self) -> RDD:
        return self._rdd

    @property
    def cache_key(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{self._rdd.context.applicationId}-rdd{self._rdd.id()}")

    @property
    def is_cached(self) -> bool:
        return self._rdd.is_cached

    def persist(self, name: str) -> None:
        cached(self._rdd, name)

    def unpersist(self) -> None:
        unpersist(self._rdd)

    def fully_cached(self) -> bool:
        return fully_cached(self._rdd)

    def compute(self) -> None:
        self._rdd._jrdd.count()

    def balanced(self, counts: List[int], num_workers: int, bounds: Optional[List[int]] = None) -> "RddBlockSet":
        router = BlockRouter(counts, num_workers, bounds)
        routed = (self._rdd.mapPartitionsWithIndex(reporting_failures(self.kind, router))
                  .partitionBy(num_workers, itemgetter(0))
                  .map(keyed_block, preservesPartitioning=True))
        return RddBlockSet(self.kind, block_rdd(routed), keyed=True)

    @classmethod
    def of_items(cls, kind: Any, items: List[Any]) -> "RddBlockSet":
        """``items`` from the driver, one per partition (e.g. file paths, for :meth:`map_partitions`)."""
        sc = kind.spark_context("a job over files", "")
        return cls(kind, sc.parallelize(items, len(items)))

    def map_partitions(self, maker: BlockMaker, name: str, cache: bool) -> "RddBlockSet":
        blocks = block_rdd(self._rdd.mapPartitionsWithIndex(reporting_failures(self.kind, maker)))
        return RddBlockSet(self.kind, cached(blocks, name) if cache else blocks.setName(f"sparktf {name} (not cached)"))

    def placeholder(self, num_partitions: int) -> "RddBlockSet":
        return RddBlockSet(self.kind, self._rdd.context.parallelize(range(num_partitions), num_partitions))

    def collect(self, function: PartitionFunction, barrier: bool = False, profile: Any = None) -> List[Any]:
        rdd = self._rdd.barrier() if barrier else self._rdd
        return with_profile(rdd.mapPartitions(reporting_failures(self.kind, function)), profile).collect()

