"""Sample and class weights without Spark: class weights as Keras' fit reads labels, the weight checks, the
record format with a weight leaf, and the errors that name the bad input."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.trainers.data_adapters.data_adapter_utils import class_weight_to_sample_weights

from sparktf.data.columnar import RecordFormat
from sparktf.data.tfrecord_io import trace_parse_fn
from sparktf.data.sample_weights import WeightChecked, weight_column, weight_spec
from sparktf.errors import DataError
from sparktf.training.worker.class_weights import batch_parts, class_weights

CLASS_WEIGHT = {0: 0.5, 1: 2.0, 2: 3.0}


def one_output_model():
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])


@pytest.mark.parametrize("labels", [
    np.array([2, 0, 1, 1], np.int32),                       # class indices
    np.array([[2.0], [0.0], [1.0], [0.9]], np.float32),     # shape [1], rounded as Keras does
    np.eye(3, dtype=np.float32)[[2, 0, 1, 1]],              # one-hot rows: argmax
])
def test_class_weights_equal_keras_fits_and_multiply_sample_weights(labels):
    table = class_weights(CLASS_WEIGHT, one_output_model(), tf.TensorSpec(labels.shape[1:], tf.as_dtype(labels.dtype)))
    expected = class_weight_to_sample_weights(labels, CLASS_WEIGHT)
    np.testing.assert_allclose(table.sample_weights(labels), expected)
    sample_weight = np.array([1.0, 0.0, 2.0, 4.0], np.float32)
    np.testing.assert_allclose(table.sample_weights(labels, sample_weight), expected * sample_weight)


def test_batch_parts_fold_class_weights_into_the_sample_weights():
    structure = (tf.TensorSpec([2], tf.float32), tf.TensorSpec([], tf.int32), weight_spec())
    x, y, w = np.zeros((3, 2), np.float32), np.array([0, 1, 2]), np.array([1.0, 2.0, 0.5], np.float32)
    features, labels, sample_weight = batch_parts(structure, [x, y, w])
    assert features is x and labels is y and sample_weight is w
    table = class_weights(CLASS_WEIGHT, one_output_model(), structure[1])
    np.testing.assert_allclose(batch_parts(structure, [x, y, w], table)[2], [0.5, 4.0, 1.5])
    np.testing.assert_allclose(batch_parts(structure[:2], [x, y], table)[2], [0.5, 2.0, 3.0])
    assert batch_parts(structure[:1], [x]) == (x, None, None)


def test_class_weight_errors_name_the_problem():
    model, labels = one_output_model(), tf.TensorSpec([], tf.int32)
    for bad, message in [([0.5, 2.0], "must be a non-empty dict"), ({}, "must be a non-empty dict"),
                         ({"cat": 1.0}, "key 'cat' is not a class index"), ({-1: 1.0}, "key -1 is not"),
                         ({0: -1.0}, r"class_weight\[0\]: class weight -1.0 is negative"),
                        ({0: float("nan")}, "class weight nan is not finite; every class weight must be a finite"),
                        ({0: "2"}, r"class_weight\[0\] = '2': a class weight is a finite number")]:
        with pytest.raises(DataError, match=message):
            class_weights(bad, model, labels)
    inputs = keras.Input((2,))
    two_outputs = keras.Model(inputs, [keras.layers.Dense(1)(inputs), keras.layers.Dense(1)(inputs)])
    with pytest.raises(DataError, match="single output .* has 2 outputs"):
        class_weights(CLASS_WEIGHT, two_outputs, [labels, labels])
    with pytest.raises(DataError, match="needs labels"):
        class_weights(CLASS_WEIGHT, model, None)
    for spec in (tf.TensorSpec([], tf.string), tf.TensorSpec([4, 3], tf.float32)):
        with pytest.raises(DataError, match="one class per record"):
            class_weights(CLASS_WEIGHT, model, spec)
    table = class_weights({0: 1.0, 2: 3.0}, model, labels)
    with pytest.raises(DataError, match=r"no weight for label 1 .* classes are \[0, 2\]"):
        table.sample_weights(np.array([0, 2, 1]))
    with pytest.raises(DataError, match="no weight for label 7"):
        table.sample_weights(np.array([7]))


def test_weights_of_driver_arrays_are_checked_naming_the_record():
    np.testing.assert_array_equal(weight_column([[1], [2]], 2), np.array([1, 2], np.float32))
    with pytest.raises(DataError, match=r"sample_weight has shape \[3\], but there are 2 records"):
        weight_column([1, 2, 3], 2)
    with pytest.raises(DataError, match=r"sample_weight\[1\]: sample weight -0.5 is negative"):
        weight_column([1, -0.5, 2], 3)
    with pytest.raises(DataError, match=r"sample_weight\[2\]: sample weight inf is not finite"):
        weight_column([1, 0, np.inf], 3)


def test_records_with_weights_become_blocks_whose_weights_are_checked_by_partition_and_record():
    record_format = RecordFormat.from_specs(tf.TensorSpec([2], tf.float32), tf.TensorSpec([], tf.int32), weight_spec())
    assert record_format.has_weights and record_format.leaves[-1].path == "sample_weight"
    records = [(np.full(2, i), i % 2, float(i)) for i in range(5)]
    blocks = list(WeightChecked(record_format.to_blocks)(3, records))
    np.testing.assert_array_equal(blocks[0][2], np.arange(5, dtype=np.float32))
    second = list(record_format.to_records(blocks[0]))[1]
    assert tuple(np.asarray(v).tolist() for v in second) == ([1.0, 1.0], 1, 1.0)
    with pytest.raises(DataError, match=r"partition 3, record 4 \(0-based within the partition\): sample weight nan"):
        list(WeightChecked(record_format.to_blocks)(3, records[:4] + [(np.zeros(2), 0, float("nan"))]))
    with pytest.raises(DataError, match=r"should be \(features, labels, weight\)"):
        list(record_format.to_blocks(0, [(np.zeros(2), 0)]))


def test_a_parse_fn_of_three_outputs_gives_a_scalar_weight_spec():
    def parse(serialized):
        return tf.zeros([2]), tf.constant(1), tf.constant(0.5)

    assert trace_parse_fn(parse)[2] == tf.TensorSpec([], tf.float32)
    with pytest.raises(DataError, match="one number per record"):
        trace_parse_fn(lambda serialized: (tf.zeros([2]), tf.constant(1), tf.zeros([2])))
