"""TFPredictor: distributed batch inference with a Keras model or a SavedModel.

The driver describes the model's inputs and outputs (:class:`TensorInfo`),
checks the data against them before launching anything, and broadcasts the
model once: a Keras model as :class:`~sparktf.model_io.ModelPayload` bytes, a
SavedModel as a tar of its directory. Each Python worker loads the model the
first time a task needs it and keeps it in the process-wide cache of
:mod:`sparktf.model_io` (keyed by content hash), so later tasks and later jobs
with the same model skip the load.

Executor side, a *runner* feeds batches of leaf arrays to the model in the
model's own input structure and returns its outputs as a flat list of arrays.
:meth:`TFPredictor.predict` splits them into one element per record;
:meth:`TFPredictor.predict_dataframe` appends them to Arrow record batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
from pyspark import RDD, TaskContext
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from sparktf import arrow_io, batching, model_io, specs
from sparktf.batch_errors import rejected_batch
from sparktf.cluster import configure_task_threads
from sparktf.errors import DataError
from sparktf.worker_gc import frozen_after

__all__ = ["TFPredictor", "TensorInfo"]

# Output kinds: one array per record, a list of arrays, or a dict name -> array.
SINGLE, LIST, DICT = "single", "list", "dict"

_SPARK_TYPES = {
    "float32": T.FloatType(),
    "float64": T.DoubleType(),
    "int8": T.ByteType(),
    "int16": T.ShortType(),
    "int32": T.IntegerType(),
    "int64": T.LongType(),
    "bool": T.BooleanType(),
    "object": T.BinaryType(),
}
# Hidden DataFrame columns holding float-array copies of Vector feature columns.
_FEATURE_PREFIX = "__sparktf_feature_"
# Output dtypes Spark has no type for, and what they are widened to.
_WIDENED = {"float16": "float32", "bfloat16": "float32", "uint8": "int16", "uint16": "int32", "uint32": "int64"}


@dataclass(frozen=True)
class TensorInfo:
    """One model input or output: its name, dtype and per-record shape.

    Attributes
    ----------
    name : str
    dtype : numpy.dtype
        ``object`` for ``tf.string``.
    shape : tuple
        Shape of one record (no batch dimension); ``None`` for a dimension of
        any size.
    """

    name: str
    dtype: np.dtype
    shape: Tuple[Optional[int], ...]

    @classmethod
    def from_tensor(cls, name: str, tensor: Any) -> "TensorInfo":
        """From a ``tf.TensorSpec`` or a ``KerasTensor`` with a batch dimension."""
        import tensorflow as tf

        dtype = np.dtype(tf.as_dtype(tensor.dtype).as_numpy_dtype)
        shape = tuple(tf.TensorShape(tensor.shape).as_list()[1:])
        return cls(name, dtype, shape)

    def describe(self) -> str:
        return f"{self.name!r} {specs.dtype_name(self.dtype)} {list(self.shape)}"

    def accepts(self, leaf: specs.LeafSpec) -> bool:
        """Whether records of ``leaf`` fit this input (numbers are cast, strings must be strings)."""
        same_rank = len(leaf.shape) == len(self.shape)
        dims_fit = same_rank and all(want in (None, got) for want, got in zip(self.shape, leaf.shape))
        return dims_fit and (leaf.is_string == (self.dtype == np.dtype(object)))


@dataclass(frozen=True)
class _Feed:
    """How leaf arrays become the model's input: which leaf goes to which input.

    ``order[i]`` is the index of the leaf that feeds ``inputs[i]``;
    ``structure`` is the model's input nesting (``SINGLE``, ``LIST`` or ``DICT``).
    """

    inputs: Tuple[TensorInfo, ...]
    structure: str
    order: Tuple[int, ...]

    def pack(self, leaves: Sequence[np.ndarray]) -> Any:
        """The model's input for a batch of leaf arrays (numbers cast to the inputs' dtypes)."""
        return self.structured([_cast(leaves[i], info.dtype) for i, info in zip(self.order, self.inputs)])

    def structured(self, values: List[Any]) -> Any:
        """``values`` (one per input, in input order) in the model's input nesting."""
        if self.structure == SINGLE:
            return values[0]
        if self.structure == DICT:
            return {info.name: value for info, value in zip(self.inputs, values)}
        return values

    def expected(self) -> str:
        return "[" + ", ".join(info.describe() for info in self.inputs) + "]"


