"""Specs: parsing ``(dtype, shape)`` into ``tf.TensorSpec`` structures, and nests.

A *spec structure* is what the user gives for ``features`` or ``labels``: one
spec, a list/tuple of specs or a dict name -> spec. :func:`parse_spec` turns it
into the same structure of ``tf.TensorSpec`` (the shape of ONE record).

:func:`flatten` and :func:`pack` follow ``tf.nest`` order (lists and tuples in
order, dicts by sorted key) but need no TensorFlow, so the executor-side data
code that uses them (:mod:`sparktf.data.columnar`) never pays for importing it.
:class:`LeafSpec` is the TensorFlow-free description of one leaf that travels
to the executors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, List, Sequence, Tuple

import numpy as np

from sparktf.errors import DataError

__all__ = [
    "LeafSpec",
    "parse_spec",
    "element_structure",
    "flatten",
    "flatten_like",
    "pack",
    "flatten_with_paths",
    "leaf_specs",
    "describe",
    "dtype_name",
]

_SPEC_HELP = (
    "A spec is (dtype, shape), e.g. (tf.float32, [28, 28, 1]) or ('int32', []), "
    "or a tf.TensorSpec; several specs go in a list, a tuple or a dict name -> spec."
)


def dtype_name(dtype: np.dtype) -> str:
    """A NumPy dtype as users write it: its name, ``"string"`` for ``object`` (``tf.string`` values)."""
    return "string" if dtype == np.dtype(object) else dtype.name


@dataclass(frozen=True)
class LeafSpec:
    """One leaf of a dataset element, described without TensorFlow.

    Attributes
    ----------
    path : str
        Where the leaf sits, e.g. ``"features"``, ``"features[1]"`` or
        ``"labels['y']"``; used in error messages.
    dtype : numpy.dtype
        The NumPy dtype of the leaf's arrays; ``object`` (arrays of ``bytes``)
        for ``tf.string``.
    shape : tuple of int
        The shape of one record's value.
    sparse : bool
        Whether the leaf's Blocks hold a
        :class:`~sparktf.data.sparse.SparseColumn` (indices and values of
        each record) instead of an ndarray (a ``tf.SparseTensorSpec``).
    """

    path: str
    dtype: np.dtype
    shape: Tuple[int, ...]
    sparse: bool = False

    @property
    def is_string(self) -> bool:
        """Whether the leaf is a ``tf.string`` (NumPy ``object`` arrays of ``bytes``)."""
        return self.dtype == np.dtype(object)

    @property
    def dtype_name(self) -> str:
        """The dtype as users write it, ``"string"`` for ``tf.string``."""
        return dtype_name(self.dtype)

    @property
    def record_nbytes(self) -> int:
        """Bytes of one record's value (64 per element is assumed for strings, 64 non-zeros for a sparse leaf)."""
        if self.sparse:
            return 8 + (4 + self.dtype.itemsize) * min(64, int(np.prod(self.shape, dtype=np.int64)))
        itemsize = 64 if self.is_string else self.dtype.itemsize
        return itemsize * int(np.prod(self.shape, dtype=np.int64))


def parse_spec(obj: Any, path: str = "spec"):
    """Parse a spec structure into the same structure of ``tf.TensorSpec``.

    Parameters
    ----------
    obj : spec structure
        ``(dtype, shape)``, a ``tf.TensorSpec``, or a list / tuple / dict of
        them (nested). ``dtype`` is anything ``tf.as_dtype`` accepts
        (``tf.float32``, ``"int32"``, ``np.uint8``, ``"string"``); ``shape`` is a
        list or tuple of ints (``[]`` for a scalar) or a ``tf.TensorShape``.
        ``(dtype, shape, "sparse")`` or a ``tf.SparseTensorSpec`` is a sparse
        leaf (``from_dataframe`` gives one to a ``SparseVector`` column).
    path : str
        Name of ``obj`` in error messages, e.g. ``"features"``.

    Returns
    -------
    structure of tf.TensorSpec

    Raises
    ------
    DataError
        If ``obj`` is not a spec structure or a shape is not fully known.
    """
    import tensorflow as tf  # imported here: the rest of this module runs on executors without it

    if isinstance(obj, tf.TensorSpec):
        return _checked_spec(obj.shape, obj.dtype, path)
    if isinstance(obj, tf.SparseTensorSpec):
        dense = _checked_spec(obj.shape, obj.dtype, path)
        return tf.SparseTensorSpec(dense.shape, dense.dtype)
    if isinstance(obj, tuple) and len(obj) == 3 and isinstance(obj[2], str) and obj[2] == "sparse":
        dense = parse_spec(obj[:2], path)
        return tf.SparseTensorSpec(dense.shape, dense.dtype)
    if _is_single_spec(obj):
        return _checked_spec(obj[1], tf.as_dtype(obj[0]), path)
    if isinstance(obj, dict):
        for key in obj:
            if not isinstance(key, str):
                raise DataError(f"{path}: dict keys must be strings, got {key!r}. {_SPEC_HELP}")
        return {key: parse_spec(value, f"{path}[{key!r}]") for key, value in obj.items()}
    if isinstance(obj, (list, tuple)) and obj:
        parsed = [parse_spec(value, f"{path}[{i}]") for i, value in enumerate(obj)]
        return _same_sequence_type(obj, parsed)
    raise DataError(f"{path}: {obj!r} is not a spec. {_SPEC_HELP}")


