"""How a batch of leaf arrays becomes a model's input.

The driver describes each model input (:class:`TensorInfo`) and matches the
dataset's leaves to them (:func:`plan_feed`); the resulting :class:`Feed`
travels to the executors and packs every batch in the model's own input
nesting.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from sparktf.data import specs
from sparktf.data.sparse import SparseColumn, fed_value
from sparktf.errors import DataError

__all__ = ["SINGLE", "LIST", "DICT", "TensorInfo", "Feed", "plan_feed", "cast_to", "keras_feed", "keras_inputs", "feature_leaves"]

# Output kinds: one array per record, a list of arrays, or a dict name -> array.
SINGLE, LIST, DICT = "single", "list", "dict"


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
    sparse : bool
        Whether the input takes a ``tf.SparseTensor`` (``keras.Input(sparse=True)``).
    """

    name: str
    dtype: np.dtype
    shape: Tuple[Optional[int], ...]
    sparse: bool = False

    @classmethod
    def from_tensor(cls, name: str, tensor: Any) -> "TensorInfo":
        """From a ``tf.TensorSpec`` (``tf.SparseTensorSpec``) or a ``KerasTensor`` with a batch dimension."""
        import tensorflow as tf

        dtype = np.dtype(tf.as_dtype(tensor.dtype).as_numpy_dtype)
        shape = tuple(tf.TensorShape(tensor.shape).as_list()[1:])
        sparse = isinstance(tensor, tf.SparseTensorSpec) or bool(getattr(tensor, "sparse", False))
        return cls(name, dtype, shape, sparse)

    def describe(self) -> str:
        return f"{self.name!r} {specs.dtype_name(self.dtype)} {list(self.shape)}"

    def accepts(self, leaf: specs.LeafSpec) -> bool:
        """Whether records of ``leaf`` fit this input (numbers are cast, strings must be strings)."""
        same_rank = len(leaf.shape) == len(self.shape)
        dims_fit = same_rank and all(want in (None, got) for want, got in zip(self.shape, leaf.shape))
        return dims_fit and (leaf.is_string == (self.dtype == np.dtype(object)))


@dataclass(frozen=True)
class Feed:
    """How leaf arrays become the model's input: which leaf goes to which input.

    ``order[i]`` is the index of the leaf that feeds ``inputs[i]``;
    ``structure`` is the model's input nesting (``SINGLE``, ``LIST`` or ``DICT``);
    ``declared`` is False when the inputs are the data's own (a subclassed
    model declares none).
    """

    inputs: Tuple[TensorInfo, ...]
    structure: str
    order: Tuple[int, ...]
    declared: bool = True

    def pack(self, leaves: Sequence[np.ndarray]) -> Any:
        """The model's input for a batch of leaf arrays (numbers cast to the inputs' dtypes).

        A sparse leaf (:class:`~sparktf.data.sparse.SparseColumn`) becomes a
        ``tf.SparseTensor`` for a sparse input, a dense array for a dense one;
        a dense leaf of a sparse input a ``tf.SparseTensor``.
        """
        return self.structured([as_input(leaves[i], info) for i, info in zip(self.order, self.inputs)])

    def structured(self, values: List[Any]) -> Any:
        """``values`` (one per input, in input order) in the model's input nesting."""
        if self.structure == SINGLE:
            return values[0]
        if self.structure == DICT:
            return {info.name: value for info, value in zip(self.inputs, values)}
        return values

    def expected(self) -> str:
        if not self.declared:
            return "the inputs its call() takes (a subclassed model declares none; see its own message)"
        return "[" + ", ".join(info.describe() for info in self.inputs) + "]"


def cast_to(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype == np.dtype(object) or array.dtype == dtype:
        return array
    return array.astype(dtype)


def as_input(leaf: Any, info: TensorInfo) -> Any:
    """One leaf of a batch as input ``info`` takes it: cast to its dtype, sparse or dense as it is."""
    if isinstance(leaf, SparseColumn) or info.sparse:
        return fed_value(leaf, info.sparse, info.dtype)
    return cast_to(leaf, info.dtype)


def plan_feed(
    inputs: Sequence[TensorInfo], structure: str, leaves: Sequence[specs.LeafSpec], names: Optional[Sequence[str]]
) -> Feed:
    """Match data leaves to model inputs by name when all names match, else by position.

    Raises
    ------
    DataError
        On a different number of inputs, or a leaf whose shape or kind
        (string vs number) does not fit its input; the message lists the
        model's expected inputs.
    """
    feed = Feed(tuple(inputs), structure, tuple(range(len(leaves))))
    if len(leaves) != len(inputs):
        got = ", ".join(f"{leaf.path} {leaf.dtype_name} {list(leaf.shape)}" for leaf in leaves)
        raise DataError(
            f"the model takes {len(inputs)} input(s) {feed.expected()} but the data has "
            f"{len(leaves)} feature(s) [{got}]. Give one feature per model input."
        )
    if names is not None and set(names) == {info.name for info in inputs}:
        feed = Feed(feed.inputs, structure, tuple(list(names).index(info.name) for info in inputs))
    for info, index in zip(inputs, feed.order):
        leaf = leaves[index]
        if not info.accepts(leaf):
            raise DataError(
                f"feature {leaf.path} ({leaf.dtype_name} of shape {list(leaf.shape)} per record) does "
                f"not fit model input {info.describe()}; the model expects {feed.expected()} per "
                "record. Reshape or cast the data, or create the TFDataset with the model's input spec."
            )
    return feed


def keras_feed(model: Any, leaves: Sequence[specs.LeafSpec], names: Optional[Sequence[str]]) -> Feed:
    """How the data's feature leaves feed a Keras model (see :func:`plan_feed`).

    A subclassed model without declared inputs is fed the data's own structure.

    Raises
    ------
    DataError
        When the leaves do not fit the model's declared inputs.
    """
    declared = keras_inputs(model)
    if declared is None:
        inputs = [TensorInfo(name, leaf.dtype, leaf.shape, leaf.sparse) for name, leaf in zip(names or [leaf.path for leaf in leaves], leaves)]
        structure = SINGLE if len(leaves) == 1 else DICT if names is not None else LIST
        return dataclasses.replace(plan_feed(inputs, structure, leaves, names), declared=False)
    return plan_feed(declared[0], declared[1], leaves, names)


def keras_inputs(model: Any) -> Optional[Tuple[List[TensorInfo], str]]:
    """A Keras model's declared inputs and their nesting, or ``None`` for a subclassed model."""
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


def feature_leaves(feature_spec: Any) -> Tuple[List[specs.LeafSpec], Optional[List[str]]]:
    """A dataset's feature leaves, and their names when the features are a dict (for :func:`plan_feed`)."""
    names = sorted(feature_spec) if isinstance(feature_spec, dict) else None
    return specs.leaf_specs(feature_spec, "features"), names
