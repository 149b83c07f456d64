"""``TFDataset``: a distributed collection of records for training and inference.

Every factory turns its input into a *block RDD* (see :mod:`sparktf.columnar`):
an RDD of columnar Blocks, a few per partition, already cast to the dataset's
specs. :class:`TFDataset` adds the batching options and what the training and
inference code needs: per-worker batch sizes, a balanced training RDD with one
partition per worker, record counts.
"""

from __future__ import annotations

import math
import secrets
from operator import itemgetter
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import numpy as np
from pyspark import RDD, SparkContext
from pyspark.sql import DataFrame

from sparktf import arrow_io, specs, tfrecord_io
from sparktf.block_serializer import block_rdd, cached
from sparktf.columnar import BlockRouter, RecordFormat, count_records, sorted_blocks, to_leaf_column
from sparktf.context import init_spark
from sparktf.driver_blocks import cached_driver_blocks
from sparktf.errors import DataError
from sparktf.remote_errors import reraise_remote

__all__ = ["TFDataset"]

_UNSET = -1


class TFDataset:
    """A distributed set of records, each ``(features, labels)`` or ``features``.

    Create one with a factory: :meth:`from_rdd`, :meth:`from_ndarrays`,
    :meth:`from_dataframe`, :meth:`from_tfrecord_file`,
    :meth:`from_string_rdd` or :meth:`from_bytes_rdd`.

    Parameters
    ----------
    block_rdd : pyspark.RDD
        RDD of Blocks in the format of ``feature_spec`` / ``label_spec``.
    feature_spec, label_spec : structure of tf.TensorSpec
        Parsed specs (see :func:`sparktf.specs.parse_spec`); ``label_spec``
        is ``None`` for a dataset without labels.
    batch_size : int
        Global training batch, or -1 when unset.
    batch_per_thread : int
        Per-partition batch for prediction and evaluation, or -1 when unset.
    val_dataset : TFDataset, optional
        Validation data.
    shuffle : bool
        Reshuffle each worker's records for every pass while training.
    sequential_order : bool
        Without ``shuffle``, training starts each worker at its first record
        (instead of a random one).
    seed : int, optional
        Seed of the training order; a random one when ``None``.
    partition_counts : list of int, optional
        Records per partition of ``block_rdd`` when already known.

    Raises
    ------
    DataError
        If both batch sizes are set, or one is neither positive nor -1.
    """

    def __init__(
        self,
        block_rdd: RDD,
        feature_spec,
        label_spec=None,
        *,
        batch_size: int = _UNSET,
        batch_per_thread: int = _UNSET,
        val_dataset: Optional["TFDataset"] = None,
        shuffle: bool = True,
        sequential_order: bool = False,
        seed: Optional[int] = None,
        partition_counts: Optional[Sequence[int]] = None,
    ):
        _check_batch_options(batch_size, batch_per_thread)
        if seed is not None and (not isinstance(seed, (int, np.integer)) or seed < 0):
            raise DataError(f"seed must be a non-negative integer or None, got {seed!r}")
        self._block_rdd = block_rdd
        self._feature_spec = feature_spec
        self._label_spec = label_spec
        self._format = RecordFormat.from_specs(feature_spec, label_spec)
        self._batch_size = int(batch_size)
        self._batch_per_thread = int(batch_per_thread)
        self._val_dataset = val_dataset
        self._shuffle = bool(shuffle)
        self._sequential_order = bool(sequential_order)
        self._seed = int(seed) if seed is not None else secrets.randbits(31)
        self._partition_counts = list(partition_counts) if partition_counts is not None else None
        self._training_rdds: Dict[int, RDD] = {}

    # ------------------------------------------------------------------ factories

    @classmethod
    def from_rdd(
        cls,
        rdd: RDD,
        features,
        labels=None,
        batch_size: int = _UNSET,
        batch_per_thread: int = _UNSET,
        val_rdd: Optional[RDD] = None,
        shuffle: bool = True,
        sequential_order: bool = False,
        seed: Optional[int] = None,
    ) -> "TFDataset":
        """A dataset of the records of an RDD.

        Parameters
        ----------
        rdd : pyspark.RDD
            Records: ``(features, labels)`` when ``labels`` is given, else
            ``features``. Each part nests like its spec (an ndarray, Python
            scalar or list for a single spec; a list / tuple / dict of them
            for several).
        features, labels : spec structure
            ``(dtype, shape)`` of one record, e.g. ``(tf.float32, [28, 28, 1])``,
            or a list / tuple / dict of such specs. Records are cast to the
            dtypes; a record of another shape is a ``DataError``.
        batch_size : int
            Global training batch, a multiple of the number of training workers.
        batch_per_thread : int
            Per-partition batch for prediction and evaluation.
        val_rdd : pyspark.RDD, optional
            Validation records, in the same format.
        shuffle : bool
            Reshuffle each worker's records for every pass while training.
        sequential_order : bool
            Without ``shuffle``, start training at each worker's first record.
        seed : int, optional
            Seed of the training order.

        Returns
        -------
        TFDataset

        Raises
        ------
        DataError
            For a bad spec or batch option; for a bad record when the data is
            first read (naming partition, record index, expected and actual
            shape).
        """
        _check_is_rdd(rdd, "rdd")
        feature_spec = specs.parse_spec(features, "features")
        label_spec = None if labels is None else specs.parse_spec(labels, "labels")
        record_format = RecordFormat.from_specs(feature_spec, label_spec)
        val_blocks = None
        if val_rdd is not None:
            _check_is_rdd(val_rdd, "val_rdd")
            val_blocks = cached(block_rdd(val_rdd.mapPartitionsWithIndex(record_format.to_blocks)), "validation")
        return cls._with_validation(
            cached(block_rdd(rdd.mapPartitionsWithIndex(record_format.to_blocks)), "training"),
            feature_spec,
            label_spec,
            val_blocks,
            batch_size=batch_size,
            batch_per_thread=batch_per_thread,
            shuffle=shuffle,
            sequential_order=sequential_order,
            seed=seed,
        )

    @classmethod
    def from_ndarrays(
        cls,
        tensors,
        batch_size: int = _UNSET,
        batch_per_thread: int = _UNSET,
        val_tensors=None,
        shuffle: bool = True,
        sequential_order: bool = False,
        seed: Optional[int] = None,
        num_partitions: Optional[int] = None,
    ) -> "TFDataset":
        """A dataset of in-memory arrays, split into contiguous partitions.

        The arrays are converted and split on the driver; each partition
        travels once to the executors (in a broadcast variable) and is cached
        there in blocks of about 16 MB (``MEMORY_AND_DISK_DESER``), so later jobs
        read it from Spark's cache.

        Parameters
        ----------
        tensors : array, tuple, list or dict
            ``x``, ``(x, y)`` or ``(x,)``, where ``x`` and ``y`` are arrays or
            (nested) lists / dicts of arrays, all with the same leading record
            dimension. A tuple of two is always ``(features, labels)``; use a
            list for several feature inputs. float64 becomes float32, string
            arrays become ``tf.string``, other dtypes stay.
        batch_size, batch_per_thread, shuffle, sequential_order, seed
            As in :meth:`from_rdd`.
        val_tensors : optional
            Validation arrays nested like ``tensors``.
        num_partitions : int, optional
            Number of partitions (default ``sc.defaultParallelism``).

        Returns
        -------
        TFDataset
        """
        sc = init_spark().sparkContext
        partitions = sc.defaultParallelism if num_partitions is None else num_partitions
        if not isinstance(partitions, (int, np.integer)) or partitions < 1:
            raise DataError(f"num_partitions must be a positive integer, got {num_partitions!r}")
        element = _tensors_element(tensors, "tensors")
        arrays = specs.flatten(element)
        leaf_specs = [specs.parse_spec((_tf_dtype_of(array), np.shape(array)[1:]), "tensors") for array in arrays]
        packed = specs.pack(element, leaf_specs)
        feature_spec, label_spec = packed[0], (packed[1] if len(packed) == 2 else None)
        record_format = RecordFormat.from_specs(feature_spec, label_spec)
        train_blocks, train_counts = _parallelize_arrays(sc, record_format, element, "tensors", partitions)
        val_blocks = val_counts = None
        if val_tensors is not None:
            val_element = _tensors_element(val_tensors, "val_tensors")
            val_blocks, val_counts = _parallelize_arrays(sc, record_format, val_element, "val_tensors", partitions)
        return cls._with_validation(
            train_blocks,
            feature_spec,
            label_spec,
            val_blocks,
            val_counts=val_counts,
            partition_counts=train_counts,
            batch_size=batch_size,
            batch_per_thread=batch_per_thread,
            shuffle=shuffle,
            sequential_order=sequential_order,
            seed=seed,
        )

    @classmethod
    def from_dataframe(
        cls,
        df: DataFrame,
        feature_cols: Union[str, Sequence[str]],
        label_cols: Union[str, Sequence[str], None] = None,
        batch_size: int = _UNSET,
        batch_per_thread: int = _UNSET,
        validation_df: Optional[DataFrame] = None,
        shuffle: bool = True,
        seed: Optional[int] = None,
    ) -> "TFDataset":
        """A dataset of DataFrame columns, moved through Arrow record batches.

        Parameters
        ----------
        df : pyspark.sql.DataFrame
            The data.
        feature_cols, label_cols : str or list of str
            Columns of the features and labels: numeric scalars, (nested)
            ``ArrayType`` of numbers, MLlib ``Vector``, or ``string`` /
            ``binary`` (scalar ``tf.string`` records, strings UTF-8 encoded).
            One column (a string or a list of one) gives a single spec;
            several give a list of specs, one per column. Doubles and vectors
            become float32; array and vector lengths are read from the first
            row and every row must match them.
        batch_size, batch_per_thread, shuffle, seed
            As in :meth:`from_rdd`.
        validation_df : pyspark.sql.DataFrame, optional
            Validation data with the same columns.

        Returns
        -------
        TFDataset

        Raises
        ------
        DataError
            For an unsupported column type (naming the column and its type);
            for a null or a row of another length when the data is read
            (naming column, partition and row).
        """
        feature_names = _column_names(feature_cols, "feature_cols")
        label_names = [] if label_cols is None else _column_names(label_cols, "label_cols")
        columns = feature_names + label_names
        layouts = arrow_io.column_layouts(df, columns)
        column_specs = [specs.parse_spec(layout, repr(name)) for name, layout in zip(columns, layouts)]
        feature_spec = _one_or_list(column_specs[: len(feature_names)])
        label_spec = _one_or_list(column_specs[len(feature_names) :]) if label_names else None
        record_format = RecordFormat.from_specs(feature_spec, label_spec)
        val_blocks = None
        if validation_df is not None:
            val_layouts = arrow_io.column_layouts(validation_df, columns)
            if val_layouts != layouts:
                raise DataError(
                    f"validation_df columns {columns} have (dtype, shape) {val_layouts}, but the "
                    f"training DataFrame's have {layouts}; they must match"
                )
            val_blocks = _dataframe_blocks(validation_df, columns, record_format, "validation")
        return cls._with_validation(
            _dataframe_blocks(df, columns, record_format, "training"),
            feature_spec,
            label_spec,
            val_blocks,
            batch_size=batch_size,
            batch_per_thread=batch_per_thread,
            shuffle=shuffle,
            seed=seed,
        )

    @classmethod
    def from_tfrecord_file(
        cls,
        paths: Union[str, Sequence[str]],
        parse_fn: Callable,
        batch_size: int = _UNSET,
        batch_per_thread: int = _UNSET,
        validation_paths: Union[str, Sequence[str], None] = None,
        shuffle: bool = True,
        seed: Optional[int] = None,
    ) -> "TFDataset":
        """A dataset of TFRecord files, parsed on the executors (one partition per file).

        Parameters
        ----------
        paths : str or list of str
            A file, a glob, or a list of them.
        parse_fn : callable
            ``parse_fn(serialized: tf.string) -> (features, labels)`` (or just
            ``features`` when it returns anything but a tuple of two). It runs
            on the executors; the specs come from tracing it, so every output
            needs a fully known shape.
        batch_size, batch_per_thread, shuffle, seed
            As in :meth:`from_rdd`.
        validation_paths : str or list of str, optional
            Validation files.

        Returns
        -------
        TFDataset
        """
        sc = init_spark().sparkContext
        feature_spec, label_spec = tfrecord_io.trace_parse_fn(parse_fn)
        reader = tfrecord_io.TFRecordReader(parse_fn, RecordFormat.from_specs(feature_spec, label_spec))

        def file_blocks(file_paths, kind: str) -> RDD:
            files = tfrecord_io.expand_paths(file_paths)
            return cached(block_rdd(sc.parallelize(files, len(files)).mapPartitionsWithIndex(reader)), kind)

        val_blocks = None if validation_paths is None else file_blocks(validation_paths, "validation")
        return cls._with_validation(
            file_blocks(paths, "training"),
            feature_spec,
            label_spec,
            val_blocks,
            batch_size=batch_size,
            batch_per_thread=batch_per_thread,
            shuffle=shuffle,
            seed=seed,
        )

    @classmethod
    def from_string_rdd(cls, rdd: RDD, batch_per_thread: int = _UNSET) -> "TFDataset":
        """A dataset of one ``tf.string`` feature of shape ``[]`` (``str`` is UTF-8 encoded), no labels."""
        return cls.from_rdd(rdd, ("string", []), batch_per_thread=batch_per_thread, shuffle=False)

    @classmethod
    def from_bytes_rdd(cls, rdd: RDD, batch_per_thread: int = _UNSET) -> "TFDataset":
        """A dataset of one ``tf.string`` feature of shape ``[]`` from ``bytes`` records, no labels."""
        return cls.from_string_rdd(rdd, batch_per_thread=batch_per_thread)

    @classmethod
    def _with_validation(
        cls,
        block_rdd: RDD,
        feature_spec,
        label_spec,
        val_block_rdd: Optional[RDD],
        *,
        val_counts: Optional[List[int]] = None,
        **options: Any,
    ) -> "TFDataset":
        val_dataset = None
        if val_block_rdd is not None:
            val_dataset = cls(
                val_block_rdd,
                feature_spec,
                label_spec,
                batch_size=options["batch_size"],
                batch_per_thread=options["batch_per_thread"],
                shuffle=False,
                partition_counts=val_counts,
            )
        return cls(block_rdd, feature_spec, label_spec, val_dataset=val_dataset, **options)

    # ------------------------------------------------------------------ properties

    @property
    def feature_spec(self):
        """The features' structure, a ``tf.TensorSpec`` (one record's shape) at each leaf."""
        return self._feature_spec

    @property
    def label_spec(self):
        """The labels' structure of ``tf.TensorSpec``, or ``None`` without labels."""
        return self._label_spec

    @property
    def element_structure(self) -> tuple:
        """``(feature_spec, label_spec)``, or ``(feature_spec,)`` without labels."""
        return specs.element_structure(self._feature_spec, self._label_spec)

    @property
    def has_labels(self) -> bool:
        """Whether records are ``(features, labels)``."""
        return self._label_spec is not None

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
    def val_dataset(self) -> Optional["TFDataset"]:
        """The validation dataset, or ``None``."""
        return self._val_dataset

    @property
    def block_rdd(self) -> RDD:
        """The RDD of Blocks (a few per partition)."""
        return self._block_rdd

    @property
    def rdd(self) -> RDD:
        """The records: ``(features, labels)`` or ``features``, leaves as NumPy values."""
        return self._block_rdd.flatMap(self._format.to_records)

    @property
    def partition_counts(self) -> List[int]:
        """Records in each partition (one Spark job the first time).

        Raises
        ------
        DataError
            If a record is bad (raised by the executors while reading).
        """
        if self._partition_counts is None:
            with reraise_remote():
                self._partition_counts = self._block_rdd.mapPartitions(count_records).collect()
        return self._partition_counts

    @property
    def num_records(self) -> int:
        """The number of records (counted by a Spark job the first time)."""
        return sum(self.partition_counts)

    # ------------------------------------------------------------------ batching

    def local_batch_size(self, num_workers: int) -> int:
        """Records per training worker per iteration: ``batch_size // num_workers``.

        Raises
        ------
        DataError
            If ``batch_size`` is unset, or not a multiple of ``num_workers``
            (the message gives both numbers).
        """
        if self._batch_size == _UNSET:
            raise DataError(
                "training needs batch_size: create the TFDataset with batch_size=<global batch>, "
                f"a multiple of the number of training workers ({num_workers}); batch_per_thread "
                "is only for prediction and evaluation"
            )
        if self._batch_size % num_workers:
            lower = max(num_workers, self._batch_size - self._batch_size % num_workers)
            raise DataError(
                f"batch_size {self._batch_size} is not a multiple of the number of training workers "
                f"{num_workers}: every worker takes the same share of a batch. Use e.g. batch_size="
                f"{lower} or {lower + num_workers}, or another number of workers"
            )
        return self._batch_size // num_workers

    def inference_batch_size(self, num_workers: int) -> int:
        """Records per partition per prediction / evaluation batch.

        ``batch_per_thread``, else ``batch_size // num_workers`` (at least 1).

        Raises
        ------
        DataError
            If neither is set, saying to set ``batch_per_thread``.
        """
        if self._batch_per_thread != _UNSET:
            return self._batch_per_thread
        if self._batch_size != _UNSET:
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

    def training_block_rdd(self, num_workers: int) -> RDD:
        """The Blocks in exactly ``num_workers`` balanced partitions, for barrier training.

        Worker ``w`` gets the contiguous records ``[w * n // W, (w + 1) * n //
        W)``; the data is shuffled through Spark only when the partitions are
        not already like that.

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
        if len(counts) == num_workers and max(counts) - min(counts) <= 1:
            return self._block_rdd
        if num_workers not in self._training_rdds:
            self._training_rdds[num_workers] = block_rdd(
                self._block_rdd.mapPartitionsWithIndex(BlockRouter(counts, num_workers))
                .partitionBy(num_workers, itemgetter(0))
                .mapPartitions(sorted_blocks)
            )
        return self._training_rdds[num_workers]

    def _default_workers(self, num_workers: Optional[int]) -> int:
        return self._block_rdd.context.defaultParallelism if num_workers is None else num_workers

    def __repr__(self) -> str:
        return (
            f"TFDataset(feature_spec={self._feature_spec}, label_spec={self._label_spec}, "
            f"batch_size={self._batch_size}, batch_per_thread={self._batch_per_thread}, "
            f"partitions={self._block_rdd.getNumPartitions()})"
        )


def _check_batch_options(batch_size: Any, batch_per_thread: Any) -> None:
    for name, value in (("batch_size", batch_size), ("batch_per_thread", batch_per_thread)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or (value < 1 and value != _UNSET):
            raise DataError(f"{name} must be a positive integer (or -1 for unset), got {value!r}")
    if batch_size != _UNSET and batch_per_thread != _UNSET:
        raise DataError(
            f"set either batch_size (global training batch, got {batch_size}) or batch_per_thread "
            f"(per-partition prediction/evaluation batch, got {batch_per_thread}), not both"
        )


def _check_is_rdd(value: Any, name: str) -> None:
    if not isinstance(value, RDD):
        hint = " (use TFDataset.from_dataframe for a DataFrame)" if isinstance(value, DataFrame) else ""
        raise DataError(f"{name} must be a pyspark RDD, got {type(value).__name__}{hint}")


def _tensors_element(tensors: Any, name: str) -> tuple:
    """``(features, labels)`` or ``(features,)`` of ``from_ndarrays`` input."""
    if isinstance(tensors, tuple) and not hasattr(tensors, "_fields"):
        if len(tensors) in (1, 2):
            return tensors
        raise DataError(
            f"{name} is a tuple of {len(tensors)}; give x, (x,) or (x, y), and put several "
            "feature arrays in a list: ([x1, x2], y)"
        )
    return (tensors,)


def _tf_dtype_of(array: Any) -> str:
    """The spec dtype for an array: float64 -> float32, text -> string, others unchanged."""
    dtype = np.asarray(array).dtype
    if dtype.kind in "USO":
        return "string"
    return "float32" if dtype == np.float64 else dtype.name


def _parallelize_arrays(sc: SparkContext, record_format: RecordFormat, element, name: str, partitions: int):
    """The cached block RDD of contiguous ranges of the arrays of ``element``, and its partition counts."""
    leaves = record_format.leaves
    try:
        values = specs.flatten_like(record_format.element, element, name)
        columns = tuple(to_leaf_column(value, leaf) for value, leaf in zip(values, leaves))
    except DataError as exc:
        raise DataError(f"{name}: {exc}") from None
    lengths = {leaf.path: len(column) for leaf, column in zip(leaves, columns)}
    if len(set(lengths.values())) > 1:
        raise DataError(f"{name}: the arrays have different numbers of records {lengths}; they must be equal")
    return cached_driver_blocks(sc, columns, leaves, partitions, name)


def _column_names(cols: Union[str, Sequence[str]], name: str) -> List[str]:
    names = [cols] if isinstance(cols, str) else list(cols)
    if not names or not all(isinstance(col, str) for col in names):
        raise DataError(f"{name} must be a column name or a non-empty list of them, got {cols!r}")
    return names


def _one_or_list(column_specs: list):
    return column_specs[0] if len(column_specs) == 1 else column_specs


def _dataframe_blocks(df: DataFrame, columns: List[str], record_format: RecordFormat, kind: str) -> RDD:
    """Blocks of ``columns`` of ``df``: the JVM's Arrow record batches, cached in the JVM, decoded when read.

    The batches stay in the JVM's cache (no round trip through Python); each
    read decodes them without per-row work (zero-copy for columns that are
    already of their leaf's dtype).
    """
    ready = arrow_io.arrow_ready(df, columns)
    decoder = arrow_io.ArrowBlockDecoder(arrow_io.arrow_schema(ready), record_format.leaves, columns)
    return block_rdd(cached(arrow_io.arrow_batch_rdd(ready), f"{kind} Arrow").mapPartitionsWithIndex(decoder))
