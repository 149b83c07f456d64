"""A frozen TensorFlow graph with named inputs and outputs, runnable on NumPy.

A :class:`FrozenGraph` is a serialized ``GraphDef`` (variables already turned
into constants) plus the names of the tensors it is fed and fetched by. It is
run through ``tf.compat.v1.wrap_function`` + ``prune``, which gives a
``ConcreteFunction`` that works eagerly, inside ``tf.function`` and under
``tf.GradientTape`` (gradients flow to the inputs). It pickles as its bytes
and names, so it can travel to Spark executors; this module imports only
TensorFlow and NumPy so executors never load Keras for it.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Iterable, Iterator, List, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from sparktf.errors import DataError
from sparktf.spark.task_devices import GpuPlan, prepare_tensorflow_task

__all__ = ["FrozenGraph", "normalize_tensor_name", "parse_graph_def", "one_or_list", "record_blocks", "predict_partition"]

_MAX_LISTED = 20


def normalize_tensor_name(name: str) -> str:
    """Return ``name`` as a tensor name: ``"x"`` becomes ``"x:0"``."""
    if not isinstance(name, str) or not name:
        raise DataError(f"A tensor name must be a non-empty string like 'Placeholder:0', got {name!r}.")
    return name if ":" in name else name + ":0"


def parse_graph_def(graph_def: Union[tf.compat.v1.GraphDef, bytes], source: str = "The graph") -> tf.compat.v1.GraphDef:
    """Return ``graph_def`` itself, or the ``GraphDef`` its serialized bytes hold."""
    if isinstance(graph_def, tf.compat.v1.GraphDef):
        return graph_def
    if not isinstance(graph_def, (bytes, bytearray)):
        raise DataError(f"Expected a tf.compat.v1.GraphDef or its serialized bytes, got {type(graph_def).__name__}.")
    try:
        return tf.compat.v1.GraphDef.FromString(bytes(graph_def))
    except Exception as err:  # protobuf raises its own DecodeError
        raise DataError(f"{source} is not a binary GraphDef ({err}). Pass a frozen graph (.pb).") from None


def one_or_list(items: list):
    """The only item of ``items``, or the list itself when there are several."""
    return items[0] if len(items) == 1 else items


def _listing(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_MAX_LISTED])
    more = len(names) - _MAX_LISTED
    return shown + (f", ... ({more} more)" if more > 0 else "") if names else "(none)"


class FrozenGraph:
    """A frozen ``GraphDef`` fed by ``input_names`` and fetched at ``output_names``.

    Parameters
    ----------
    graph_def : tf.compat.v1.GraphDef or bytes
        The graph, with every variable frozen into a constant.
    input_names, output_names : sequence of str
        Tensor names such as ``"Placeholder:0"`` (``"Placeholder"`` means
        output 0 of that node). Their order is the order of the arrays that
        :meth:`run` takes and returns.

    Raises
    ------
    DataError
        When a name is not a node of the graph; the message lists the
        graph's placeholders (for inputs) or its unconsumed nodes (for
        outputs). A bad output index (``"node:7"``) is found when the graph
        is first imported (on first use).
    """

    def __init__(
        self,
        graph_def: Union[tf.compat.v1.GraphDef, bytes],
        input_names: Sequence[str],
        output_names: Sequence[str],
    ) -> None:
        self.graph_def = parse_graph_def(graph_def)
        if isinstance(input_names, str) or isinstance(output_names, str):
            raise DataError("input_names and output_names must be lists of tensor names, not a single string.")
        self.input_names = [normalize_tensor_name(n) for n in input_names]
        self.output_names = [normalize_tensor_name(n) for n in output_names]
        if not self.output_names:
            raise DataError("A frozen graph needs at least one output tensor name; got an empty list.")
        nodes = {node.name for node in self.graph_def.node}
        for role, names in (("input", self.input_names), ("output", self.output_names)):
            for name in names:
                if name.rsplit(":", 1)[0] not in nodes:
                    raise self._unknown_tensor(name, role, "no such node")
        self._function = None  # built on first use: importing a large graph takes a while

    @property
    def graph_bytes(self) -> bytes:
        """The serialized ``GraphDef``."""
        return self.graph_def.SerializeToString(deterministic=True)

    @property
    def key(self) -> str:
        """A content hash of the graph and its input/output names (a per-process cache key)."""
        digest = hashlib.sha256(self.graph_bytes)
        digest.update(repr((self.input_names, self.output_names)).encode())
        return "frozen-graph-" + digest.hexdigest()

    @property
    def function(self):
        """The ``ConcreteFunction`` from the input tensors to the output tensors."""
        if self._function is None:
            self._function = self._build_function()
        return self._function

    @property
    def input_specs(self) -> List[tf.TensorSpec]:
        """One ``tf.TensorSpec`` per input (batch dimension included)."""
        return [tf.TensorSpec(t.shape, t.dtype, n) for t, n in zip(self.function.inputs, self.input_names)]

    @property
    def output_specs(self) -> List[tf.TensorSpec]:
        """One ``tf.TensorSpec`` per output (batch dimension included)."""
        outputs = tf.nest.flatten(self.function.structured_outputs)
        return [tf.TensorSpec(t.shape, t.dtype, n) for t, n in zip(outputs, self.output_names)]

    def _build_function(self):
        graph_def = self.graph_def

        def import_graph():
            tf.compat.v1.import_graph_def(graph_def, name="")

        wrapped = tf.compat.v1.wrap_function(import_graph, [])
        graph = wrapped.graph
        feeds = [self._lookup(graph, name, "input") for name in self.input_names]
        fetches = [self._lookup(graph, name, "output") for name in self.output_names]
        return wrapped.prune(feeds=feeds, fetches=fetches)

    def _lookup(self, graph: tf.Graph, name: str, role: str) -> tf.Tensor:
        try:
            return graph.as_graph_element(name, allow_tensor=True, allow_operation=False)
        except (KeyError, ValueError) as err:
            raise self._unknown_tensor(name, role, str(err)) from None

    def _unknown_tensor(self, name: str, role: str, reason: str) -> DataError:
        nodes = self.graph_def.node
        if role == "input":
            known = [node.name + ":0" for node in nodes if node.op == "Placeholder"]
            what = "placeholders"
        else:
            consumed = {source.lstrip("^").split(":")[0] for node in nodes for source in node.input}
            known = [node.name + ":0" for node in nodes if node.name not in consumed and node.op != "NoOp"]
            what = "tensors nothing else consumes (likely outputs)"
        return DataError(
            f"Unknown {role} tensor {name!r} ({reason}). The graph's {what}: {_listing(known)}. "
            f"Pass {role} names from that list, written like 'name:0'."
        )

    def expected(self) -> str:
        """The inputs per record, as error messages show them: ``"['x:0' float32 [4]]"``."""
        described = []
        for spec in self.input_specs:
            record_shape = spec.shape[1:].as_list() if spec.shape.rank else "any"
            dtype = "string" if spec.dtype == tf.string else spec.dtype.name
            described.append(f"{spec.name!r} {dtype} {record_shape}")
        return "[" + ", ".join(described) + "]"

    def check_inputs(self, arrays: Sequence) -> None:
        """Raise ``DataError`` unless ``arrays`` has one entry per graph input."""
        if len(arrays) != len(self.input_names):
            raise DataError(
                f"The graph takes {len(self.input_names)} input(s) ({', '.join(self.input_names)}) "
                f"but got {len(arrays)}. Pass one array/tensor per input, in that order."
            )

    def as_graph_inputs(self, arrays: Sequence) -> List[np.ndarray]:
        """Cast NumPy-like ``arrays`` to the inputs' dtypes as C-contiguous arrays, checking shapes."""
        self.check_inputs(arrays)
        converted = []
        for value, spec in zip(arrays, self.input_specs):
            if spec.dtype == tf.string:
                array = np.asarray(value, dtype=object)
            else:
                array = np.asarray(value, dtype=spec.dtype.as_numpy_dtype, order="C")
            converted.append(array)
            _check_shape(spec, array.shape)
        return converted

    def output_specs_for(self, input_shapes: Sequence) -> List[tf.TensorSpec]:
        """The output specs static shape inference gives for inputs of ``input_shapes``.

        Sharper than :attr:`output_specs` when the graph's own placeholders
        have unknown dimensions or rank.
        """
        self.check_inputs(input_shapes)
        with tf.Graph().as_default():
            feeds = {}
            for name, spec, shape in zip(self.input_names, self.input_specs, input_shapes):
                _check_shape(spec, shape)
                feeds[name] = tf.compat.v1.placeholder(spec.dtype, spec.shape.merge_with(shape))
            outputs = tf.compat.v1.import_graph_def(
                self.graph_def, input_map=feeds, return_elements=self.output_names, name=""
            )
        return [tf.TensorSpec(t.shape, t.dtype, n) for t, n in zip(outputs, self.output_names)]

    def run(self, arrays: Sequence) -> List[np.ndarray]:
        """Run the graph on one batch of NumPy arrays (one per input), returning one array per output."""
        outputs = self.function(*[tf.constant(a) for a in self.as_graph_inputs(arrays)])
        return [t.numpy() for t in tf.nest.flatten(outputs)]

    def __getstate__(self):
        return {"graph_bytes": self.graph_bytes, "input_names": self.input_names, "output_names": self.output_names}

    def __setstate__(self, state):
        self.graph_def = parse_graph_def(state["graph_bytes"])
        self.input_names = state["input_names"]
        self.output_names = state["output_names"]
        self._function = None


