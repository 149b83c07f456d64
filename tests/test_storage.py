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


# ---------------------------------------------------------------- storage faults (issue 41, item 2)

def _botocore_reset():
    from botocore.exceptions import EndpointConnectionError

    return EndpointConnectionError(endpoint_url="http://127.0.0.1:1/flaky")


class FlakyMemory(__import__("fsspec.implementations.memory", fromlist=["x"]).MemoryFileSystem):
    """fsspec's in-memory store (``flakymem://``) whose writes of the paths ``fail_put`` picks fail like a reset
    S3 connection (the driver's side: checkpoints)."""

    protocol = "flakymem"
    store, pseudo_dirs = {}, [""]
    fail_put = staticmethod(lambda path: False)
    puts = []

    def put_file(self, lpath, rpath, **kwargs):
        FlakyMemory.puts.append(rpath)
        if FlakyMemory.fail_put(rpath):
            raise _botocore_reset()
        return super().put_file(lpath, rpath, **kwargs)


@pytest.fixture
def flaky_memory(monkeypatch):
    import fsspec

    from sparktf.storage import faults

    fsspec.register_implementation("flakymem", FlakyMemory, clobber=True)
    monkeypatch.setattr(faults, "BACKOFF_SECONDS", 0.0)  # the retries' pauses, not what is tested
    FlakyMemory.store.clear()
    FlakyMemory.puts.clear()
    monkeypatch.setattr(FlakyMemory, "fail_put", staticmethod(lambda path: False))
    return FlakyMemory


def _iteration_in(path):
    import re

    found = re.search(r"checkpoint-(\d+)\.npz", path)
    return int(found.group(1)) if found else None


def test_a_stores_transport_error_is_a_storage_error_naming_path_route_and_retries(flaky_memory):
    uri = "flakymem://faults/a.bin"
    store = store_for(uri)
    flaky_memory.fail_put = staticmethod(lambda path: True)
    with pytest.raises(StorageError) as raised:
        store.write_bytes(uri, b"x")
    error = raised.value
    assert (error.path, error.route, error.retries, error.transient) == (uri, store.route, 2, True)
    for named in (uri, store.route, "retried 2 times", "EndpointConnectionError"):
        assert named in str(error)
    assert len(flaky_memory.puts) == 3  # the first try and 2 retries
    failures = iter([True, True])  # a blip: the third try goes through
    flaky_memory.fail_put = staticmethod(lambda path: next(failures, False))
    store.write_bytes(uri, b"y")
    assert store.read_bytes(uri) == b"y"


def _status_error(module, name, code):
    return type(name, (Exception,), {"__module__": module, "code": code})("a library that is not installed here")


