"""``TFNet``: a frozen TensorFlow graph as a Keras layer, and ``export_tf``.

Every way of making a TFNet (SavedModel signature, frozen ``.pb``, export
folder, ``tf.function``) ends in one :class:`~sparktf.models.frozen_graph.FrozenGraph`,
so calling, pickling, Keras serialization and distributed prediction share a
single code path.
"""

from __future__ import annotations

import base64
import functools
import os
from typing import Any, Dict, List, Optional, Sequence, Union

import keras
import numpy as np
import tensorflow as tf

from sparktf.context import current_session
from sparktf.models import graph_io
from sparktf.data.columnar import balanced_bounds, slice_block
from sparktf.errors import DataError
from sparktf.models.frozen_graph import FrozenGraph, normalize_tensor_name, one_or_list, predict_partition, record_blocks
from sparktf.spark.raising_rdd import raising_sparktf_errors
from sparktf.spark.remote_errors import reporting_failures
from sparktf.spark.task_devices import gpu_plan

__all__ = ["TFNet", "export_tf"]

Arrays = Union[np.ndarray, List[np.ndarray]]


def export_tf(
    model_or_function: Any,
    folder: Union[str, os.PathLike],
    input_signature: Optional[Sequence[tf.TensorSpec]] = None,
) -> str:
    """Freeze a Keras model or a ``tf.function`` into an export folder.

    Parameters
    ----------
    model_or_function : keras.Model, tf.function, ConcreteFunction or callable
        What to export; a Keras model runs with ``training=False``.
    folder : str or path
        Created if missing; receives ``frozen_inference_graph.pb`` (variables
        frozen into constants) and ``graph_meta.json`` (``input_names``,
        ``output_names``, and each tensor's dtype and shape).
    input_signature : sequence of tf.TensorSpec, optional
        One spec per positional input; defaults to ``model.inputs`` for a
        Keras model and to the function's own signature.

    Returns
    -------
    str
        The folder, ready for :meth:`TFNet.from_export_folder`.
    """
    return graph_io.write_export_folder(graph_io.freeze_callable(model_or_function, input_signature), folder)


def _restore(graph_bytes: bytes, input_names: List[str], output_names: List[str], name: str) -> "TFNet":
    return TFNet(graph_bytes, input_names, output_names, name=name)