def _check_shape(spec: tf.TensorSpec, shape) -> None:
    if not spec.shape.is_compatible_with(shape):
        raise DataError(
            f"Input {spec.name!r} expects shape {spec.shape} (None = any size) but got shape "
            f"{tf.TensorShape(shape)}. Reshape the input to match."
        )


def record_blocks(
    partition: int, records: Iterable, dtypes: Sequence[str], shapes: Sequence[Optional[List[Optional[int]]]]
) -> Iterator[tuple]:
    """Blocks of one partition's records for a graph's inputs (a ``mapPartitionsWithIndex`` function).

    A record is one value, or a list of values for several inputs. ``shapes``
    are the inputs' per-record shapes; unknown sizes (``None``) are taken
    from the partition's first record, so no Spark job is needed to find them.
    """
    from sparktf.data.columnar import RecordFormat
    from sparktf.data.specs import parse_spec

    records = iter(records)
    first = next(records, None)
    if first is None:
        return
    values = [first] if len(dtypes) == 1 else list(first)
    specs = []
    for dtype, shape, value in zip(dtypes, shapes, values):
        known = shape is not None and None not in shape
        specs.append((dtype, shape if known else list(np.shape(value))))
    record_format = RecordFormat.from_specs(parse_spec(one_or_list(specs), "features"))
    yield from record_format.to_blocks(partition, itertools.chain([first], records))


