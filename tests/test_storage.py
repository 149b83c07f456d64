"""Paths as URIs in the test session: ``file://``, ``viewfs://`` (a non-file Hadoop scheme), unknown schemes."""

import os
import uuid

import numpy as np
import pytest
import tensorflow as tf

from sparktf import MaxEpoch, TFDataset, TFNet, TFOptimizer, TFPredictor, TrainSummary, ValidationSummary
from sparktf.errors import SparkTFError, StorageError
from sparktf.net import export_tf
from sparktf.storage import join, local_path, scheme_of, store_for
from sparktf.training.checkpoint import ModelState, latest_checkpoint, load_checkpoint, save_checkpoint

FEATURES = 4


def small_model(seed=0):
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def arrays(records=64):
    x = np.random.default_rng(0).normal(size=(records, FEATURES)).astype("float32")
    return x, (x.sum(axis=1) > 0).astype("int32")


def parse(serialized):
    parsed = tf.io.parse_single_example(serialized, {"x": tf.io.FixedLenFeature([FEATURES], tf.float32),
                                                     "y": tf.io.FixedLenFeature([], tf.int64)})
    return parsed["x"], tf.cast(parsed["y"], tf.int32)


def write_records(folder, files=2, per_file=32):
    os.makedirs(folder, exist_ok=True)
    x, y = arrays(files * per_file)
    for index in range(files):
        with tf.io.TFRecordWriter(os.path.join(folder, f"part-{index}.tfrecord")) as writer:
            for row, label in zip(x[index::files], y[index::files]):
                writer.write(tf.train.Example(features=tf.train.Features(feature={
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))})).SerializeToString())


def visible(folder):
    """The names in ``folder`` but Hadoop's hidden ``.crc`` checksum files."""
    return sorted(name for name in os.listdir(folder) if not name.startswith("."))


def state(iteration):
    return ModelState([np.full((3,), iteration, "float32")], [], iteration)


# ---------------------------------------------------------------- units, no Spark job


def test_schemes_and_joins():
    assert scheme_of("/tmp/x") == "" and scheme_of("C:\\data") == "" and scheme_of("S3A://b/k") == "s3a"
    assert local_path("file:///tmp/x") == "/tmp/x" and local_path("file:/tmp/x") == "/tmp/x"
    assert join("s3a://bucket/run/", "ckpt", "checkpoint-1.npz") == "s3a://bucket/run/ckpt/checkpoint-1.npz"
    assert join("/tmp/run", "ckpt") == os.path.join("/tmp/run", "ckpt")


def test_checkpoints_keep_the_newest_and_remove_a_dead_writers_leftovers(tmp_path):
    model_dir = f"file://{tmp_path}/ckpt"
    save_checkpoint(state(1), model_dir)
    leftover = tmp_path / "ckpt" / "checkpoint-2.npz.tmp-99999"  # a writer killed mid-write
    leftover.write_bytes(b"partial")
    assert latest_checkpoint(model_dir) == f"{model_dir}/checkpoint-1.npz"
    for iteration in (2, 3, 4):
        save_checkpoint(state(iteration), model_dir, keep=2)
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["checkpoint-3.npz", "checkpoint-4.npz"]
    assert load_checkpoint(latest_checkpoint(model_dir)).weights[0].tolist() == [4, 4, 4]
    with pytest.raises(SparkTFError, match="checkpoint-9.npz"):
        load_checkpoint(f"{model_dir}/checkpoint-9.npz")