def _is_single_spec(obj: Any) -> bool:
    if not (isinstance(obj, tuple) and len(obj) == 2):
        return False
    import tensorflow as tf

    dtype, shape = obj
    if isinstance(dtype, (list, tuple, dict)):
        return False
    try:
        tf.as_dtype(dtype)
    except TypeError:
        return False
    return isinstance(shape, tf.TensorShape) or (
        isinstance(shape, (list, tuple)) and all(d is None or isinstance(d, (int, np.integer)) for d in shape)
    )


def _checked_spec(shape, dtype, path: str):
    import tensorflow as tf

    shape = tf.TensorShape(shape)
    if not shape.is_fully_defined():
        raise DataError(
            f"{path}: shape {shape} has an unknown dimension. Every record of a dataset has the "
            "same shape: give every dimension (reshape or pad the records if they differ)."
        )
    if any(d < 0 for d in shape.as_list()):
        raise DataError(f"{path}: shape {shape.as_list()} has a negative dimension.")
    return tf.TensorSpec(shape, dtype)


def element_structure(feature_spec, label_spec=None, weight_spec=None) -> tuple:
    """The element structure of a dataset: ``(features, labels)``, ``(features,)`` without labels, or
    ``(features, labels, sample_weight)`` with sample weights."""
    if label_spec is None:
        return (feature_spec,)
    return (feature_spec, label_spec) if weight_spec is None else (feature_spec, label_spec, weight_spec)


def flatten(structure) -> list:
    """The leaves of a nested list / tuple / dict structure, in ``tf.nest`` order."""
    return [leaf for _, leaf, _ in _walk(structure, structure, "")]


def flatten_like(structure, value, path: str) -> list:
    """The leaves of ``value``, which must nest like ``structure``.

    Parameters
    ----------
    structure : nested structure
        The reference nesting (e.g. a spec structure); its leaves say where
        ``value`` may hold anything (an array, a list of numbers, a scalar).
    value : nested structure
        A record or a part of one. Any list or tuple matches a list or tuple
        of ``structure``; a dict must have exactly the same keys.
    path : str
        Name of ``value`` in error messages.

    Raises
    ------
    DataError
        Naming the first place where ``value`` does not nest like ``structure``.
    """
    return [leaf for _, _, leaf in _walk(structure, value, path)]


def pack(structure, leaves: Sequence):
    """Build ``structure``'s nesting with ``leaves`` (in ``tf.nest`` order) at its leaves."""
    leaves = list(leaves)
    count = len(flatten(structure))
    if count != len(leaves):
        raise DataError(f"cannot pack {len(leaves)} leaves into a structure with {count} leaves")
    return _pack(structure, iter(leaves))


def flatten_with_paths(structure, path: str) -> List[Tuple[str, Any]]:
    """``(path, leaf)`` pairs of ``structure`` in ``tf.nest`` order, e.g. ``("features[0]", leaf)``."""
    return [(leaf_path, leaf) for leaf_path, leaf, _ in _walk(structure, structure, path)]


def leaf_specs(structure, path: str) -> list:
    """:class:`LeafSpec` of every ``tf.TensorSpec`` (or ``tf.SparseTensorSpec``) leaf of ``structure``, named from ``path``."""
    return [
        LeafSpec(leaf_path, np.dtype(spec.dtype.as_numpy_dtype), tuple(spec.shape.as_list()),
                 type(spec).__name__ == "SparseTensorSpec")
        for leaf_path, spec in flatten_with_paths(structure, path)
    ]


def _walk(structure, value, path: str) -> Iterator[Tuple[str, Any, Any]]:
    """Yield ``(path, structure leaf, value leaf)`` in ``tf.nest`` order."""
    if isinstance(structure, dict):
        if not isinstance(value, dict):
            raise DataError(f"{path} should be a dict with keys {sorted(structure)}, got {describe(value)}")
        if set(value) != set(structure):
            missing = sorted(set(structure) - set(value), key=str)
            extra = sorted(set(value) - set(structure), key=str)
            raise DataError(f"{path} has keys {sorted(value, key=str)}; missing {missing}, unexpected {extra}")
        for key in sorted(structure):
            yield from _walk(structure[key], value[key], f"{path}[{key!r}]")
    elif isinstance(structure, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(structure):
            raise DataError(f"{path} should be a list or tuple of {len(structure)} parts, got {describe(value)}")
        for i, (sub_structure, sub_value) in enumerate(zip(structure, value)):
            yield from _walk(sub_structure, sub_value, f"{path}[{i}]")
    else:
        yield path, structure, value


def _pack(structure, leaves: Iterator):
    if isinstance(structure, dict):
        packed = {key: _pack(structure[key], leaves) for key in sorted(structure)}
        return {key: packed[key] for key in structure}
    if isinstance(structure, (list, tuple)):
        return _same_sequence_type(structure, [_pack(sub, leaves) for sub in structure])
    return next(leaves)


def _same_sequence_type(template, items: List):
    if isinstance(template, list):
        return items
    if hasattr(template, "_fields"):  # namedtuple
        return type(template)(*items)
    return type(template)(items)


def describe(value: Any) -> str:
    """A short description of ``value`` for error messages."""
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape}"
    return f"{type(value).__name__} {value!r}"[:120]

