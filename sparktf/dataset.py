"""``TFDataset``: a distributed collection of records for training and inference.

Every factory turns its input into a :class:`~sparktf.data.block_sets.BlockSet`
(see :mod:`sparktf.data.columnar` and :mod:`sparktf.data.sources`): columnar
Blocks, a few per partition, already cast to the dataset's specs, in an RDD
(classic sessions) or a DataFrame (Spark Connect). The batching rules and what the
training and inference code needs (per-worker batch sizes, a balanced training
layout with one partition per worker, record counts) come from
:class:`~sparktf.data.block_dataset.BlockDataset`.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Union

import numpy as np
from pyspark import RDD
from pyspark.sql import DataFrame

from sparktf.data import arrow_io, specs, tfrecord_files, tfrecord_io, sample_weights
from sparktf.data.block_dataset import UNSET as _UNSET
from sparktf.data.block_dataset import BlockDataset
from sparktf.data.block_sets import BlockSet
from sparktf.data.columnar import RecordFormat
from sparktf.data.tfrecord_stream import TFRecordStream
from sparktf.context import current_session, reject_connect
from sparktf.data.sources import (
    check_is_rdd,
    check_weight_column,
    column_names,
    dataframe_blocks,
    item_partitions,
    ndarray_blocks,
    one_or_list,
    rdd_blocks,
    tensors_element,
    tf_dtype_of,
)
from sparktf.errors import DataError
from sparktf.spark.task_devices import gpu_plan
from sparktf.streaming.stream_dataset import stream_dataset

__all__ = ["TFDataset"]


#: What an RDD entry point tells a Spark Connect user to use instead.
_RDD_ALTERNATIVE = (
    "Make a DataFrame of the records (spark.createDataFrame, spark.read) and use TFDataset.from_dataframe, "
    "or TFDataset.from_ndarrays for arrays in this process."
)


class TFDataset(BlockDataset):
    """A distributed set of records, each ``(features, labels)``, ``features`` or ``(features, labels,
    sample_weight)``.

    Create one with a factory: :meth:`from_rdd`, :meth:`from_ndarrays`,
    :meth:`from_dataframe`, :meth:`from_tfrecord_file`,
    :meth:`from_string_rdd` or :meth:`from_bytes_rdd`.

    The constructor's parameters, the properties (``feature_spec``,
    ``label_spec``, ``batch_size``, ``num_records``, ...) and the batching
    rules are those of :class:`~sparktf.data.block_dataset.BlockDataset`.
    """

    def map(self, fn: Callable[..., Any]) -> "TFDataset":
        """A dataset whose batches go through ``fn`` on the workers, as ``tf.data.Dataset.map`` would call it.

        ``fn`` gets each batch as tensors, ``fn(features)``,
        ``fn(features, labels)`` or ``fn(features, labels, sample_weight)``
        (prediction: ``fn(features)``), and returns ``x``, ``(x, y)`` or
        ``(x, y, sample_weight)`` (``keras.utils.pack_x_y_sample_weight``).
        It runs in a ``tf.function`` traced once per worker process, for
        every factory, in training, validation, ``evaluate`` and prediction
        (``TFPredictor.predict_dataframe`` calls it with the columns'
        tensors). A Keras Hub task's preprocessor runs after it without
        being mapped here. Text arrives as ``tf.string``.

        Parameters
        ----------
        fn : callable
            A function of TensorFlow ops (Keras preprocessing layers and
            ``keras_hub`` preprocessors included). Functions defined in the
            user's script travel by value.

        Returns
        -------
        TFDataset
            The same records and options; its ``feature_spec`` and
            ``label_spec`` are what ``fn`` returns, traced here.

        Raises
        ------
        DataError
            When ``fn`` fails on the dataset's specs or returns more than
            ``(x, y, sample_weight)``; on a worker, a batch it rejects names
            the partition and the records.
        """
        return self.mapped(fn)

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
        with_sample_weight: bool = False,
    ) -> "TFDataset":
        """A dataset of the records of an RDD.

        Parameters
        ----------
        rdd : pyspark.RDD
            Records: ``(features, labels)`` when ``labels`` is given, else
            ``features``; ``(features, labels, weight)`` with
            ``with_sample_weight``. Each part nests like its spec (an ndarray, Python
            scalar or list for a single spec; a list / tuple / dict of them
            for several).
        features, labels : spec structure
            ``(dtype, shape)`` of one record, e.g. ``(tf.float32, [28, 28, 1])``,
            or a list / tuple / dict of such specs. Records are cast to the
            dtypes; a record of another shape is a ``DataError``.
        batch_size : int
            Global training batch, split over the training workers (their
            local batches differ by at most one record).
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
        with_sample_weight : bool
            Records (training and validation) end with a weight: a number
            >= 0 that weights the record's loss and weighted metrics as
            ``fit``'s ``sample_weight``; needs ``labels``.

        Returns
        -------
        TFDataset

        Raises
        ------
        DataError
            For a bad spec or batch option; for a bad record when the data is
            first read (naming partition, record index, expected and actual
            shape, or a negative or non-finite weight).
        """
        reject_connect("TFDataset.from_rdd", _RDD_ALTERNATIVE)
        check_is_rdd(rdd, "rdd")
        session = current_session()
        feature_spec = specs.parse_spec(features, "features")
        label_spec = None if labels is None else specs.parse_spec(labels, "labels")
        weight_spec = _weight_spec(with_sample_weight, label_spec, "with_sample_weight=True")
        record_format = RecordFormat.from_specs(feature_spec, label_spec, weight_spec)
        if any(leaf.sparse for leaf in record_format.leaves):
            raise DataError("from_rdd takes dense (dtype, shape) specs: sparse leaves come from the SparseVector "
                            "columns of from_dataframe")
        val_blocks = None
        if val_rdd is not None:
            check_is_rdd(val_rdd, "val_rdd")
            val_blocks = rdd_blocks(session, val_rdd, record_format, "validation")
        return cls._with_validation(
            rdd_blocks(session, rdd, record_format, "training"),
            (feature_spec, label_spec, weight_spec),
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
        sample_weight: Any = None,
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
            Validation arrays nested like ``tensors``; ``(x, y, weights)``
            weights the validation records (as ``fit``'s ``validation_data``).
        num_partitions : int, optional
            Number of partitions (default ``sc.defaultParallelism``).
        sample_weight : array, optional
            One number >= 0 per record (shape ``[n]``): weights the record's
            loss and weighted metrics as ``fit``'s ``sample_weight``; needs
            labels.

        Returns
        -------
        TFDataset

        Raises
        ------
        DataError
            For arrays of different lengths, or a weight that is negative or
            not finite (naming its index).
        """
        session = current_session()
        partitions = session.default_parallelism() if num_partitions is None else num_partitions
        if not isinstance(partitions, (int, np.integer)) or partitions < 1:
            raise DataError(f"num_partitions must be a positive integer, got {num_partitions!r}")
        element = tensors_element(tensors, "tensors")
        arrays = specs.flatten(element)
        leaf_specs = [specs.parse_spec((tf_dtype_of(array), np.shape(array)[1:]), "tensors") for array in arrays]
        packed = specs.pack(element, leaf_specs)
        feature_spec, label_spec = packed[0], (packed[1] if len(packed) == 2 else None)
        weight_spec = _weight_spec(sample_weight is not None, label_spec, "sample_weight")
        if weight_spec is not None:
            element = (*element, sample_weights.weight_column(sample_weight, len(arrays[0])))
        record_format = RecordFormat.from_specs(feature_spec, label_spec, weight_spec)
        train_blocks, train_counts = ndarray_blocks(session, record_format, element, "tensors", partitions)
        val_blocks = val_counts = None
        val_weight = None
        if val_tensors is not None:
            val_element, val_weight = _validation_weights(val_tensors, label_spec)
            val_format = RecordFormat.from_specs(feature_spec, label_spec, val_weight)
            val_blocks, val_counts = ndarray_blocks(session, val_format, val_element, "val_tensors", partitions)
        return cls._with_validation(
            train_blocks,
            (feature_spec, label_spec, weight_spec),
            val_blocks,
            val_weight_spec=val_weight,
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
        weight_col: Optional[str] = None,
    ) -> "TFDataset":
        """A dataset of DataFrame columns, moved through Arrow record batches.

        Parameters
        ----------
        df : pyspark.sql.DataFrame
            The data, or a streaming DataFrame (``df.isStreaming``): the
            dataset is then a *streaming dataset* for
            ``TFOptimizer.optimize_stream``, read one micro-batch at a time
            (nothing runs now). Its array lengths come from the schema (a
            ``VectorAssembler`` vector's size) or else from the model's
            inputs and output when the ``TFOptimizer`` is made.
        feature_cols, label_cols : str or list of str
            Columns of the features and labels: numeric scalars, (nested)
            ``ArrayType`` of numbers, MLlib ``Vector``, or ``string`` /
            ``binary`` (scalar ``tf.string`` records, strings UTF-8 encoded).
            One column (a string or a list of one) gives a single spec;
            several give a list of specs, one per column. Doubles and vectors
            become float32; array and vector lengths are read from the first
            row and every row must match them. A vector column whose first
            row is a ``SparseVector`` (``OneHotEncoder``, ``HashingTF``, ...)
            stays sparse (a ``tf.SparseTensorSpec``): its records hold their
            indices and values, never densified per record, and a batch
            reaches a ``keras.Input(sparse=True)`` as a ``tf.SparseTensor``,
            a dense input as a dense batch.
        batch_size, batch_per_thread, shuffle, seed
            As in :meth:`from_rdd`.
        validation_df : pyspark.sql.DataFrame, optional
            Validation data with the same columns.
        weight_col : str, optional
            A numeric column of sample weights, numbers >= 0: each weights
            its row's loss and weighted metrics (training and validation) as
            ``fit``'s ``sample_weight``; needs ``label_cols``.

        Returns
        -------
        TFDataset

        Raises
        ------
        DataError
            For an unsupported column type (naming the column and its type),
            a ``weight_col`` that is missing or not numeric; for a null, a
            row of another length or a negative or non-finite weight when the
            data is read (naming column, partition and row).
        """
        session = current_session(df.sparkSession)
        feature_names = column_names(feature_cols, "feature_cols")
        label_names = [] if label_cols is None else column_names(label_cols, "label_cols")
        label_count = len(label_names)
        weight_spec = _weight_spec(weight_col is not None, label_names or None, "weight_col")
        if weight_spec is not None:
            check_weight_column(df, weight_col)
            label_names = label_names + [weight_col]
        columns = feature_names + label_names
        if df.isStreaming:
            return stream_dataset(cls, session, df, (feature_names, label_count, columns), weight_spec, validation_df,
                                  batch_size=batch_size, batch_per_thread=batch_per_thread, shuffle=shuffle, seed=seed)
        layouts = arrow_io.column_layouts(df, columns)
        column_specs = [specs.parse_spec(layout, repr(name)) for name, layout in zip(columns, layouts)]
        feature_spec = one_or_list(column_specs[: len(feature_names)])
        label_spec = one_or_list(column_specs[len(feature_names) :][:label_count]) if label_count else None
        record_format = RecordFormat.from_specs(feature_spec, label_spec, weight_spec)
        val_blocks = None
        if validation_df is not None:
            val_layouts = arrow_io.column_layouts(validation_df, columns)
            if [layout[:2] for layout in val_layouts] != [layout[:2] for layout in layouts]:  # sparse or not: as trained
                raise DataError(
                    f"validation_df columns {columns} have (dtype, shape) {val_layouts}, but the "
                    f"training DataFrame's have {layouts}; they must match"
                )
            val_blocks = dataframe_blocks(session, validation_df, columns, record_format, "validation")
        return cls._with_validation(
            dataframe_blocks(session, df, columns, record_format, "training"),
            (feature_spec, label_spec, weight_spec),
            val_blocks,
            batch_size=batch_size,
            batch_per_thread=batch_per_thread,
            shuffle=shuffle,
            seed=seed,
        )

    def micro_batch(self, batch: DataFrame) -> "TFDataset":
        """One micro-batch (``foreachBatch``'s DataFrame) of this streaming dataset as a dataset laid out for one
        pass in global batches of ``batch_size``, records in order without ``shuffle``."""
        return self._derived(blocks=self.blocks.micro_batch(batch, self.record_format), one_pass=True,
                             sequential_order=True)

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
        cache: bool = True,
    ) -> "TFDataset":
        """A dataset of TFRecord files, parsed on the executors (one partition per file).

        Parameters
        ----------
        paths : str or list of str
            A file, a glob, or a list of them: local paths or URIs
            (``hdfs://``, ``s3a://``, ``gs://``, ...; see ``docs/guides/storage.md``,
            which also says how executors get credentials).
        parse_fn : callable
            ``parse_fn(serialized: tf.string) -> (features, labels)``, or
            ``(features, labels, sample_weight)`` with a scalar weight >= 0
            per record (as ``fit``'s ``sample_weight``), or just
            ``features`` when it returns anything but a tuple of two or
            three. It runs on the executors; the specs come from tracing it,
            so every output needs a fully known shape.
        batch_size, batch_per_thread, shuffle, seed
            As in :meth:`from_rdd`.
        validation_paths : str or list of str, optional
            Validation files.
        cache : bool
            True: the parsed records are cached by Spark (parsed once).
            False: nothing is cached; every epoch each training worker reads
            its share of whole files with ``tf.data`` (interleaved, shuffle
            buffer, ``parse_fn`` in parallel, prefetched), so ``parse_fn``
            and its randomness (e.g. augmentation) run every epoch; training
            needs at least as many files as workers. Evaluation and
            prediction read and parse the files every time, in file order.

        Returns
        -------
        TFDataset
        """
        session = current_session()
        feature_spec, label_spec, weight_spec = tfrecord_io.trace_parse_fn(parse_fn)
        record_format = RecordFormat.from_specs(feature_spec, label_spec, weight_spec)
        reader = sample_weights.checked_maker(
            tfrecord_io.TFRecordReader(parse_fn, record_format, gpu_plan(session.conf)), record_format.has_weights,
            "parse_fn's sample_weight")

        def file_blocks(files: List[str], name: str) -> BlockSet:
            return item_partitions(session, files).map_partitions(reader, f"{name} TFRecords", cache)

        files = tfrecord_files.expand_paths(paths)
        val_blocks = None
        if validation_paths is not None:
            val_blocks = file_blocks(tfrecord_files.expand_paths(validation_paths), "validation")
        file_stream = None if cache else TFRecordStream(files, parse_fn, record_format)
        return cls._with_validation(
            file_blocks(files, "training"),
            (feature_spec, label_spec, weight_spec),
            val_blocks,
            batch_size=batch_size,
            batch_per_thread=batch_per_thread,
            shuffle=shuffle,
            seed=seed,
            file_stream=file_stream,
        )

    @classmethod
    def from_string_rdd(cls, rdd: RDD, batch_per_thread: int = _UNSET) -> "TFDataset":
        """A dataset of one ``tf.string`` feature of shape ``[]`` (``str`` is UTF-8 encoded), no labels."""
        reject_connect("TFDataset.from_string_rdd", _RDD_ALTERNATIVE)
        return cls.from_rdd(rdd, ("string", []), batch_per_thread=batch_per_thread, shuffle=False)

    @classmethod
    def from_bytes_rdd(cls, rdd: RDD, batch_per_thread: int = _UNSET) -> "TFDataset":
        """A dataset of one ``tf.string`` feature of shape ``[]`` from ``bytes`` records, no labels."""
        reject_connect("TFDataset.from_bytes_rdd", _RDD_ALTERNATIVE)
        return cls.from_string_rdd(rdd, batch_per_thread=batch_per_thread)

    @classmethod
    def _with_validation(
        cls,
        blocks: BlockSet,
        element_specs: tuple,
        val_blocks: Optional[BlockSet],
        *,
        val_weight_spec: Any = _UNSET,
        val_counts: Optional[List[int]] = None,
        file_stream: Any = None,
        **options: Any,
    ) -> "TFDataset":
        """The dataset of ``element_specs`` ``(feature_spec, label_spec, weight_spec)`` and its validation dataset
        (weighted like the training data unless ``val_weight_spec`` says otherwise)."""
        feature_spec, label_spec, weight_spec = element_specs
        val_dataset = None
        if val_blocks is not None:
            val_dataset = cls(
                val_blocks,
                feature_spec,
                label_spec,
                weight_spec=weight_spec if val_weight_spec is _UNSET else val_weight_spec,
                batch_size=options["batch_size"],
                batch_per_thread=options["batch_per_thread"],
                shuffle=False,
                partition_counts=val_counts,
            )
        return cls(blocks, feature_spec, label_spec, weight_spec=weight_spec, val_dataset=val_dataset,
                   file_stream=file_stream, **options)


def _weight_spec(weighted: bool, labels: Any, option: str) -> Any:
    """The weight spec of a dataset given ``option`` (None without weights); weights need labels."""
    if not weighted:
        return None
    if labels is None:
        raise DataError(f"{option} needs labels: sample weights weight each record's loss against its labels. "
                        "Give the labels too, or drop the weights")
    return sample_weights.weight_spec()


def _validation_weights(val_tensors: Any, label_spec: Any) -> tuple:
    """``from_ndarrays``' validation element and weight spec: ``(x, y, weights)`` weights the records."""
    if isinstance(val_tensors, tuple) and not hasattr(val_tensors, "_fields") and len(val_tensors) == 3:
        x, y, sample_weight = val_tensors
        spec = _weight_spec(True, label_spec, "val_tensors' weights (x, y, weights)")
        weights = sample_weights.weight_column(sample_weight, len(specs.flatten(x)[0]), "val_tensors' weights")
        return (x, y, weights), spec
    return tensors_element(val_tensors, "val_tensors"), None