@keras.saving.register_keras_serializable(package="sparktf")
class TFNet(keras.layers.Layer):
    """A Keras layer running a frozen TensorFlow graph.

    It has no weights (``trainable_weights == []``), but gradients flow
    through it to its inputs, so trainable layers can sit before and after
    it. Inputs are cast to the graph's input dtypes (floats are not
    autocast by Keras). Usually built with a ``from_*`` factory.

    Parameters
    ----------
    graph_def : tf.compat.v1.GraphDef or bytes
        Frozen graph (no variables).
    input_names, output_names : sequence of str
        Tensor names like ``"Placeholder:0"``, in the order inputs are passed
        and outputs returned.
    **kwargs
        Keras layer arguments such as ``name``.
    """

    def __init__(
        self,
        graph_def: Union[tf.compat.v1.GraphDef, bytes],
        input_names: Sequence[str],
        output_names: Sequence[str],
        **kwargs: Any,
    ) -> None:
        kwargs["autocast"] = False
        super().__init__(**kwargs)
        self._graph = FrozenGraph(graph_def, input_names, output_names)
        self.built = True

    # ----------------------------------------------------------- factories
    @classmethod
    def _from_graph(cls, graph: FrozenGraph) -> "TFNet":
        return cls(graph.graph_def, graph.input_names, graph.output_names)

    @classmethod
    def from_saved_model(
        cls,
        path: str,
        signature: str = "serving_default",
        inputs: Optional[Sequence[str]] = None,
        outputs: Optional[Sequence[str]] = None,
    ) -> "TFNet":
        """Wrap one signature of a SavedModel, with its variables frozen.

        Parameters
        ----------
        path : str
            SavedModel directory.
        signature : str
            Signature key; a missing one raises ``DataError`` listing them.
        inputs, outputs : sequence of str, optional
            Signature input / output keys, selecting and ordering them;
            default all of them in sorted key order.
        """
        return cls._from_graph(graph_io.freeze_saved_model(path, signature, inputs, outputs))

    @classmethod
    def from_frozen_graph(
        cls,
        graph_def_or_path: Union[tf.compat.v1.GraphDef, bytes, str, os.PathLike],
        inputs: Sequence[str],
        outputs: Sequence[str],
    ) -> "TFNet":
        """Wrap a frozen ``GraphDef`` (object, bytes or binary ``.pb`` path).

        ``inputs`` / ``outputs`` are tensor names like ``"Placeholder:0"``;
        unknown names raise ``DataError`` listing the graph's candidates.
        """
        return cls(graph_io.read_graph_def(graph_def_or_path), inputs, outputs)

    @classmethod
    def from_export_folder(cls, folder: Union[str, os.PathLike]) -> "TFNet":
        """Wrap a folder written by :func:`export_tf` (``frozen_inference_graph.pb`` + ``graph_meta.json``)."""
        return cls._from_graph(graph_io.read_export_folder(folder))

    @classmethod
    def from_function(cls, tf_function: Any, input_signature: Optional[Sequence[tf.TensorSpec]] = None) -> "TFNet":
        """Freeze a ``tf.function`` (or a Keras model or callable) into a TFNet.

        ``input_signature`` gives one ``tf.TensorSpec`` per positional
        argument; it may be omitted when the function has its own.
        """
        return cls._from_graph(graph_io.freeze_callable(tf_function, input_signature))

    # ---------------------------------------------------------- properties
    @property
    def input_names(self) -> List[str]:
        """The graph's input tensor names, in call order."""
        return list(self._graph.input_names)

    @property
    def output_names(self) -> List[str]:
        """The graph's output tensor names, in result order."""
        return list(self._graph.output_names)

    @property
    def graph_def(self) -> tf.compat.v1.GraphDef:
        """The frozen ``GraphDef``."""
        return self._graph.graph_def

    @property
    def input_specs(self) -> List[tf.TensorSpec]:
        """One ``tf.TensorSpec`` per input, batch dimension included."""
        return self._graph.input_specs

    @property
    def output_specs(self) -> List[tf.TensorSpec]:
        """One ``tf.TensorSpec`` per output, batch dimension included."""
        return self._graph.output_specs

    # --------------------------------------------------------------- Keras
    def _as_list(self, inputs: Any) -> list:
        if isinstance(inputs, dict):
            by_name = {normalize_tensor_name(k): v for k, v in inputs.items()}
            missing = [n for n in self._graph.input_names if n not in by_name]
            if missing:
                raise DataError(
                    f"Inputs given as a dict lack {', '.join(missing)}; got keys {sorted(inputs)}. "
                    f"Key them by the input names {self._graph.input_names}."
                )
            inputs = [by_name[n] for n in self._graph.input_names]
        elif not isinstance(inputs, (list, tuple)):
            inputs = [inputs]
        self._graph.check_inputs(inputs)
        return list(inputs)

    def call(self, inputs: Any) -> Union[tf.Tensor, List[tf.Tensor]]:
        """Run the graph on tensors (one per input, or a list/dict of them)."""
        tensors = []
        for value, spec in zip(self._as_list(inputs), self._graph.input_specs):
            tensor = tf.convert_to_tensor(value)
            if tensor.dtype != spec.dtype:
                tensor = tf.cast(tensor, spec.dtype)
            tensors.append(tensor)
        return one_or_list(tf.nest.flatten(self._graph.function(*tensors)))

    def compute_output_spec(self, inputs: Any) -> Any:
        """Symbolic outputs (KerasTensors) with the graph's output shapes and dtypes for these inputs."""
        specs = self._graph.output_specs_for([tuple(t.shape) for t in self._as_list(inputs)])
        return one_or_list([keras.KerasTensor(tuple(spec.shape), dtype=spec.dtype.name) for spec in specs])

    def compute_output_shape(self, input_shape: Any) -> Any:
        """The graph's output shapes for inputs of ``input_shape`` (a list of shapes for several)."""
        shapes = [input_shape] if len(self.input_names) == 1 else list(input_shape)
        return one_or_list([tuple(spec.shape) for spec in self._graph.output_specs_for(shapes)])

    def get_config(self) -> Dict[str, Any]:
        """Keras config: the layer's config plus the graph (base64) and tensor names."""
        config = super().get_config()
        config.pop("autocast", None)
        config.update(
            graph_def=base64.b64encode(self._graph.graph_bytes).decode("ascii"),
            input_names=self.input_names,
            output_names=self.output_names,
        )
        return config

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "TFNet":
        """Rebuild a TFNet from :meth:`get_config` output."""
        config = dict(config)
        config["graph_def"] = base64.b64decode(config["graph_def"])
        return cls(**config)

    def __reduce__(self):
        return (_restore, (self._graph.graph_bytes, self.input_names, self.output_names, self.name))

    # ---------------------------------------------------------- inference
    def forward(self, x: Arrays) -> Arrays:
        """Run the graph once on NumPy input(s).

        Parameters
        ----------
        x : ndarray or list of ndarray
            One array per graph input (any array-like; it is cast to the
            input's dtype and made contiguous).

        Returns
        -------
        ndarray or list of ndarray
            One array per output; a bare array when there is one output.
        """
        return one_or_list(self._graph.run(self._as_list(x)))

    def predict(self, x: Any, batch_per_thread: int = 32, distributed: Optional[bool] = None) -> Any:
        """Run the graph over many records.

        Parameters
        ----------
        x : ndarray, list of ndarray, RDD or TFDataset
            Arrays (one per input, records along axis 0), an RDD of records
            (each an array, or a list of arrays for several inputs) or a
            TFDataset whose first feature leaves feed the graph's inputs.
        batch_per_thread : int
            Records per graph run (per partition when distributed). A
            TFDataset's own ``batch_per_thread`` / ``batch_size`` wins.
        distributed : bool, optional
            Arrays run locally unless True; then they are split into
            ``sc.defaultParallelism`` contiguous partitions and run on Spark.
            RDDs and TFDatasets always run on Spark.

        Returns
        -------
        ndarray, list of ndarray, or RDD
            For arrays run locally: the outputs for all records, like
            :meth:`forward`. Otherwise (an RDD, a TFDataset, or arrays with
            ``distributed=True``): an RDD with one element per record in
            input order (and, for an RDD or TFDataset, its partitioning) -
            an ndarray, or a list of them when the graph has several
            outputs.

        Raises
        ------
        DataError
            For the wrong number of inputs, a shape that does not fit the
            graph, or rank-0 inputs with ``distributed=True``; on Spark, a
            batch the graph rejects raises it when an action computes the
            RDD (or one derived from it by a narrow transformation), naming
            the partition and records.
        """
        is_int = isinstance(batch_per_thread, (int, np.integer)) and not isinstance(batch_per_thread, bool)
        if not is_int or batch_per_thread <= 0:
            raise DataError(f"batch_per_thread must be a positive integer, got {batch_per_thread!r}.")
        from pyspark import RDD

        from sparktf.dataset import TFDataset

        if isinstance(x, RDD):
            return self._predict_rdd(x, batch_per_thread)
        if isinstance(x, TFDataset):
            return self._predict_dataset(x, batch_per_thread)
        arrays = [np.asarray(a) for a in self._as_list(x)]
        if distributed:
            return self._predict_arrays_on_spark(arrays, batch_per_thread)
        return self._predict_arrays(arrays, batch_per_thread)

    def _predict_arrays(self, arrays: List[np.ndarray], batch: int) -> Arrays:
        count = _record_count(arrays)
        if count is None or count <= batch:
            return self.forward(arrays)
        pieces = [self._graph.run([a[start : start + batch] for a in arrays]) for start in range(0, count, batch)]
        return one_or_list([np.concatenate(parts) for parts in zip(*pieces)])

    def _predict_arrays_on_spark(self, arrays: List[np.ndarray], batch: int):
        """The per-record outputs of ``arrays``, computed on Spark: an RDD of contiguous, ordered partitions."""
        count = _record_count(arrays)
        if count is None:
            raise DataError(
                "distributed=True needs arrays with a record axis (axis 0), got a rank-0 input; "
                "call predict without distributed=True (or forward) for a single scalar input."
            )
        kind = current_session()
        sc = kind.spark_context("TFNet.predict(distributed=True)",
                                "Call predict without distributed=True: it runs the graph in this process.")
        columns = self._graph.as_graph_inputs(arrays)
        bounds = balanced_bounds(count, sc.defaultParallelism)
        blocks = [slice_block(columns, lo, hi) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]
        return self._run_blocks(kind, sc.parallelize(blocks, max(len(blocks), 1)), batch)

    def _predict_rdd(self, rdd, batch: int):
        record_shapes = [spec.shape[1:] for spec in self._graph.input_specs]
        to_blocks = functools.partial(
            record_blocks,
            dtypes=[spec.dtype.name for spec in self._graph.input_specs],
            shapes=[shape.as_list() if shape.rank is not None else None for shape in record_shapes],
        )
        kind = current_session()
        return self._run_blocks(kind, rdd.mapPartitionsWithIndex(reporting_failures(kind, to_blocks)), batch)

    def _predict_dataset(self, dataset, batch: int):
        from sparktf.data.specs import flatten

        num_features = len(flatten(dataset.feature_spec))
        if num_features != len(self.input_names):
            raise DataError(
                f"The dataset has {num_features} feature tensor(s) but the graph takes "
                f"{len(self.input_names)} input(s) ({', '.join(self.input_names)}). "
                "Give the dataset one feature per graph input, in that order."
            )
        if dataset.batch_per_thread > 0 or dataset.batch_size > 0:
            batch = dataset.inference_batch_size(dataset.block_rdd.context.defaultParallelism)
        return self._run_blocks(dataset.blocks.kind, dataset.block_rdd, batch)

    def _run_blocks(self, kind, block_rdd, batch: int):
        """The per-record outputs of an RDD of Blocks whose first leaves feed the graph."""
        run = functools.partial(
            predict_partition,
            graph_broadcast=block_rdd.context.broadcast(self._graph),
            graph_key=self._graph.key,
            batch=batch,
            num_inputs=len(self.input_names),
            gpus=gpu_plan(block_rdd.context.getConf()),
        )
        return raising_sparktf_errors(kind, block_rdd, run, preservesPartitioning=True)


def _record_count(arrays: List[np.ndarray]) -> Optional[int]:
    """The common leading dimension of ``arrays``; None for scalar (rank-0) inputs."""
    if any(a.ndim == 0 for a in arrays):
        return None
    counts = {len(a) for a in arrays}
    if len(counts) != 1:
        raise DataError(
            f"All inputs must hold the same number of records (axis 0), got {[len(a) for a in arrays]}."
        )
    return counts.pop()