def predict_partition(
    partition: int, blocks: Iterable[tuple], graph_broadcast, graph_key: str, batch: int, num_inputs: int,
    gpus: GpuPlan,
) -> Iterator[Union[np.ndarray, List[np.ndarray]]]:
    """Run a broadcast graph over one partition of Blocks, yielding one result per record.

    A ``mapPartitionsWithIndex`` function.

    Parameters
    ----------
    partition : int
        The partition's index, for error messages.
    blocks : iterable of tuple of ndarray
        The partition's Blocks (see ``docs/internals.md``); the first
        ``num_inputs`` leaves are fed to the graph in order.
    graph_broadcast : pyspark.Broadcast
        Broadcast of the :class:`FrozenGraph`.
    graph_key : str
        ``FrozenGraph.key``, for the per-process cache of
        :func:`sparktf.models.cache.cached` (a hit skips reading the broadcast).
    batch : int
        Records per graph run; the last batch may be shorter.
    num_inputs : int
        Number of graph inputs.
    gpus : GpuPlan
        The stage's GPUs (see :mod:`sparktf.spark.task_devices`).

    Yields
    ------
    ndarray or list of ndarray
        The record's output (a list when the graph has several outputs), in
        input order.

    Raises
    ------
    DataError
        When the graph rejects a batch, naming the partition, the batch's
        records, the graph's inputs and the records' dtypes and shapes.
    """
    from sparktf.models.batch_errors import rejected_batch
    from sparktf.data.batching import inference_batches
    from sparktf.models.cache import cached
    from sparktf.spark.worker_gc import frozen_after

    prepare_tensorflow_task(gpus)
    graph = cached(graph_key, frozen_after(lambda: graph_broadcast.value))
    start = 0
    for leaves in inference_batches(blocks, batch):
        try:
            outputs = graph.run(leaves[:num_inputs])
        except (ValueError, TypeError, tf.errors.InvalidArgumentError) as exc:
            raise rejected_batch(partition, start, leaves[:num_inputs], exc, "graph", graph.expected()) from exc
        start += len(leaves[0])
        for index in range(len(outputs[0])):
            rows = [out[index, ...] for out in outputs]
            yield one_or_list(rows)
