"""TFPredictor: distributed batch inference with a Keras model or a SavedModel.

The driver describes the model's inputs and outputs (:class:`TensorInfo`,
through the model sources of :mod:`sparktf.inference.model_sources`), checks
the data against them before launching anything, and broadcasts the model once: a Keras model as :class:`~sparktf.models.payload.ModelPayload` bytes, a
SavedModel as a tar of its directory. Each Python worker loads the model the
first time a task needs it and keeps it in the process-wide cache of
:mod:`sparktf.models.cache` (keyed by content hash), so later tasks and later jobs
with the same model skip the load.

Executor side, a *runner* feeds batches of leaf arrays to the model in the
model's own input structure and returns its outputs as a flat list of arrays.
:meth:`TFPredictor.predict` splits them into one element per record;
:meth:`TFPredictor.predict_dataframe` appends them to Arrow record batches
(:func:`dataframe_with_predictions`, which :mod:`sparktf.ml`'s ``KerasModel``
also uses).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

from pyspark import RDD
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from sparktf.context import current_session
from sparktf.data import arrow_io, batching, specs
from sparktf.data.batch_maps import NO_MAPS, BatchMaps
from sparktf.errors import ConfigurationError, DataError
from sparktf.inference import columns as column_checks
from sparktf.inference.dataframe_output import DataFramePredict, spark_output_type
from sparktf.inference.feeds import Feed, TensorInfo, feature_leaves
from sparktf.inference.model_sources import KerasModelSource, ModelSource, SavedModelSource, keras_source, published_source
from sparktf.inference.runners import records, run_batches
from sparktf.spark.raising_rdd import raising_sparktf_errors
from sparktf.spark.remote_errors import reporting_failures
from sparktf.spark.resources import ResourceProfileLike, map_in_arrow, stage_profile, with_profile
from sparktf.spark.task_devices import gpu_plan
from sparktf.streaming.stream_dataset import resolved_for

__all__ = ["TFPredictor", "TensorInfo"]

#: What TFPredictor.predict tells a Spark Connect user to use instead.
_PREDICT_ALTERNATIVE = (
    "Use TFPredictor.predict_dataframe(df, feature_cols), which returns a DataFrame, on a DataFrame of the records."
)

# Hidden DataFrame columns holding float-array copies of Vector feature columns.
_FEATURE_PREFIX = "__sparktf_feature_"


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

    def __init__(self, model: ModelSource, dataset: Any):
        if dataset.is_streaming and isinstance(model, KerasModelSource):  # lengths its schema does not tell
            dataset = resolved_for(dataset, model.model)
        self._model = model
        self.dataset = dataset
        self._elements = model.elements(dataset.batch_maps, dataset.stored_structure[:1])  # the features alone
        self._dataset_feed()  # check the data against the model before any job runs
        dataset.inference_batch_size(dataset.blocks.num_partitions)

    @classmethod
    def from_keras(cls, keras_model: Any, dataset: Any, method: str = "call", **method_kwargs: Any) -> "TFPredictor":
        """A predictor running ``keras_model(x, training=False)``, or ``keras_model.generate``.

        Parameters
        ----------
        keras_model : keras.Model
            A built model (functional, Sequential, or subclassed and called
            once); custom layers and Lambda functions defined in the user's
            script travel with it (see :mod:`sparktf.models.cache`), and so do
            its vocabularies and lookup tables. A Keras Hub task's
            ``preprocessor`` runs on each batch first, as in ``task.predict``.
        dataset : TFDataset
            With ``batch_per_thread`` (or ``batch_size``) set; its maps
            (:meth:`TFDataset.map`) run on the features of each batch.
        method : {"call", "generate"}
            ``"generate"`` runs ``keras_model.generate`` (a Keras Hub
            ``CausalLM``) on batches of prompts: :meth:`predict` gives one
            ``str`` per prompt, :meth:`predict_dataframe` a string column.
        **method_kwargs
            For ``"generate"``: ``max_new_tokens=N`` (each row gets at most N
            new tokens, whatever its prompt's length), ``prefix="..."`` (a
            prompt prefix shared by every row, prefilled once per worker and
            not part of the completions), ``on_error="raise" | "null"`` (a row
            that cannot be completed, e.g. too long for the model, fails the
            job with a ``DataError`` naming it, or gets a null completion),
            and ``generate``'s ``max_length``, ``stop_token_ids`` and
            ``strip_prompt``. Prompts are grouped by length within each
            partition (see ``docs/guides/pretrained-models.md``).

        Raises
        ------
        DataError
            When the dataset's features do not fit the model's inputs, or no
            batch size is set.
        ConfigurationError
            For a keyword neither sparktf nor ``generate`` takes, or a value
            out of range, before any job.
        """
        return cls(keras_source(keras_model, method, method_kwargs), dataset)

    @classmethod
    def from_published(cls, model_dir: str, dataset: Any, method: str = "predict", version_col: Optional[str] = None,
                       **method_kwargs: Any) -> "TFPredictor":
        """A predictor scoring with the newest version ``optimize_stream`` published to ``model_dir``.

        Each prediction task looks the newest complete version up once, when
        it starts, and loads it once per Python worker: a running streaming
        query scores each micro-batch with the newest version (never two
        inside one task), a batch job with the newest at its tasks' start, and
        neither is restarted for a new version. Every version must keep the
        inputs and outputs of the one the predictor was made with.

        Parameters
        ----------
        model_dir : str
            The ``model_dir`` of the training (a local path or a URI the
            executors can read).
        dataset : TFDataset
            As in :meth:`from_keras` (a streaming one too).
        method : {"predict", "generate"}
            ``"predict"`` calls the model (as :meth:`from_keras`'s ``"call"``).
        version_col : str, optional
            ``predict_dataframe`` adds this column (``long``): the number of
            the version that scored each row.
        **method_kwargs
            Keywords of ``generate``.

        Raises
        ------
        DataError
            When nothing is published yet, or the data does not fit the newest version.
        ConfigurationError
            A keyword the method does not take, or a ``version_col`` that is not a column name.
        """
        method = "call" if method == "predict" else method
        if version_col is not None and not (isinstance(version_col, str) and version_col):
            raise ConfigurationError(f"version_col must be the name of the column to add, got {version_col!r}")
        return cls(published_source(model_dir, method, method_kwargs, version_col), dataset)

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
            A SavedModel directory (``tf.saved_model.save`` / ``model.export``):
            a local path or a URI (see ``docs/guides/storage.md``).
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
        return cls(SavedModelSource(path, signature, outputs), dataset)

    # ------------------------------------------------------------------ RDD

    def predict(self, *, resource_profile: ResourceProfileLike = None) -> RDD:
        """Predictions for the dataset's records, in order.

        Parameters
        ----------
        resource_profile : pyspark.resource.ResourceProfile or dict, optional
            What each prediction task needs, e.g. ``{"cpus": 4, "gpus": 1}``
            (stage-level scheduling: only this stage asks for it; see
            ``docs/guides/gpu.md``). Default: the session's task resources.

        Returns
        -------
        pyspark.RDD
            One element per record, with the dataset's partitioning: an
            ndarray, or a list / dict of ndarrays for several outputs. Lazy:
            a bad record raises ``DataError`` (inside Spark's exception) when
            the RDD is computed.

        Raises
        ------
        SparkTFError
            A ``resource_profile`` Spark cannot run here (e.g. in local mode).
        """
        session = self.dataset.blocks.kind
        session.spark_context("TFPredictor.predict, which returns an RDD,", _PREDICT_ALTERNATIVE)
        feed = self._dataset_feed()
        block_rdd = self.dataset.block_rdd
        batch = self.dataset.inference_batch_size(block_rdd.getNumPartitions())
        num_features = len(specs.flatten(self._elements.stored[0]))
        profile = stage_profile(session, resource_profile)
        handle = dataclasses.replace(self._model.handle, gpus=gpu_plan(session.conf, profile), elements=self._elements)
        handle, batch = handle.for_batch(batch)

        def predict_partition(partition: int, blocks: Iterator[tuple]) -> Iterator[Any]:
            features = (block[:num_features] for block in blocks)
            pinned = handle.pinned()  # a published version: looked up once for the task
            for size, output in run_batches(pinned, feed, batching.inference_batches(features, batch), partition):
                yield from records(output, size)

        return with_profile(raising_sparktf_errors(session, block_rdd, predict_partition, preservesPartitioning=True), profile)

    def _dataset_feed(self) -> Feed:
        return self._model.feed(*feature_leaves(self._elements.element[0]))

    # ------------------------------------------------------------------ DataFrame

    def predict_dataframe(
        self, df: DataFrame, feature_cols: Union[str, Sequence[str]], output_col: str = "prediction", *,
        resource_profile: ResourceProfileLike = None,
    ) -> DataFrame:
        """``df`` with a prediction column appended, computed through Arrow.

        Parameters
        ----------
        df : pyspark.sql.DataFrame
            A DataFrame, or a streaming one (``df.isStreaming``): the result
            is then a streaming DataFrame for any sink, and nothing runs until
            its query starts. A stream's array and vector lengths come from
            the model's declared inputs, else from the predictor's dataset.
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
        resource_profile : pyspark.resource.ResourceProfile or dict, optional
            What each prediction task needs (see :meth:`predict`).

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
        SparkTFError
            A ``resource_profile`` Spark cannot run here (e.g. in local mode).
        """
        columns = [feature_cols] if isinstance(feature_cols, str) else list(feature_cols)
        check_new_column(df, output_col, "output_col")
        session = current_session(df.sparkSession)
        profile = stage_profile(session, resource_profile)
        leaves = column_leaves(df, columns, self._model, self._elements.stored[0])
        batch = self.dataset.inference_batch_size(session.default_parallelism())
        return dataframe_with_predictions(self._model, df, columns, leaves, output_col, batch, profile,
                                          self.dataset.batch_maps)


def check_new_column(df: DataFrame, name: str, parameter: str) -> None:
    """Refuse a new column ``name`` that ``df`` already has (``DataError`` naming ``parameter``)."""
    if name in df.columns:
        raise DataError(f"column {name!r} already exists in the DataFrame; pick another {parameter}")


def column_leaves(df: DataFrame, columns: Sequence[str], source: Optional[ModelSource] = None,
                  known: Any = None) -> List[specs.LeafSpec]:
    """The dtype and per-row shape of each of ``columns``.

    A DataFrame's array lengths are read from its first row (a small job). A
    streaming DataFrame runs nothing: its lengths come from the inputs
    ``source`` declares, else from its schema, else from ``known``, the
    features' specs (e.g. of the dataset a predictor was made with), one per
    column (see :func:`~sparktf.inference.columns.stream_leaves`).

    Raises
    ------
    DataError
        For a stream whose lengths neither tells, naming the columns.
    """
    if not df.isStreaming:
        layouts = arrow_io.column_layouts(df, columns)
        return [specs.leaf_specs(specs.parse_spec(layout, name), name)[0] for name, layout in zip(columns, layouts)]
    stored = [] if known is None else specs.leaf_specs(known, "features")
    fallback = [leaf.shape for leaf in stored] if len(stored) == len(columns) else []
    return column_checks.stream_leaves(df, columns, None if source is None else source.declared_inputs(), fallback,
                                       advice=", or make the predictor's dataset with features of these columns' "
                                              "shapes")


def dataframe_with_predictions(
    source: ModelSource, df: DataFrame, columns: Sequence[str], leaves: Sequence[specs.LeafSpec],
    output_col: str, batch: int, profile: Any = None, maps: BatchMaps = NO_MAPS,
) -> DataFrame:
    """``df`` plus the model's output in ``output_col``: a lazy ``mapInArrow``, no Spark job.

    Shared by :meth:`TFPredictor.predict_dataframe` and :mod:`sparktf.ml`.

    Parameters
    ----------
    source : KerasModelSource or SavedModelSource
        The model, broadcast once.
    df : pyspark.sql.DataFrame
    columns : list of str
        The feature columns, one per model input.
    leaves : list of LeafSpec
        Per column: the dtype and per-row shape its rows must have.
    output_col : str
        The new column (see :meth:`TFPredictor.predict_dataframe` for its type).
    batch : int
        Records per model call.
    profile : pyspark.resource.ResourceProfile, optional
        The prediction stage's resource profile (None: the session's defaults).
    maps : BatchMaps
        Functions each batch of the columns goes through first (called with
        the features alone: a column's tensor, or a list of them); a Keras
        Hub task's preprocessing follows them.

    Raises
    ------
    DataError
        When the columns do not fit the model's inputs, or an output has a
        dtype Spark cannot hold.
    """
    elements = source.elements(maps, (_column_specs(leaves),))
    if elements.maps.active:  # the inputs are what the maps return
        feed = source.feed(*feature_leaves(elements.element[0]))
    else:
        feed = source.feed(leaves, columns)
    kind, outputs = source.outputs(feed)
    output_type = spark_output_type(kind, outputs)
    selected, feature_names = _arrow_features(df, columns, leaves)
    session = current_session(df.sparkSession)
    gpus = gpu_plan(session.conf, profile)
    handle, batch = dataclasses.replace(source.handle, gpus=gpus, elements=elements).for_batch(batch)
    if df.isStreaming and not session.has_rdds:
        # a Connect server's streaming tasks do not see the session's artifacts: the model travels with the function
        handle = handle.with_bytes(source.inline_bytes())
    version_col = source.version_col
    if version_col is not None and (version_col in df.columns or version_col == output_col):
        raise ConfigurationError(f"version_col {version_col!r} names a column the output has already (the "
                                 f"DataFrame's {df.columns} and the prediction {output_col!r}); pick another name")
    function = reporting_failures(session, DataFramePredict(handle, feed, leaves, feature_names, df.columns, batch,
                                                            output_col, output_type, version_col))
    added = [T.StructField(output_col, output_type, handle.nullable_output)]
    added += [T.StructField(version_col, T.LongType(), False)] if version_col else []
    schema = T.StructType(df.schema.fields + added)
    return map_in_arrow(selected, function, schema, profile=profile)


def _column_specs(leaves: Sequence[specs.LeafSpec]) -> Any:
    """The feature specs of the columns' leaves: one ``tf.TensorSpec``, or a list of them."""
    import tensorflow as tf

    column_specs = [tf.TensorSpec(leaf.shape, tf.string if leaf.is_string else tf.as_dtype(leaf.dtype))
                    for leaf in leaves]
    return column_specs[0] if len(column_specs) == 1 else column_specs


def _arrow_features(df: DataFrame, columns: Sequence[str], leaves: Sequence[specs.LeafSpec]
                    ) -> Tuple[DataFrame, List[str]]:
    """``df`` plus hidden float32-array copies of its dense ``Vector`` feature columns, and the column to read per feature.

    Array, numeric and sparse vector columns are read as they are, so each travels to Python once.
    """
    names = [
        f"{_FEATURE_PREFIX}{i}" if arrow_io.is_vector_column(df, column) and not leaf.sparse else column
        for i, (column, leaf) in enumerate(zip(columns, leaves))
    ]
    copies = [arrow_io.arrow_feature(df, c).alias(n) for c, n in zip(columns, names) if n != c]
    return df.select("*", *copies), names

