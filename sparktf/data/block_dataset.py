"""``BlockDataset``: records as cached columnar Blocks, with the batching rules of training and inference.

The state and the batching plumbing behind :class:`sparktf.dataset.TFDataset`
(whose factories build the :class:`~sparktf.data.block_sets.BlockSet`): specs,
batch options, per-partition record counts, per-worker batch sizes and the
balanced training layout with one partition per worker.
"""

from __future__ import annotations

import contextlib
import copy
import math
import secrets
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from pyspark import RDD

from sparktf.data import specs
from sparktf.data.batch_maps import NO_MAPS, BatchMaps
from sparktf.data.block_feed import BlockFeed
from sparktf.data.block_sets import BlockSet
from sparktf.data.stream_frames import StreamFrames
from sparktf.data.columnar import RecordFormat, balanced_bounds, pass_bounds
from sparktf.errors import DataError
from sparktf.spark.cluster import train_data_memory
from sparktf.spark.remote_errors import reraise_remote

__all__ = ["BlockDataset", "UNSET"]

#: A batch option that was not given.
UNSET = -1


class BlockDataset:
    """A distributed set of records as Blocks, each ``(features, labels)``, ``features`` or ``(features, labels,
    sample_weight)``.

    Users create the subclass :class:`~sparktf.dataset.TFDataset` with its factories.

    Parameters
    ----------
    blocks : BlockSet
        The Blocks, in the format of ``feature_spec`` / ``label_spec``.
    feature_spec, label_spec : structure of tf.TensorSpec
        Parsed specs (see :func:`sparktf.data.specs.parse_spec`); ``label_spec``
        is ``None`` for a dataset without labels.
    weight_spec : tf.TensorSpec, optional
        The spec of one record's sample weight (a scalar), for a dataset whose
        records carry one (see :mod:`sparktf.data.sample_weights`); needs labels.
    batch_size : int
        Global training batch, or -1 when unset.
    batch_per_thread : int
        Per-partition batch for prediction and evaluation, or -1 when unset.
    val_dataset : BlockDataset, optional
        Validation data.
    shuffle : bool
        Reshuffle each worker's records for every pass while training.
    sequential_order : bool
        Without ``shuffle``, training starts each worker at its first record
        (instead of a random one).
    seed : int, optional
        Seed of the training order; a random one when ``None``.
    partition_counts : list of int, optional
        Records per partition of ``blocks`` when already known.
    file_stream : TFRecordStream, optional
        For ``from_tfrecord_file(cache=False)``: the files training workers
        read every epoch (``blocks`` then reads them, uncached, for
        evaluation and prediction).

    Raises
    ------
    DataError
        If both batch sizes are set, or one is neither positive nor -1.
    """

    def __init__(
        self,
        blocks: BlockSet,
        feature_spec,
        label_spec=None,
        *,
        weight_spec=None,
        batch_size: int = UNSET,
        batch_per_thread: int = UNSET,
        val_dataset: Optional["BlockDataset"] = None,
        shuffle: bool = True,
        sequential_order: bool = False,
        seed: Optional[int] = None,
        partition_counts: Optional[Sequence[int]] = None,
        file_stream: Any = None,
    ):
        check_batch_options(batch_size, batch_per_thread)
        if seed is not None and (not isinstance(seed, (int, np.integer)) or seed < 0):
            raise DataError(f"seed must be a non-negative integer or None, got {seed!r}")
        self._blocks = blocks
        self._feature_spec = feature_spec
        self._label_spec = label_spec
        self._weight_spec = weight_spec if label_spec is not None else None
        self._format = RecordFormat.from_specs(feature_spec, label_spec, self._weight_spec)
        self._batch_size = int(batch_size)
        self._batch_per_thread = int(batch_per_thread)
        self._val_dataset = val_dataset
        self._shuffle = bool(shuffle)
        self._sequential_order = bool(sequential_order)
        self._seed = int(seed) if seed is not None else secrets.randbits(31)
        self._partition_counts = list(partition_counts) if partition_counts is not None else None
        self._training_blocks: Dict[int, BlockSet] = {}
        self._file_stream = file_stream
        self._maps = NO_MAPS
        self._mapped_structure: Optional[tuple] = None
        self._one_pass = False

    # ------------------------------------------------------------------ properties

    @property
    def feature_spec(self):
        """The features' structure, a ``tf.TensorSpec`` (one record's shape) at each leaf (after the maps)."""
        return self.element_structure[0]

    @property
    def label_spec(self):
        """The labels' structure of ``tf.TensorSpec``, or ``None`` without labels (after the maps)."""
        structure = self.element_structure
        return structure[1] if len(structure) > 1 else None

    @property
    def weight_spec(self):
        """The ``tf.TensorSpec`` of one record's sample weight, or ``None`` without sample weights (after the
        maps)."""
        structure = self.element_structure
        return structure[2] if len(structure) > 2 else None

    @property
    def element_structure(self) -> tuple:
        """``(feature_spec, label_spec)``, ``(feature_spec,)`` without labels, ``(feature_spec, label_spec,
        weight_spec)`` with sample weights: what a batch is after the dataset's maps."""
        if self._mapped_structure is None:
            self._mapped_structure = self._maps.output_structure(self.stored_structure)
        return self._mapped_structure

    @property
    def stored_structure(self) -> tuple:
        """The element structure of the stored records, before the dataset's maps."""
        return specs.element_structure(self._feature_spec, self._label_spec, self._weight_spec)

    @property
    def batch_maps(self) -> BatchMaps:
        """The functions each batch goes through on the workers (:meth:`mapped`)."""
        return self._maps

    @property
    def has_labels(self) -> bool:
        """Whether records are ``(features, labels)`` (after the maps)."""
        return len(self.element_structure) > 1

    def mapped(self, function: Any) -> "BlockDataset":
        """A dataset of the same records whose batches go through ``function`` on the workers (its validation
        dataset's too). The function is traced on the specs here: one that fails raises ``DataError`` now."""
        dataset = self._derived(maps=self._maps.then(function))  # the same records: their layouts are shared
        if self._val_dataset is not None:
            dataset._val_dataset = self._val_dataset.mapped(function)
        dataset.element_structure  # traced now: a function that fails, fails here
        return dataset

    @property
    def is_streaming(self) -> bool:
        """Whether the records come from a streaming DataFrame (for ``TFOptimizer.optimize_stream``)."""
        return isinstance(self._blocks, StreamFrames)

    def one_pass(self) -> "BlockDataset":
        """This dataset laid out for one pass in global batches of ``batch_size`` (a stream's micro-batch).

        Its training shards are cut by :func:`~sparktf.data.columnar.pass_bounds`:
        each rank's shard is its local batch for every full global batch plus
        its part of the last, partial one, whatever the number of workers.
        """
        return self._derived(one_pass=True)

    def _derived(self, blocks: Optional[BlockSet] = None, maps: Optional[BatchMaps] = None,
                 one_pass: Optional[bool] = None, sequential_order: Optional[bool] = None) -> "BlockDataset":
        """A copy of this dataset with what is given changed; what was computed from it starts anew (the counts
        and layouts of other records, the structure after other maps, the layouts of another pass)."""
        dataset = copy.copy(self)
        if blocks is not None:
            dataset._blocks, dataset._partition_counts, dataset._training_blocks = blocks, None, {}
        if maps is not None:
            dataset._maps, dataset._mapped_structure = maps, None
        if one_pass is not None:
            dataset._one_pass, dataset._training_blocks = one_pass, {}
        if sequential_order is not None:
            dataset._sequential_order = sequential_order
        return dataset

    def shard_bounds(self, num_workers: int) -> List[int]:
        """The record offsets of the ``num_workers`` training shards' edges (of the layout :meth:`training_blocks`
        makes when it moves records)."""
        total = self.num_records
        if self._one_pass:
            return pass_bounds(total, self._batch_size, num_workers)
        return balanced_bounds(total, num_workers)

    @property
    def record_format(self) -> RecordFormat:
        """The TensorFlow-free description of the Blocks, for executor-side code."""
        return self._format

    @property
    def batch_size(self) -> int:
        """The global training batch, or -1 when unset."""
        return self._batch_size

    @property
    def batch_per_thread(self) -> int:
        """The per-partition prediction / evaluation batch, or -1 when unset."""
        return self._batch_per_thread

    @property
    def shuffle(self) -> bool:
        """Whether training reshuffles each worker's records for every pass."""
        return self._shuffle

    @property
    def sequential_order(self) -> bool:
        """Whether training without shuffle starts at each worker's first record."""
        return self._sequential_order

    @property
    def seed(self) -> int:
        """The seed of the training order."""
        return self._seed

    @property
    def val_dataset(self) -> Optional["BlockDataset"]:
        """The validation dataset, or ``None``."""
        return self._val_dataset

    @property
    def blocks(self) -> BlockSet:
        """The Blocks (a few per partition), in an RDD or, in Spark Connect, a DataFrame."""
        return self._blocks

    @property
    def block_rdd(self) -> RDD:
        """The RDD of Blocks (classic sessions; Spark Connect raises ``SparkTFError``)."""
        return self._blocks.rdd

    @property
    def rdd(self) -> RDD:
        """The records: ``(features, labels)``, ``features`` or ``(features, labels, sample_weight)``, leaves as
        NumPy values (classic sessions)."""
        return self._blocks.rdd.flatMap(self._format.to_records)

    @property
    def partition_counts(self) -> List[int]:
        """Records in each partition (one Spark job the first time).

        Raises
        ------
        DataError
            If a record is bad (raised by the executors while reading).
        """
        if self._partition_counts is None:
            with reraise_remote(self._blocks.kind):
                if self._file_stream is not None:  # count the files' records without parsing them
                    self._partition_counts = self._file_stream.count_records(self._blocks.kind)
                else:
                    self._partition_counts = self._blocks.count_records()
        return self._partition_counts

    @property
    def num_records(self) -> int:
        """The number of records (counted by a Spark job the first time)."""
        return sum(self.partition_counts)

    # ------------------------------------------------------------------ batching

    def local_batch_size(self, num_workers: int, rank: int = 0) -> int:
        """Records worker ``rank`` takes per iteration: ``batch_size // num_workers``, or one more.

        Split like the records into the workers' shards
        (:func:`~sparktf.data.columnar.balanced_bounds`): local batches differ
        by at most one, add up to ``batch_size``, and the workers with one
        more record per batch are those with one more record in their shard.

        Raises
        ------
        DataError
            If ``batch_size`` is unset, or smaller than ``num_workers`` (a
            worker would get no records; the message gives both numbers).
        """
        if self._batch_size == UNSET:
            raise DataError(
                "training needs batch_size: create the TFDataset with batch_size=<global batch over all "
                "training workers>; batch_per_thread is only for prediction and evaluation"
            )
        if self._batch_size < num_workers:
            raise DataError(
                f"batch_size {self._batch_size} is smaller than the number of training workers "
                f"{num_workers}: every worker needs at least one record per iteration. Use batch_size >= "
                f"{num_workers}, or fewer workers"
            )
        bounds = balanced_bounds(self._batch_size, num_workers)
        return bounds[rank + 1] - bounds[rank]

    def inference_batch_size(self, num_workers: int) -> int:
        """Records per partition per prediction / evaluation batch.

        ``batch_per_thread``, else ``batch_size // num_workers`` (at least 1).

        Raises
        ------
        DataError
            If neither is set, saying to set ``batch_per_thread``.
        """
        if self._batch_per_thread != UNSET:
            return self._batch_per_thread
        if self._batch_size != UNSET:
            return max(1, self._batch_size // num_workers)
        raise DataError(
            "prediction and evaluation need batch_per_thread: create the TFDataset with "
            "batch_per_thread=<records per batch in each partition> (or batch_size)"
        )

    def iterations_per_epoch(self, num_workers: Optional[int] = None) -> int:
        """Training iterations in one epoch: ``ceil(num_records / batch_size)``.

        Parameters
        ----------
        num_workers : int, optional
            Training workers (default ``sc.defaultParallelism``); checked
            against ``batch_size`` as in :meth:`local_batch_size`.
        """
        self.local_batch_size(self._default_workers(num_workers))
        return math.ceil(self.num_records / self._batch_size)

    def training_blocks(self, num_workers: int) -> BlockSet:
        """The Blocks in exactly ``num_workers`` balanced partitions, for barrier training.

        Worker ``w`` gets the contiguous records ``[w * n // W, (w + 1) * n //
        W)``; the data is shuffled through Spark only when the partitions are
        not already like that. Shuffled Blocks arrive in no particular order
        and carry their key as their first array (:func:`~sparktf.data.columnar.keyed_block`):
        the result's ``keyed`` is then True.

        Raises
        ------
        DataError
            If the dataset has fewer records than ``num_workers``.
        """
        counts = self.partition_counts
        total = sum(counts)
        if total < num_workers:
            raise DataError(
                f"the training dataset has {total} records, fewer than the {num_workers} training "
                "workers; use more data or fewer workers"
            )
        bounds = self.shard_bounds(num_workers)
        if self._one_pass and counts == np.diff(bounds).tolist():
            return self._blocks
        if not self._one_pass and len(counts) == num_workers and max(counts) - min(counts) <= 1:
            return self._blocks
        if num_workers not in self._training_blocks:
            self._training_blocks[num_workers] = self._blocks.balanced(counts, num_workers, bounds)
        return self._training_blocks[num_workers]

    @contextlib.contextmanager
    def training_input(self, num_workers: int) -> Iterator[Tuple[BlockSet, Any]]:
        """``(blocks, feed)`` for the training jobs of one ``optimize`` call.

        ``blocks`` has one partition per worker and ``feed.open(rank, partition,
        local_batch, start_batch)`` turns a task's partition into its endless
        batches (:class:`~sparktf.data.block_feed.BlockFeed` over the balanced
        Blocks, persisted while the context lasts when nothing cached them;
        or, for ``cache=False`` TFRecords, a feed reading the worker's files).
        """
        kind = self._blocks.kind
        budget = train_data_memory(kind)
        if self._file_stream is not None:
            yield self._file_stream.training_input(self._blocks, self.partition_counts, num_workers,
                                                   self._shuffle, self._seed, budget)
            return
        blocks = self.training_blocks(num_workers)
        persisted_here = not blocks.is_cached
        if persisted_here:
            blocks.persist("training")
        feed = BlockFeed(blocks.cache_key, self._shuffle, self._seed, self._sequential_order, budget, blocks.keyed)
        try:
            yield blocks, feed
        finally:
            if persisted_here:
                blocks.unpersist()

    def _default_workers(self, num_workers: Optional[int]) -> int:
        return self._blocks.kind.default_parallelism() if num_workers is None else num_workers

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(feature_spec={self.feature_spec}, label_spec={self.label_spec}, "
            f"batch_size={self._batch_size}, batch_per_thread={self._batch_per_thread}, "
            f"partitions={self._blocks.num_partitions})"
        )



def check_batch_options(batch_size: Any, batch_per_thread: Any) -> None:
    for name, value in (("batch_size", batch_size), ("batch_per_thread", batch_per_thread)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or (value < 1 and value != UNSET):
            raise DataError(f"{name} must be a positive integer (or -1 for unset), got {value!r}")
    if batch_size != UNSET and batch_per_thread != UNSET:
        raise DataError(
            f"set either batch_size (global training batch, got {batch_size}) or batch_per_thread "
            f"(per-partition prediction/evaluation batch, got {batch_per_thread}), not both"
        )
