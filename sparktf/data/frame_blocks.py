"""``FrameBlockSet``: a dataset's Blocks in a DataFrame, for Spark Connect sessions (which have no RDDs).

A Connect client cannot run Python over an RDD, so every job over a
dataset is a ``mapInArrow`` over a DataFrame, persisted in the server's
cache. Two kinds of frames hold Blocks:

* a user's DataFrame reduced to the dataset's columns
  (:func:`~sparktf.data.arrow_io.arrow_ready`), whose Arrow batches
  :class:`~sparktf.data.arrow_io.ArrowBlockDecoder` turns into Blocks in the
  task, as the classic path does;
* a frame of encoded Blocks (``key long, seq long, block binary``, see
  :func:`~sparktf.data.block_serializer.encode_block`): arrays from the
  driver (``from_ndarrays``) and the balanced training layouts. Its rows
  reach partition ``p`` by a ``repartition`` on ``key``, whose values are
  chosen so that Spark's hash puts ``key`` ``p``'s rows in partition ``p``
  (:func:`partition_keys`); ``seq`` orders the rows of one partition.

A task's function gets the Blocks and yields Python values, which travel
back pickled in a binary column.
"""

from __future__ import annotations

import pickle
import uuid
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence

import pyarrow as pa

from sparktf.data.block_serializer import decode_block, encode_block
from sparktf.data.block_sets import BlockSet, PartitionFunction
from sparktf.data.columnar import Block, BlockRouter, keyed_block
from sparktf.spark.remote_errors import reporting_failures
from sparktf.spark.resources import map_in_arrow

__all__ = ["FrameBlockSet", "EncodedBlocks", "encoded_frame", "partition_keys", "BLOCK_SCHEMA"]

#: The schema of a frame of encoded Blocks.
BLOCK_SCHEMA = "key long, seq long, block binary"
_ARROW_BLOCKS = pa.schema([("key", pa.int64()), ("seq", pa.int64()), ("block", pa.binary())])
_ARROW_RESULT = pa.schema([("result", pa.binary())])
#: A partition's Blocks from its record batches: ``reader(partition, batches)``.
BlockReader = Callable[[int, Iterable[pa.RecordBatch]], Iterator[Block]]


class EncodedBlocks:
    """The :data:`BlockReader` of a frame of encoded Blocks: each ``block`` cell decoded."""

    def __call__(self, partition: int, batches: Iterable[pa.RecordBatch]) -> Iterator[Block]:
        for batch in batches:
            column = batch.column(batch.schema.get_field_index("block"))
            for index in range(len(column)):
                yield decode_block(column[index].as_buffer())


def _placeholders(partition: int, batches: Iterable[pa.RecordBatch]) -> Iterator[int]:
    """The :data:`BlockReader` of :meth:`FrameBlockSet.placeholder`: the partition's numbers."""
    for batch in batches:
        yield from batch.column(0).to_pylist()


def _items(partition: int, batches: Iterable[pa.RecordBatch]) -> Iterator[Any]:
    """The :data:`BlockReader` of :meth:`FrameBlockSet.of_items`: the partition's unpickled items."""
    for batch in batches:
        for value in batch.column(batch.schema.get_field_index("block")).to_pylist():
            yield pickle.loads(value)


class _Made:
    """A :data:`BlockReader` applying a maker to what another reader yields."""

    def __init__(self, reader: BlockReader, maker: Callable[[int, Iterable[Any]], Iterator[Block]]):
        self.reader = reader
        self.maker = maker

    def __call__(self, partition: int, batches: Iterable[pa.RecordBatch]) -> Iterator[Block]:
        return self.maker(partition, self.reader(partition, batches))


class _EncodeTask:
    """``mapInArrow`` function: a partition's Blocks, read by ``reader``, as rows of encoded Blocks."""

    def __init__(self, reader: BlockReader):
        self.reader = reader

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = _partition_id()
        for seq, block in enumerate(self.reader(partition, batches)):
            yield pa.RecordBatch.from_pydict({"key": [partition], "seq": [seq], "block": [encode_block(block)]},
                                             schema=_ARROW_BLOCKS)


def _partition_id() -> int:
    from pyspark import TaskContext

    return TaskContext.get().partitionId()


class _PartitionTask:
    """``mapInArrow`` function: a :data:`PartitionFunction` over the partition's Blocks, its values pickled."""

    def __init__(self, reader: BlockReader, function: PartitionFunction):
        self.reader = reader
        self.function = function

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for value in self.function(self.reader(_partition_id(), batches)):
            payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
            yield pa.RecordBatch.from_pydict({"result": [payload]}, schema=_ARROW_RESULT)


class _RouteTask:
    """``mapInArrow`` function: a partition's Blocks cut for the balanced layout, keyed for the repartition."""

    def __init__(self, reader: BlockReader, router: BlockRouter, keys: Sequence[int]):
        self.reader = reader
        self.router = router
        self.keys = list(keys)

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = _partition_id()
        for routed in self.router(partition, self.reader(partition, batches)):
            (worker, _, piece), _block = routed
            yield pa.RecordBatch.from_pydict(
                {"key": [self.keys[worker]], "seq": [piece], "block": [encode_block(keyed_block(routed))]},
                schema=_ARROW_BLOCKS,
            )