def _cast(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype == np.dtype(object) or array.dtype == dtype:
        return array
    return array.astype(dtype)


def _plan_feed(
    inputs: Sequence[TensorInfo], structure: str, leaves: Sequence[specs.LeafSpec], names: Optional[Sequence[str]]
) -> _Feed:
    """Match data leaves to model inputs by name when all names match, else by position.

    Raises
    ------
    DataError
        On a different number of inputs, or a leaf whose shape or kind
        (string vs number) does not fit its input; the message lists the
        model's expected inputs.
    """
    feed = _Feed(tuple(inputs), structure, tuple(range(len(leaves))))
    if len(leaves) != len(inputs):
        got = ", ".join(f"{leaf.path} {leaf.dtype_name} {list(leaf.shape)}" for leaf in leaves)
        raise DataError(
            f"the model takes {len(inputs)} input(s) {feed.expected()} but the data has "
            f"{len(leaves)} feature(s) [{got}]. Give one feature per model input."
        )
    if names is not None and set(names) == {info.name for info in inputs}:
        feed = _Feed(feed.inputs, structure, tuple(list(names).index(info.name) for info in inputs))
    for info, index in zip(inputs, feed.order):
        leaf = leaves[index]
        if not info.accepts(leaf):
            raise DataError(
                f"feature {leaf.path} ({leaf.dtype_name} of shape {list(leaf.shape)} per record) does "
                f"not fit model input {info.describe()}; the model expects {feed.expected()} per "
                "record. Reshape or cast the data, or create the TFDataset with the model's input spec."
            )
    return feed


# --------------------------------------------------------------------------
# Runners: the executor-side callables that run one batch


class _KerasRunner:
    """Calls a Keras model through a concrete ``tf.function`` (inference mode).

    One concrete function per input signature (the inputs' nesting, dtypes and
    per-record shapes), traced once with a batch dimension of any size, so the
    short last batch of a partition reuses the trace. Calling the concrete
    function directly skips the ``tf.function`` dispatch (argument
    canonicalisation and trace lookup): ~100 us less per batch.
    """

    def __init__(self, model: Any):
        self.model = model
        self._calls: Dict[str, Callable[..., Any]] = {}

    def __call__(self, inputs: Any) -> Any:
        import tensorflow as tf

        key = repr(tf.nest.map_structure(lambda a: (a.dtype.str, a.shape[1:]), inputs))
        call = self._calls.get(key)
        if call is None:
            call = self._trace(inputs)
            self._calls[key] = call
        return tf.nest.map_structure(lambda t: t.numpy(), call(inputs))

    def _trace(self, inputs: Any) -> Callable[..., Any]:
        import tensorflow as tf

        model = self.model
        signature = tf.nest.map_structure(_any_batch_spec, inputs)
        return tf.function(lambda x: model(x, training=False)).get_concrete_function(signature)


def _any_batch_spec(array: np.ndarray) -> Any:
    """The ``tf.TensorSpec`` of a batch like ``array`` with any number of records (object arrays: strings)."""
    import tensorflow as tf

    dtype = tf.string if array.dtype == np.dtype(object) else tf.as_dtype(array.dtype)
    return tf.TensorSpec((None,) + array.shape[1:], dtype)


class _SignatureRunner:
    """Calls one signature of a loaded SavedModel and picks its outputs."""

    def __init__(self, loaded: Any, signature: str, outputs: Sequence[str], kind: str):
        self.loaded = loaded  # keeps the signature's variables alive
        self._function = loaded.signatures[signature]
        self._outputs = list(outputs)
        self._kind = kind

    def __call__(self, inputs: Dict[str, np.ndarray]) -> Any:
        result = self._function(**inputs)
        arrays = [result[name].numpy() for name in self._outputs]
        if self._kind == SINGLE:
            return arrays[0]
        return dict(zip(self._outputs, arrays)) if self._kind == DICT else arrays


@dataclass(frozen=True)
class _ModelHandle:
    """What executors need to get the runner: the broadcast and how to load it."""

    kind: str  # "keras" or "saved_model"
    key: str
    broadcast: Any
    signature: str = ""
    outputs: Tuple[str, ...] = ()
    output_kind: str = SINGLE

    def runner(self) -> Callable[[Any], Any]:
        """The cached runner of this process (loads the model on the first call).

        Inside a Spark task, TensorFlow's threads are first set to
        ``spark.task.cpus`` (as for training), so concurrent tasks do not
        compete for the same cores. A freshly loaded model is frozen out of
        the garbage collector's full collections (see :mod:`sparktf.worker_gc`).
        """
        context = TaskContext.get()
        if context is not None:
            configure_task_threads(context.cpus())
        if self.kind == "keras":
            return model_io.cached(
                "keras-predict:" + self.key,
                frozen_after(lambda: _KerasRunner(model_io.ModelPayload.from_bytes(self.broadcast.value).build())),
            )
        loaded = model_io.cached("saved-model:" + self.key, frozen_after(lambda: self.broadcast.value.load()))
        return _SignatureRunner(loaded, self.signature, self.outputs, self.output_kind)


def _run_batches(
    handle: _ModelHandle, feed: _Feed, batches: Iterable[List[np.ndarray]], partition: int
) -> Iterator[Tuple[int, Any]]:
    """Yield ``(number of records, raw model output)`` per batch.

    A model that rejects a batch raises :class:`DataError` naming the
    partition, the records of the batch and the model's expected input.
    """
    runner = handle.runner()
    start = 0
    for leaves in batches:
        size = len(leaves[0])
        try:
            output = runner(feed.pack(leaves))
        except (ValueError, TypeError) + _tf_input_errors() as exc:
            raise rejected_batch(partition, start, leaves, exc, "model", feed.expected()) from exc
        yield size, output
        start += size


def _tf_input_errors() -> tuple:
    import tensorflow as tf

    return (tf.errors.InvalidArgumentError,)


def _flat_outputs(output: Any) -> Tuple[str, List[str], List[np.ndarray]]:
    """``(kind, names, arrays)`` of a model's output for a batch."""
    if isinstance(output, dict):
        return DICT, list(output), [np.asarray(v) for v in output.values()]
    if isinstance(output, (list, tuple)):
        return LIST, [], [np.asarray(v) for v in output]
    return SINGLE, [], [np.asarray(output)]


def _records(output: Any, size: int) -> Iterator[Any]:
    """One element per record: an ndarray, a list or a dict of them."""
    kind, names, arrays = _flat_outputs(output)
    for array in arrays:
        if len(array) != size:
            raise DataError(
                f"the model returned {len(array)} rows for a batch of {size} records; a prediction "
                "model must return one row per input record"
            )
    rows = [_rows(array) for array in arrays]
    if kind == SINGLE:
        yield from rows[0]
    elif kind == LIST:
        yield from (list(row) for row in zip(*rows))
    else:
        yield from (dict(zip(names, row)) for row in zip(*rows))


def _rows(array: np.ndarray) -> Iterator[np.ndarray]:
    """The per-record ndarrays of a batch (0-d arrays, not NumPy scalars, for a 1-D batch)."""
    return (np.asarray(value) for value in array) if array.ndim == 1 else iter(array)


def _partition_id() -> int:
    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


# --------------------------------------------------------------------------
# DataFrame output: Arrow arrays and Spark types


def _arrow_column(array: np.ndarray) -> pa.Array:
    """An ``(n, d1, d2, ...)`` array as Arrow nested lists (``list<list<...>>``)."""
    array = np.ascontiguousarray(array.astype(_WIDENED.get(array.dtype.name, array.dtype), copy=False))
    values = pa.array(array.reshape(-1), type=pa.binary() if array.dtype == object else None)
    for depth in range(array.ndim - 1, 0, -1):  # innermost level first
        lists = int(np.prod(array.shape[:depth]))
        offsets = np.arange(lists + 1, dtype=np.int32) * array.shape[depth]
        values = pa.ListArray.from_arrays(pa.array(offsets), values)
    return values


def _spark_type(info: TensorInfo) -> T.DataType:
    name = _WIDENED.get(info.dtype.name, info.dtype.name)
    if name not in _SPARK_TYPES:
        raise DataError(f"model output {info.describe()} has a dtype Spark cannot hold")
    data_type = _SPARK_TYPES[name]
    for _ in info.shape:
        data_type = T.ArrayType(data_type, containsNull=False)
    return data_type


def _output_type(kind: str, outputs: Sequence[TensorInfo]) -> T.DataType:
    if kind == SINGLE:
        return _spark_type(outputs[0])
    names = [info.name if kind == DICT else f"output_{i}" for i, info in enumerate(outputs)]
    return T.StructType([T.StructField(n, _spark_type(info), False) for n, info in zip(names, outputs)])


class _DataFramePredict:
    """``mapInArrow`` function: each record batch's kept columns plus the prediction.

    Batches of the model never span two Arrow record batches (Spark's
    ``spark.sql.execution.arrow.maxRecordsPerBatch``, 10,000 rows by default).
    """

    def __init__(self, handle, feed, leaves, feature_columns, kept_columns, batch, output_col, output_type):
        self.handle = handle
        self.feed = feed
        self.leaves = list(leaves)
        self.feature_columns = list(feature_columns)
        self.kept_columns = list(kept_columns)
        self.batch = batch
        self.output_col = output_col
        self.output_type = output_type

    def __call__(self, record_batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = _partition_id()
        first_row = 0
        for record_batch in record_batches:
            block = tuple(
                arrow_io.arrow_to_numpy(record_batch.column(name), leaf, name, partition, first_row)
                for leaf, name in zip(self.leaves, self.feature_columns)
            )
            batches = batching.inference_batches([block], self.batch)
            outputs = [output for _, output in _run_batches(self.handle, self.feed, batches, partition)]
            columns = [record_batch.column(name) for name in self.kept_columns]
            prediction = self._prediction_column(outputs, record_batch.num_rows)
            yield pa.RecordBatch.from_arrays(columns + [prediction], names=self.kept_columns + [self.output_col])
            first_row += record_batch.num_rows

    def _prediction_column(self, outputs: List[Any], num_rows: int) -> pa.Array:
        if not outputs:
            return pa.nulls(num_rows, type=pa.float32())
        parts = [_flat_outputs(output)[2] for output in outputs]
        arrays = [_arrow_column(np.concatenate(pieces)) for pieces in zip(*parts)]
        if isinstance(self.output_type, T.StructType):
            return pa.StructArray.from_arrays(arrays, names=self.output_type.names)
        return arrays[0]


# --------------------------------------------------------------------------
# Driver-side model descriptions


class _KerasModel:
    """A Keras model on the driver: its inputs, outputs and broadcast handle."""

    def __init__(self, model: Any):
        from pyspark import SparkContext

        payload = model_io.ModelPayload.from_model(model, include_optimizer=False)
        broadcast = SparkContext.getOrCreate().broadcast(payload.to_bytes())
        self.model = model
        self.handle = _ModelHandle("keras", payload.key, broadcast)

    def feed(self, leaves: Sequence[specs.LeafSpec], names: Optional[Sequence[str]]) -> _Feed:
        declared = _keras_inputs(self.model)
        if declared is None:  # a subclassed model: feed the data's own structure
            inputs = [TensorInfo(name, leaf.dtype, leaf.shape) for name, leaf in zip(names or _paths(leaves), leaves)]
            structure = SINGLE if len(leaves) == 1 else DICT if names is not None else LIST
            return _plan_feed(inputs, structure, leaves, names)
        return _plan_feed(declared[0], declared[1], leaves, names)

    def outputs(self, feed: _Feed) -> Tuple[str, List[TensorInfo]]:
        import keras

        symbolic = [keras.KerasTensor((None,) + info.shape, dtype=specs.dtype_name(info.dtype)) for info in feed.inputs]
        spec = self.model.compute_output_spec(feed.structured(symbolic))
        if isinstance(spec, dict):
            return DICT, [TensorInfo.from_tensor(name, t) for name, t in spec.items()]
        if isinstance(spec, (list, tuple)):
            return LIST, [TensorInfo.from_tensor(f"output_{i}", t) for i, t in enumerate(spec)]
        return SINGLE, [TensorInfo.from_tensor("output", spec)]


class _SavedModel:
    """A SavedModel signature on the driver: its inputs, chosen outputs and broadcast handle."""

    def __init__(self, path: str, signature: str, outputs: Union[str, Sequence[str], None]):
        import tensorflow as tf
        from pyspark import SparkContext

        archive = model_io.SavedModelArchive.from_directory(path)
        function = _signature(tf.saved_model.load(path), signature, path)
        _, input_specs = function.structured_input_signature
        self.inputs = [TensorInfo.from_tensor(name, spec) for name, spec in input_specs.items()]
        available = function.structured_outputs
        names = _selected_outputs(available, outputs, signature)
        self.kind = SINGLE if len(names) == 1 else DICT if outputs is None else LIST
        self.output_infos = [TensorInfo.from_tensor(name, available[name]) for name in names]
        broadcast = SparkContext.getOrCreate().broadcast(archive)
        self.handle = _ModelHandle("saved_model", archive.key, broadcast, signature, tuple(names), self.kind)

    def feed(self, leaves: Sequence[specs.LeafSpec], names: Optional[Sequence[str]]) -> _Feed:
        return _plan_feed(self.inputs, DICT, leaves, names)

    def outputs(self, feed: _Feed) -> Tuple[str, List[TensorInfo]]:
        return self.kind, self.output_infos


# --------------------------------------------------------------------------
# The public class


class TFPredictor:
    """Distributed batch inference over a :class:`~sparktf.dataset.TFDataset` or a DataFrame.

    Create it with :meth:`from_keras` or :meth:`from_saved_model`. The model
    is broadcast once per predictor and loaded once per Python worker process
    (cached by content hash, shared by later jobs and predictors).

    Attributes
    ----------
    dataset : TFDataset
        The records :meth:`predict` runs on (labels, if any, are ignored); its
        ``batch_per_thread`` (or ``batch_size``) also sets the batch of
        :meth:`predict_dataframe`.
    """

    def __init__(self, model: Union[_KerasModel, _SavedModel], dataset: Any):
        self._model = model
        self.dataset = dataset
        self._dataset_feed()  # check the data against the model before any job runs
        dataset.inference_batch_size(dataset.block_rdd.getNumPartitions())

    @classmethod
    def from_keras(cls, keras_model: Any, dataset: Any) -> "TFPredictor":
        """A predictor running ``keras_model(x, training=False)``.

        Parameters
        ----------
        keras_model : keras.Model
            A built model (functional, Sequential, or subclassed and called
            once); custom layers and Lambda functions defined in the user's
            script travel with it (see :mod:`sparktf.model_io`).
        dataset : TFDataset
            With ``batch_per_thread`` (or ``batch_size``) set.

        Raises
        ------
        DataError
            When the dataset's features do not fit the model's inputs, or no
            batch size is set.
        """
        return cls(_KerasModel(keras_model), dataset)

    @classmethod
    def from_saved_model(
        cls,
        path: str,
        dataset: Any,
        signature: str = "serving_default",
        outputs: Union[str, Sequence[str], None] = None,
    ) -> "TFPredictor":
        """A predictor calling one signature of the SavedModel at ``path``.

        The directory is read on the driver and broadcast as a tar (so
        executors need no shared file system); each Python worker unpacks
        and loads it once.

        Parameters
        ----------
        path : str
            A SavedModel directory (``tf.saved_model.save`` / ``model.export``).
        dataset : TFDataset
            Its features feed the signature's inputs: by name when the
            features are a dict keyed by the input names, else in the order of
            the signature's inputs.
        signature : str
            The signature to call.
        outputs : str or list of str, optional
            A name gives one ndarray per record; a list gives a list in that
            order (a one-element list gives an ndarray); ``None`` gives all
            outputs, as a dict when there are several.

        Raises
        ------
        DataError
            For a missing signature or output name, or features that do not
            fit the signature's inputs.
        """
        return cls(_SavedModel(path, signature, outputs), dataset)

    # ------------------------------------------------------------------ RDD

    def predict(self) -> RDD:
        """Predictions for the dataset's records, in order.

        Returns
        -------
        pyspark.RDD
            One element per record, with the dataset's partitioning: an
            ndarray, or a list / dict of ndarrays for several outputs. Lazy:
            a bad record raises ``DataError`` (inside Spark's exception) when
            the RDD is computed.
        """
        feed = self._dataset_feed()
        block_rdd = self.dataset.block_rdd
        batch = self.dataset.inference_batch_size(block_rdd.getNumPartitions())
        num_features = len(feed.order)
        handle = self._model.handle

        def predict_partition(blocks: Iterator[tuple]) -> Iterator[Any]:
            partition = _partition_id()
            features = (block[:num_features] for block in blocks)
            for size, output in _run_batches(handle, feed, batching.inference_batches(features, batch), partition):
                yield from _records(output, size)

        return block_rdd.mapPartitions(predict_partition, preservesPartitioning=True)

    def _dataset_feed(self) -> _Feed:
        feature_spec = self.dataset.feature_spec
        leaves = specs.leaf_specs(feature_spec, "features")
        names = sorted(feature_spec) if isinstance(feature_spec, dict) else None
        return self._model.feed(leaves, names)

    # ------------------------------------------------------------------ DataFrame

    def predict_dataframe(
        self, df: DataFrame, feature_cols: Union[str, Sequence[str]], output_col: str = "prediction"
    ) -> DataFrame:
        """``df`` with a prediction column appended, computed through Arrow.

        Parameters
        ----------
        df : pyspark.sql.DataFrame
        feature_cols : str or list of str
            Numeric, ``ArrayType``, ``Vector``, ``string`` or ``binary``
            columns, one per model input (matched by name when they are named
            like the model's inputs, else in order). Text columns feed
            ``tf.string`` inputs as bytes (strings UTF-8 encoded), e.g. a
            signature that decodes JPEG bytes.
        output_col : str
            Name of the new column: a number for scalar predictions, an
            ``array<float>`` (nested for higher ranks) for array-valued ones,
            a struct of those (one field per output) for several outputs.

        Returns
        -------
        pyspark.sql.DataFrame
            Every column of ``df`` plus ``output_col``, rows in order.

        Raises
        ------
        DataError
            For a missing or unsupported column, an existing ``output_col``,
            or columns that do not fit the model's inputs (checked before
            any job runs). While computing: a null, a row of another array
            length (naming the column, partition and row) or a batch the
            model rejects (naming the partition and records).
        """
        columns = [feature_cols] if isinstance(feature_cols, str) else list(feature_cols)
        if output_col in df.columns:
            raise DataError(f"column {output_col!r} already exists in the DataFrame; pick another output_col")
        layouts = arrow_io.column_layouts(df, columns)
        leaves = [specs.leaf_specs(specs.parse_spec(layout, name), name)[0] for name, layout in zip(columns, layouts)]
        feed = self._model.feed(leaves, columns)
        kind, outputs = self._model.outputs(feed)
        output_type = _output_type(kind, outputs)
        selected, feature_names = _arrow_features(df, columns)
        batch = self.dataset.inference_batch_size(df.sparkSession.sparkContext.defaultParallelism)
        function = _DataFramePredict(
            self._model.handle, feed, leaves, feature_names, df.columns, batch, output_col, output_type
        )
        schema = T.StructType(df.schema.fields + [T.StructField(output_col, output_type, False)])
        return selected.mapInArrow(function, schema)


def _arrow_features(df: DataFrame, columns: Sequence[str]) -> Tuple[DataFrame, List[str]]:
    """``df`` plus hidden float32-array copies of its ``Vector`` feature columns, and the column to read per feature.

    Array and numeric columns are read as they are, so each travels to Python once.
    """
    names = [
        f"{_FEATURE_PREFIX}{i}" if arrow_io.is_vector_column(df, column) else column
        for i, column in enumerate(columns)
    ]
    copies = [arrow_io.arrow_feature(df, c).alias(n) for c, n in zip(columns, names) if n != c]
    return df.select("*", *copies), names


# --------------------------------------------------------------------------
# Describing models


def _keras_inputs(model: Any) -> Optional[Tuple[List[TensorInfo], str]]:
    """The declared inputs and their nesting, or ``None`` for a subclassed model."""
    try:
        structure = model.input  # functional models
    except AttributeError:
        structure = getattr(model, "inputs", None)  # Sequential: a list of one
        if structure is None:
            return None
        structure = structure[0] if len(structure) == 1 else structure
    if isinstance(structure, dict):
        return [TensorInfo.from_tensor(name, t) for name, t in structure.items()], DICT
    if isinstance(structure, (list, tuple)):
        return [TensorInfo.from_tensor(t.name, t) for t in structure], LIST
    return [TensorInfo.from_tensor(structure.name, structure)], SINGLE


def _paths(leaves: Sequence[specs.LeafSpec]) -> List[str]:
    return [leaf.path for leaf in leaves]


def _signature(loaded: Any, signature: str, path: str) -> Any:
    if signature not in loaded.signatures:
        raise DataError(
            f"the SavedModel at {path!r} has no signature {signature!r}; it has "
            f"{sorted(loaded.signatures.keys())}. Pass one of them as signature=..."
        )
    return loaded.signatures[signature]


def _selected_outputs(
    available: Dict[str, Any], outputs: Union[str, Sequence[str], None], signature: str
) -> List[str]:
    """The names of the outputs to return, in order."""
    wanted = [outputs] if isinstance(outputs, str) else sorted(available) if outputs is None else list(outputs)
    missing = [name for name in wanted if name not in available]
    if missing or not wanted:
        raise DataError(
            f"signature {signature!r} has no output(s) {missing or wanted}; its outputs are "
            f"{sorted(available)}. Pass some of them as outputs=..."
        )
    return wanted
