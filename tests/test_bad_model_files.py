"""Bad model files and functions get a DataError naming them, not TensorFlow's raw error."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from sparktf import DataError, TFDataset, TFNet, TFPredictor


def test_a_corrupt_saved_model_pb_names_the_directory(sc, tmp_path):
    (tmp_path / "saved_model.pb").write_bytes(b"not a protocol buffer\x00\xff")
    dataset = TFDataset.from_ndarrays(np.zeros((4, 3), np.float32), batch_per_thread=2)
    with pytest.raises(DataError, match=r"cannot load the SavedModel in .*corrupt or incomplete"):
        TFPredictor.from_saved_model(str(tmp_path), dataset)
    with pytest.raises(DataError, match=str(tmp_path)):
        TFNet.from_saved_model(str(tmp_path))


def test_a_parse_fn_that_fails_while_traced_is_named(sc, tmp_path):
    path = str(tmp_path / "records.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(b"x")

    def parse_with_a_typo(serialized):
        return tf.io.parse_single_example(serialized, {"x": tf.io.FixedLenFeature([2], tf.float32)})["y"]

    with pytest.raises(DataError, match=r"parse_fn .*parse_with_a_typo failed while sparktf traced it.*KeyError"):
        TFDataset.from_tfrecord_file(path, parse_with_a_typo, batch_per_thread=2)


class TenFeatures(keras.Model):
    """A subclassed model: it declares no inputs, its first Dense layer is built for 10 features."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(2)

    def call(self, inputs):
        return self.dense(inputs)


def test_a_subclassed_model_fed_the_wrong_width_does_not_claim_to_expect_it(sc):
    model = TenFeatures()
    model(np.zeros((1, 10), np.float32))
    dataset = TFDataset.from_ndarrays(np.zeros((4, 8), np.float32), batch_per_thread=2)
    with pytest.raises(Exception) as raised:
        TFPredictor.from_keras(model, dataset).predict().collect()
    text = str(raised.value)
    assert "subclassed model declares none" in text and "records are [float32 [8]]" in text
    assert "expects ['" not in text