def test_a_scheme_nothing_opens_fails_before_any_job_and_makes_no_folder(sc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x, y = arrays()
    dataset = TFDataset.from_ndarrays((x, y), batch_size=16)
    sc.setJobGroup("storage-unknown-scheme", "jobs this test starts")  # not the session's warm-up job
    with pytest.raises(StorageError, match=r"'nosuch'.*spark\.hadoop\.fs\.nosuch\.impl"):
        TFOptimizer.from_keras(small_model(), dataset, model_dir="nosuch://bucket/ckpt")
    with pytest.raises(StorageError, match=r"sparktf\[gcs\]"):
        TrainSummary("gcs://bucket/logs", "app")
    with pytest.raises(StorageError, match="nosuch"):
        TFDataset.from_tfrecord_file("nosuch://bucket/*.tfrecord", parse, batch_size=16)
    with pytest.raises(StorageError, match="nosuch"):
        TFNet.from_export_folder("nosuch://bucket/export")
    assert sc.statusTracker().getJobIdsForGroup("storage-unknown-scheme") == []
    sc.setLocalProperty("spark.jobGroup.id", None)
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- file:// and viewfs:// in the session


def test_file_uris_train_checkpoint_and_summarize(sc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x, y = arrays()
    model_dir, logs = f"file://{tmp_path}/ckpt", f"file://{tmp_path}/logs"
    optimizer = TFOptimizer.from_keras(small_model(), TFDataset.from_ndarrays((x, y), batch_size=16),
                                       model_dir=model_dir, num_workers=2, keep_checkpoints=1)
    summary = TrainSummary(logs, "app")
    optimizer.set_train_summary(summary)
    optimizer.optimize(MaxEpoch(2), verbose=0)
    assert os.listdir(tmp_path / "ckpt") == ["checkpoint-8.npz"]
    assert summary.read_scalar("Loss")[:, 0].tolist() == list(range(1, 9))
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "logs"]  # no ./file: folder


@pytest.fixture
def viewfs(sc, tmp_path):
    """``viewfs://<mount>/data`` mounted onto ``tmp_path/target`` in the session's Hadoop configuration."""
    name = f"sparktf{uuid.uuid4().hex[:8]}"
    target = tmp_path / "target"
    target.mkdir()
    sc._jsc.hadoopConfiguration().set(f"fs.viewfs.mounttable.{name}.link./data", f"file://{target}")
    return f"viewfs://{name}/data", target


def test_viewfs_checkpoints_summaries_and_tfrecords(sc, viewfs):
    root, target = viewfs
    assert store_for(root).route == "Hadoop FileSystem"
    write_records(str(target / "records"))
    dataset = TFDataset.from_tfrecord_file(join(root, "records", "part-*.tfrecord"), parse, batch_size=16)
    model = small_model()
    optimizer = TFOptimizer.from_keras(model, dataset, model_dir=join(root, "ckpt"), num_workers=2,
                                       keep_checkpoints=2)
    train, validation = TrainSummary(join(root, "logs"), "app"), ValidationSummary(join(root, "logs"), "app")
    optimizer.set_train_summary(train).set_val_summary(validation)
    optimizer.optimize(MaxEpoch(3), verbose=0)
    assert visible(target / "ckpt") == ["checkpoint-12.npz", "checkpoint-8.npz"]
    assert len(train.read_scalar("Loss")) == 12
    assert any(name.startswith("events.out.tfevents.") for name in os.listdir(target / "logs" / "app" / "train"))

    resumed = TFOptimizer.from_keras(small_model(seed=1), dataset, model_dir=join(root, "ckpt"))
    resumed.load_checkpoint()
    assert resumed.iteration == 12
    for trained, restored in zip(model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_array_equal(trained, restored)


def test_viewfs_model_files(sc, viewfs, tmp_path):
    from sparktf.ml import KerasModel

    root, target = viewfs
    model = small_model()
    x, _ = arrays(8)
    expected = model.predict(x, verbose=0)
    export_tf(model, join(root, "export"))
    np.testing.assert_allclose(TFNet.from_export_folder(join(root, "export")).forward(x), expected, atol=1e-6)
    tf.saved_model.save(model, str(target / "saved"))
    predictor = TFPredictor.from_saved_model(join(root, "saved"), TFDataset.from_ndarrays(x, batch_per_thread=4))
    np.testing.assert_allclose(np.stack(predictor.predict().collect()), expected, atol=1e-6)

    KerasModel.from_keras(model).write().save(join(root, "stage"))
    assert visible(target / "stage") == ["metadata", "model.keras"]
    with pytest.raises(StorageError, match="overwrite"):
        KerasModel.from_keras(model).write().save(join(root, "stage"))
    KerasModel.from_keras(small_model(seed=2)).write().overwrite().save(join(root, "stage"))
    loaded = KerasModel.load(join(root, "stage"))
    assert not np.array_equal(loaded.keras_model.get_weights()[0], model.get_weights()[0])


def test_capturing_a_model_state_copies_without_numpy_2_warnings():
    import warnings

    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("adam", "mse")
    model.optimizer.build(model.trainable_variables)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = ModelState.capture(model, 5)
    assert [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)] == []
    model.weights[0].assign(model.weights[0] + 1.0)  # the state holds copies, not views of the variables
    assert not np.array_equal(state.weights[0], model.weights[0].numpy())
    assert len(state.optimizer_variables) == len(model.optimizer.variables) and state.iteration == 5