def partition_keys(session: Any, partitions: int) -> List[int]:
    """For each partition ``p`` of ``repartition(partitions, "key")``, a ``key`` value that lands in ``p``.

    Spark's hash partitioning puts a row in ``pmod(hash(key), partitions)``
    (Murmur3, seed 42: the SQL ``hash`` function); one small query finds the
    smallest such key of each partition.
    """
    from pyspark.sql import functions as F

    rows = (session.range(0, 64 * partitions)
            .select(F.pmod(F.hash("id"), F.lit(partitions)).alias("p"), "id")
            .groupBy("p").agg(F.min("id").alias("key")).collect())
    keys = {int(row["p"]): int(row["key"]) for row in rows}
    return [keys[p] for p in range(partitions)]


def encoded_frame(session: Any, partitions: Sequence[Sequence[Any]], encode: Callable[[Any], bytes] = encode_block
                  ) -> Any:
    """A DataFrame whose partition ``p`` holds the encoded elements ``partitions[p]`` (Blocks), in order.

    The bytes travel to the server as the Arrow table of one
    ``createDataFrame`` (large ones as a cached local relation).
    """
    keys = partition_keys(session, len(partitions))
    placed = [(keys[p], seq, element) for p, elements in enumerate(partitions) for seq, element in enumerate(elements)]
    table = pa.Table.from_pydict({"key": [key for key, _, _ in placed], "seq": [seq for _, seq, _ in placed],
                                  "block": [encode(element) for _, _, element in placed]}, schema=_ARROW_BLOCKS)
    return session.createDataFrame(table).repartition(len(partitions), "key").sortWithinPartitions("seq")


class FrameBlockSet(BlockSet):
    """Blocks in a DataFrame of a Spark Connect session.

    Parameters
    ----------
    kind : ConnectSession
    frame : pyspark.sql.DataFrame
        The rows the Blocks come from.
    reader : callable
        ``reader(partition, record batches) -> Blocks`` (:class:`EncodedBlocks`,
        or an :class:`~sparktf.data.arrow_io.ArrowBlockDecoder`'s ``blocks``).
    keyed : bool
        As in :class:`~sparktf.data.block_sets.BlockSet`.
    num_partitions : int, optional
        When known; else counted with the records (one job).
    """

    def __init__(self, kind: Any, frame: Any, reader: BlockReader, keyed: bool = False,
                 num_partitions: Optional[int] = None):
        super().__init__(kind, keyed)
        self.frame = frame
        self.reader = reader
        self._num_partitions = num_partitions
        self._cached = False
        self._key = f"frame-{uuid.uuid4().hex[:16]}"

    @property
    def num_partitions(self) -> int:
        if self._num_partitions is None:
            self.count_records()
        return self._num_partitions

    @property
    def rdd(self) -> Any:
        return self.kind.spark_context("the records of a TFDataset as an RDD", "Use a DataFrame of them instead.")

    @property
    def cache_key(self) -> str:
        return self._key

    @property
    def is_cached(self) -> bool:
        return self._cached

    def persist(self, name: str) -> None:
        self.frame = self.frame.persist()
        self._cached = True

    def unpersist(self) -> None:
        if self._cached:
            self.frame.unpersist()
            self._cached = False

    def fully_cached(self) -> bool:
        return False

    def compute(self) -> None:
        self.frame.count()

    def count_records(self) -> List[int]:
        counts = super().count_records()
        self._num_partitions = len(counts)
        return counts

    def balanced(self, counts: List[int], num_workers: int, bounds: Optional[List[int]] = None) -> "FrameBlockSet":
        keys = partition_keys(self.kind.session, num_workers)
        route = reporting_failures(self.kind, _RouteTask(self.reader, BlockRouter(counts, num_workers, bounds), keys))
        routed = self.frame.mapInArrow(route, BLOCK_SCHEMA)
        return FrameBlockSet(self.kind, routed.repartition(num_workers, "key"), EncodedBlocks(), keyed=True,
                             num_partitions=num_workers)

    @classmethod
    def of_items(cls, kind: Any, items: List[Any]) -> "FrameBlockSet":
        """``items`` from the driver (pickled), one per partition (e.g. file paths, for :meth:`map_partitions`)."""
        frame = encoded_frame(kind.session, [[item] for item in items], pickle.dumps)
        return cls(kind, frame, _items, num_partitions=len(items))

    def map_partitions(self, maker: Callable[[int, Iterable[Any]], Iterator[Block]], name: str,
                       cache: bool) -> "FrameBlockSet":
        made = _Made(self.reader, maker)
        if not cache:
            return FrameBlockSet(self.kind, self.frame, made, num_partitions=self._num_partitions)
        frame = self.frame.mapInArrow(reporting_failures(self.kind, _EncodeTask(made)), BLOCK_SCHEMA)
        blocks = FrameBlockSet(self.kind, frame, EncodedBlocks(), num_partitions=self._num_partitions)
        blocks.persist(name)
        return blocks

    def placeholder(self, num_partitions: int) -> "FrameBlockSet":
        frame = self.kind.session.range(0, num_partitions, 1, num_partitions)
        return FrameBlockSet(self.kind, frame, _placeholders, num_partitions=num_partitions)

    def collect(self, function: PartitionFunction, barrier: bool = False, profile: Any = None) -> List[Any]:
        task = reporting_failures(self.kind, _PartitionTask(self.reader, function))
        rows = map_in_arrow(self.frame, task, "result binary", barrier=barrier, profile=profile).collect()
        return [pickle.loads(row[0]) for row in rows]
