"""specs: parsing (dtype, shape) structures, tf.nest-compatible flatten / pack."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from sparktf.data import specs
from sparktf.errors import DataError


@pytest.mark.parametrize(
    "spec, expected",
    [
        ((tf.float32, [28, 28, 1]), tf.TensorSpec([28, 28, 1], tf.float32)),
        (("int32", []), tf.TensorSpec([], tf.int32)),
        ((np.uint8, (3,)), tf.TensorSpec([3], tf.uint8)),
        (("string", []), tf.TensorSpec([], tf.string)),
        ((tf.float16, tf.TensorShape([2, 2])), tf.TensorSpec([2, 2], tf.float16)),
        (tf.TensorSpec([4], tf.int64), tf.TensorSpec([4], tf.int64)),
    ],
)
def test_parse_single_spec(spec, expected):
    assert specs.parse_spec(spec) == expected


def test_parse_nested_structures_keep_their_type():
    parsed = specs.parse_spec(
        {"image": (tf.float32, [2, 2]), "meta": [("int32", []), ("float32", [3])], "pair": (("bool", []), ("int8", [1]))}
    )
    assert parsed["image"] == tf.TensorSpec([2, 2], tf.float32)
    assert parsed["meta"] == [tf.TensorSpec([], tf.int32), tf.TensorSpec([3], tf.float32)]
    assert parsed["pair"] == (tf.TensorSpec([], tf.bool), tf.TensorSpec([1], tf.int8))


@pytest.mark.parametrize(
    "bad, fragment",
    [
        ("float32", "features: 'float32' is not a spec"),
        ([(tf.float32, [2]), 5], "features[1]: 5 is not a spec"),
        ((tf.float32, [None, 3]), "unknown dimension"),
        ({1: (tf.float32, [])}, "dict keys must be strings"),
        ([], "is not a spec"),
    ],
)
def test_parse_spec_rejects_bad_specs_naming_the_place(bad, fragment):
    with pytest.raises(DataError, match=None) as info:
        specs.parse_spec(bad, "features")
    assert fragment in str(info.value)


def test_flatten_and_pack_follow_tf_nest_order():
    point = collections.namedtuple("Point", "x y")
    structure = {"b": [1, (2, 3)], "a": point(4, {"z": 5, "c": 6}), "c": 7}
    assert specs.flatten(structure) == tf.nest.flatten(structure)
    leaves = [f"leaf{i}" for i in range(7)]
    packed = specs.pack(structure, leaves)
    assert packed == tf.nest.pack_sequence_as(structure, leaves)
    assert list(packed) == ["b", "a", "c"] and isinstance(packed["a"], point)


def test_pack_rejects_a_wrong_number_of_leaves():
    with pytest.raises(DataError, match="3 leaves into a structure with 2"):
        specs.pack([1, 2], [1, 2, 3])


def test_flatten_like_returns_value_leaves_and_names_mismatches():
    structure = {"x": 0, "y": [0, 0]}
    assert specs.flatten_like(structure, {"y": ([1], 2), "x": "a"}, "features") == ["a", [1], 2]
    with pytest.raises(DataError, match=r"features has keys \['x'\]; missing \['y'\], unexpected \[\]"):
        specs.flatten_like(structure, {"x": 1}, "features")
    with pytest.raises(DataError, match=r"features\['y'\] should be a list or tuple of 2 parts, got a list of 3"):
        specs.flatten_like(structure, {"x": 1, "y": [1, 2, 3]}, "features")
    with pytest.raises(DataError, match="features should be a dict with keys"):
        specs.flatten_like(structure, np.zeros(3), "features")


def test_leaf_specs_are_tensorflow_free_descriptions():
    leaves = specs.leaf_specs({"t": tf.TensorSpec([], tf.string), "i": tf.TensorSpec([2, 3], tf.float32)}, "features")
    assert [leaf.path for leaf in leaves] == ["features['i']", "features['t']"]
    assert leaves[0].dtype == np.float32 and leaves[0].shape == (2, 3) and leaves[0].record_nbytes == 24
    assert leaves[1].is_string and leaves[1].dtype_name == "string" and leaves[1].shape == ()


def test_a_sparse_spec_is_a_sparse_leaf_estimated_by_its_non_zeros():
    parsed = specs.parse_spec(("float64", [1 << 18], "sparse"), "features")
    assert parsed == tf.SparseTensorSpec([1 << 18], tf.float64) == specs.parse_spec(parsed)
    (leaf,) = specs.leaf_specs(parsed, "features")
    assert leaf.sparse and leaf.shape == (1 << 18,) and leaf.record_nbytes == 8 + 12 * 64  # 64 non-zeros assumed


def test_element_structure():
    assert specs.element_structure("f") == ("f",)
    assert specs.element_structure("f", "l") == ("f", "l")