@pytest.mark.parametrize("make, transient", [
    (_botocore_reset, True),
    (lambda: __import__("botocore.exceptions", fromlist=["x"]).NoCredentialsError(), False),
    (lambda: __import__("botocore.exceptions", fromlist=["x"]).ClientError(
        {"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "PutObject"), True),
    (lambda: __import__("botocore.exceptions", fromlist=["x"]).ClientError(
        {"Error": {"Code": "AccessDenied"}, "ResponseMetadata": {"HTTPStatusCode": 403}}, "PutObject"), False),
    (lambda: __import__("aiohttp").ClientPayloadError("cut short"), True),
    (lambda: _status_error("gcsfs.retry", "HttpError", 503), True),  # classified by module name
    (lambda: _status_error("gcsfs.retry", "HttpError", 404), False),
    (lambda: type("ServiceRequestError", (Exception,), {"__module__": "azure.core.exceptions"})("no answer"), True),
], ids=["botocore-endpoint", "botocore-credentials", "s3-slowdown", "s3-denied", "aiohttp-payload", "gcsfs-503",
        "gcsfs-404", "adlfs-request"])
def test_storage_libraries_errors_are_classified(make, transient):
    from sparktf.storage.faults import is_transient, storage_error, transport_error

    error = make()
    wrapped = OSError("s3fs's translation")  # a library that wraps the transport's error keeps it as the cause
    wrapped.__cause__ = error
    assert transport_error(error) and transport_error(wrapped)
    assert is_transient(error) is transient and is_transient(wrapped) is transient
    named = storage_error("cannot write", "s3://b/k", "fsspec s3fs", error, retries=2 if transient else 0)
    assert named.transient is transient and "s3://b/k" in str(named) and type(error).__name__ in str(named)
    assert not transport_error(ValueError("a bug of the caller"))


def test_a_failed_checkpoint_write_warns_and_the_next_trigger_writes(flaky_memory, caplog):
    from sparktf.training.driver.checkpoint_writer import CheckpointWriter

    model_dir = "flakymem://writer/ckpt"
    flaky_memory.fail_put = staticmethod(lambda path: _iteration_in(path) in {1, 2, 4, 5, 6})
    writer = CheckpointWriter(model_dir, keep=None, trigger=lambda progress: True, failures=3)
    with caplog.at_level("WARNING", logger="sparktf.optimizer"):
        for iteration in range(1, 6):
            writer.after_segment(None, lambda: state(iteration))
        with pytest.raises(StorageError, match=r"3 checkpoints in a row could not be written .*checkpoint_failures=3"):
            writer.after_segment(None, lambda: state(6))
    warned = [record.getMessage() for record in caplog.records if "could not be written" in record.getMessage()]
    assert [_iteration_in(message) for message in warned] == [1, 2, 4, 5]
    assert all("EndpointConnectionError" in message and "tries again" in message for message in warned)
    assert store_for(model_dir).listdir(model_dir) == ["checkpoint-3.npz"]


def test_optimize_ends_with_a_storage_error_when_its_last_checkpoint_was_never_written(flaky_memory):
    from sparktf.training.driver.checkpoint_writer import CheckpointWriter

    model_dir = "flakymem://finish/ckpt"
    flaky_memory.fail_put = staticmethod(lambda path: _iteration_in(path) == 1)
    writer = CheckpointWriter(model_dir, keep=None, trigger=lambda progress: True)
    writer.after_segment(None, lambda: state(1))
    writer.finish(lambda: state(2))  # the final state, tried once more at the end: written
    assert store_for(model_dir).listdir(model_dir) == ["checkpoint-2.npz"]
    flaky_memory.fail_put = staticmethod(lambda path: True)
    writer.after_segment(None, lambda: state(3))
    with pytest.raises(StorageError, match=r"last checkpoint of this optimize call was never written.*checkpoint-4"):
        writer.finish(lambda: state(4))
    with pytest.raises(ValueError, match="checkpoint_failures"):
        CheckpointWriter(model_dir, None, lambda progress: True, failures=0)


def test_training_goes_on_past_failed_checkpoints_until_too_many_in_a_row(sc, flaky_memory, caplog):
    model_dir = "flakymem://train/ckpt"
    flaky_memory.fail_put = staticmethod(lambda path: _iteration_in(path) in {2, 6, 8})  # epochs 1, 3 and 4
    dataset = TFDataset.from_ndarrays(arrays(64), batch_size=32)
    optimizer = TFOptimizer.from_keras(small_model(), dataset, model_dir=model_dir, num_workers=2)
    with caplog.at_level("WARNING", logger="sparktf.optimizer"):
        with pytest.raises(StorageError, match="2 checkpoints in a row") as raised:
            optimizer.optimize(MaxEpoch(4), verbose=0, checkpoint_failures=2)
    assert optimizer.iteration == 8  # trained to the end through the failed writes
    assert raised.value.__cause__ is not None and "checkpoint-8.npz" in str(raised.value.__cause__)
    assert [_iteration_in(record.getMessage()) for record in caplog.records
            if "could not be written" in record.getMessage()] == [2, 6]
    assert store_for(model_dir).listdir(model_dir) == ["checkpoint-4.npz"]


@pytest.fixture
def s3_driver(s3_server, monkeypatch):
    """The test process's AWS variables for the local S3 server; a bucket; s3fs's own retries down to one try."""
    import s3fs

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": s3_server,
                        "AWS_MAX_ATTEMPTS": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    store_for("s3://sparktf-faults").makedirs("s3://sparktf-faults")
    return s3_server


def test_the_driver_follows_a_second_endpoint_and_refreshed_credentials(s3_driver, monkeypatch):
    from flaky_proxy import FlakyProxy

    uri = "s3://sparktf-faults/endpoint.txt"
    first = store_for(uri)
    first.write_bytes(uri, b"on the store")
    with FlakyProxy(s3_driver) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)  # a second endpoint, after the first was used
        assert store_for(uri).read_bytes(uri) == b"on the store"
        assert proxy.connections >= 1  # the read went to the second endpoint
        monkeypatch.setenv("AWS_SESSION_TOKEN", "refreshed")
        assert store_for(uri).fs is not first.fs and store_for(uri) is store_for(uri)


def test_a_store_that_resets_every_connection_raises_a_storage_error(s3_driver, monkeypatch, flaky_memory):
    from flaky_proxy import FlakyProxy

    uri = "s3://sparktf-faults/reset.txt"
    store_for(uri).write_bytes(uri, b"x")
    with FlakyProxy(s3_driver) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        proxy.reset_all = True
        store = store_for(uri)
        with pytest.raises(StorageError) as raised:
            store.read_bytes(uri)
    error = raised.value
    assert (error.path, error.route, error.retries, error.transient) == (uri, "fsspec s3fs", 2, True)
    assert "retried 2 times" in str(error) and proxy.resets >= 3



# ---------------------------------------------------------------- read-ahead of TFRecord files through the store


def identity(serialized):
    return serialized


def test_a_stream_through_the_store_reads_tensorflows_records_in_order_without_asking_sizes(
        s3_driver, monkeypatch, tmp_path):
    """Files of several chunks, each taken over from the reader opened early for it (the next pass's too)."""
    from flaky_proxy import FlakyProxy

    from sparktf.data import tfrecord_files, tfrecord_readahead
    from sparktf.data.tfrecord_stream import TFRecordFeed
    from sparktf.spark.user_code import pickle_by_value

    monkeypatch.setattr(tfrecord_readahead, "CHUNK_BYTES", 512)
    write_records(str(tmp_path), files=3, per_file=40)
    local = [str(tmp_path / f"part-{index}.tfrecord") for index in range(3)]
    remote = [f"s3://sparktf-faults/stream/part-{index}.tfrecord" for index in range(3)]
    for path, uri in zip(local, remote):
        store_for(uri).upload(path, uri)
    sizes = [os.path.getsize(path) for path in local]
    assert min(sizes) > 4 * 512

    def records(files, passes=3):
        feed = TFRecordFeed([files], [120], pickle_by_value({"parse_fn": identity}), None, shuffle=True, seed=5,
                            shuffle_buffer=16, sizes=[sizes])
        return [batch.numpy()[0] for batch in feed._dataset(0, 0, 0, 1, tfrecord_files.ReadFailures()).take(
            passes * 120)]

    with FlakyProxy(s3_driver) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        requests = []
        proxy.reset_when = lambda chunk: requests.append(chunk.split(b" ", 2)[:2]) and False
        assert records(remote) == records(local)
    assert {method for method, _ in requests} == {b"GET"}  # no HEAD: the sizes were given
    assert len([path for _, path in requests if path.startswith(b"/sparktf-faults/stream/")]) >= 3 * sum(
        -(-size // 512) for size in sizes)


def test_a_read_the_store_breaks_off_mid_file_is_a_transient_storage_error_and_its_reader_ends(
        s3_driver, monkeypatch, tmp_path):
    import threading

    from flaky_proxy import FlakyProxy

    from sparktf.data import tfrecord_files, tfrecord_readahead

    monkeypatch.setattr(tfrecord_readahead, "CHUNK_BYTES", 1024)
    write_records(str(tmp_path), files=1, per_file=100)
    uri = "s3://sparktf-faults/mid/part-0.tfrecord"
    store_for(uri).upload(str(tmp_path / "part-0.tfrecord"), uri)
    earlier = set(threading.enumerate())  # other tests' early-opened readers may idle in this process
    with FlakyProxy(s3_driver) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        proxy.reset_when = lambda chunk: chunk.startswith(b"GET /sparktf-faults/mid/") and b"bytes=2048-" in chunk
        failures = tfrecord_files.ReadFailures()
        with pytest.raises(StorageError) as raised:
            list(tfrecord_files._records_of_path(uri.encode(), failures=failures))
    assert (raised.value.path, raised.value.transient) == (uri, True) and proxy.resets >= 1
    assert failures.take() is raised.value and failures.take() is None  # what a training worker's error names
    for thread in set(threading.enumerate()) - earlier:
        if thread.name == "sparktf-read-ahead":
            thread.join(30)
            assert not thread.is_alive()


def test_files_opened_early_are_taken_over_at_most_max_early_kept_and_dropped_when_nobody_comes(
        monkeypatch, tmp_path):
    from sparktf import process_state
    from sparktf.data import tfrecord_readahead
    from sparktf.data.tfrecord_readahead import MAX_EARLY, file_runs, open_early

    monkeypatch.setattr(tfrecord_readahead, "CHUNK_BYTES", 64)
    process_state.reset()
    waiting = tfrecord_readahead._early()._readers  # the process's early readers
    write_records(str(tmp_path), files=2, per_file=20)
    first, second = (str(tmp_path / f"part-{index}.tfrecord") for index in range(2))
    expected = [record.numpy() for record in tf.data.TFRecordDataset(second)]

    def records(*args):
        return [record for run in file_runs(*args) for record in run]

    assert records(first, None, None, (("test", second, 1), second, None)) == [
        record.numpy() for record in tf.data.TFRecordDataset(first)]
    early = waiting[("test", second, 1)]  # opened once the first file's last chunk was fetched
    assert records(second, None, ("test", second, 1)) == expected
    assert ("test", second, 1) not in waiting and early._stop.is_set()  # taken over, then closed

    for index in range(MAX_EARLY + 2):
        open_early(("bound", index), second)
    kept = [key for key in waiting if key[0] == "bound"]
    assert kept == [("bound", index) for index in range(2, MAX_EARLY + 2)]
    closing = [waiting[key] for key in kept]
    process_state.reset()  # closes the readers nobody took
    assert all(reader._stop.is_set() for reader in closing) and "early_readers" not in process_state._STATE.names()

    monkeypatch.setattr(tfrecord_readahead, "IDLE_SECONDS", 0.2)
    open_early(("idle",), second)
    idle = tfrecord_readahead._early()._readers[("idle",)]
    idle._thread.join(30)  # its queue is full (the file has more chunks): it gives up on its own
    assert not idle._thread.is_alive() and not idle.claim()
    assert records(second, None, ("idle",)) == expected  # read afresh


def test_the_sharded_tables_slots_travel_through_an_object_store(s3_driver):
    """Two ranks write their rows of a slot to S3; one reads the whole table back; pruning removes an old folder."""
    from sparktf.training.tables.optimizer_state_store import (optimizer_state_folder, prune_optimizer_state_folders,
                                                               read_optimizer_state_rows, write_manifest,
                                                               write_optimizer_state_rows)

    root = "s3://sparktf-faults/run/tables"
    velocity = np.arange(14, dtype=np.float32).reshape(7, 2)
    old, current = optimizer_state_folder(root, 2, b"first"), optimizer_state_folder(root, 4, b"second")
    for folder in (old, current):
        write_manifest(folder, 4, write_optimizer_state_rows(folder, "users", 0, 4, {"velocity": velocity[:4]}) +
                       write_optimizer_state_rows(folder, "users", 4, 7, {"velocity": velocity[4:]}))
    np.testing.assert_array_equal(read_optimizer_state_rows(current, "users", 0, 7, ["velocity"])["velocity"], velocity)
    prune_optimizer_state_folders(root, keep_iterations=[], keep_folder=current)
    assert store_for(root).listdir(root) == [current.rsplit("/", 1)[1]]


def test_a_stream_whose_first_checkpoint_fails_leaves_the_model_untrained_and_trains_the_micro_batch_once(
        spark, tmp_path, flaky_memory):
    from test_streaming import classifier, event_stream, reference_weights, write_events

    rng = np.random.default_rng(21)
    micro_batches = [write_events(spark, tmp_path / "events", 0, rng, 37)]
    dataset = TFDataset.from_dataframe(event_stream(spark, tmp_path / "events"), "features", "label", batch_size=16,
                                       shuffle=False)
    model = classifier()
    untrained = model.get_weights()
    optimizer = TFOptimizer.from_keras(model, dataset, model_dir="flakymem://stream/ckpt", num_workers=2)
    flaky_memory.fail_put = staticmethod(lambda path: "checkpoint-" in path)
    query = optimizer.optimize_stream(trigger={"availableNow": True}, checkpoint_location=str(tmp_path / "query"))
    with pytest.raises(Exception):
        query.awaitTermination(300)
    assert "StorageError" in str(query.exception()) and "checkpoint-3.npz" in str(query.exception())
    assert optimizer.iteration == 0 and not optimizer.training_session.state.stream
    for got, want in zip(optimizer.model.get_weights(), untrained):  # the pass is not in the model
        np.testing.assert_array_equal(got, want)

    flaky_memory.fail_put = staticmethod(lambda path: False)  # the store answers again: the same process restarts
    query = optimizer.optimize_stream(trigger={"availableNow": True}, checkpoint_location=str(tmp_path / "query"))
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    assert optimizer.iteration == 3
    for got, want in zip(optimizer.model.get_weights(), reference_weights(classifier(), micro_batches, 16, 2)):
        np.testing.assert_allclose(got, want, atol=1e-5)
