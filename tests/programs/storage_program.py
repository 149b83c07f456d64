"""Cluster storage in a driver of its own: ``python storage_program.py s3 ENDPOINT`` or ``viewfs FOLDER``.

``s3``: a local S3 server (moto) at ENDPOINT holds the TFRecords, the
checkpoints, the summaries and a saved stage. The executors get the endpoint
and keys only from ``spark.executorEnv.*`` (the driver sets its own after its
JVM started). ENDPOINT is the test's proxy. In the ``cache=False`` case,
``stream/train-1.tfrecord`` spans more read chunks than any read-ahead
fetches early, and once the records are counted this program writes
``stream-counted``: the proxy's sign to reset the reads of that file's fifth
chunk in the second epoch (botocore's retries are off, s3fs's spent), so the
task fails and training relaunches. Cases print ``RESULT <case> key=value ...``; the last case
trains a 128 MB model with a checkpoint every iteration until the test kills
this process (SIGKILL) while a checkpoint upload is in flight.

``viewfs``: ``viewfs://sparktf/data`` mounted onto FOLDER in the session's
Hadoop configuration; trains the same model with checkpoints there until
killed.
"""

import logging
import os
import sys

import numpy as np
from spark_conf import CONF  # beside this program

FEATURES = 4
#: Bytes of padding in each record of a padded file (64 records: more than 4 chunks of 2 MiB).
PAD_BYTES = 150_000


def small_model():
    import keras

    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def parse(serialized):
    import tensorflow as tf

    parsed = tf.io.parse_single_example(serialized, {"x": tf.io.FixedLenFeature([FEATURES], tf.float32),
                                                     "y": tf.io.FixedLenFeature([], tf.int64)})
    return parsed["x"], tf.cast(parsed["y"], tf.int32)


def write_records(fs, folder: str, files: int, per_file: int, padded=()) -> None:
    """TFRecord files written locally and uploaded with s3fs (the test data, not sparktf's path); the records of
    the files ``padded`` carry :data:`PAD_BYTES` more (a feature ``parse`` does not read)."""
    import tempfile

    import tensorflow as tf

    rng = np.random.default_rng(0)
    for index in range(files):
        local = os.path.join(tempfile.mkdtemp(), "part")
        with tf.io.TFRecordWriter(local) as writer:
            for x in rng.normal(size=(per_file, FEATURES)).astype("float32"):
                feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                           "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x.sum() > 0)]))}
                if index in padded:
                    feature["pad"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes(PAD_BYTES)]))
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
        fs.put_file(local, f"{folder}/train-{index}.tfrecord")


def train_until_killed(model_dir: str) -> None:
    """A 128 MB model (more than s3fs writes in one request), one worker, a checkpoint every iteration, until killed."""
    import keras

    from sparktf import MaxIteration, SeveralIteration, TFDataset, TFOptimizer

    model = keras.Sequential([keras.Input((4096,)), keras.layers.Dense(8192, use_bias=False)])
    model.compile(keras.optimizers.SGD(1e-4), "mse")
    x = np.ones((8, 4096), "float32")
    dataset = TFDataset.from_ndarrays((x, np.ones((8, 8192), "float32")), batch_size=8)
    optimizer = TFOptimizer.from_keras(model, dataset, model_dir=model_dir, num_workers=1, keep_checkpoints=2)
    print("RESULT kill_ready", flush=True)
    optimizer.optimize(MaxIteration(60), checkpoint_trigger=SeveralIteration(1), verbose=0)
    print("RESULT kill_missed (training ended before the test killed the driver)", flush=True)


class _Collect(logging.Handler):
    """Keeps the messages logged (the driver's relaunch warnings)."""

    def __init__(self, messages):
        super().__init__(logging.WARNING)
        self.messages = messages

    def emit(self, record):
        self.messages.append(record.getMessage())


def s3(endpoint: str) -> None:
    import sparktf
    from sparktf import MaxEpoch, TFDataset, TFOptimizer, TrainSummary
    from sparktf.ml import KerasModel

    credentials = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                   "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1"}
    conf = dict(CONF, **{f"spark.executorEnv.{name}": value for name, value in credentials.items()})
    spark = sparktf.init_spark("local[2]", conf=conf)
    os.environ.update(credentials)  # the driver's own, after its JVM (and so the executors) started
    import fsspec

    fs = fsspec.filesystem("s3")
    fs.mkdir("sparktf")
    write_records(fs, "sparktf/data", files=4, per_file=64)

    data = "s3a://sparktf/data/train-*.tfrecord"
    cached = TFDataset.from_tfrecord_file(data, parse, batch_size=32, cache=True)
    model = small_model()
    optimizer = TFOptimizer.from_keras(model, cached, model_dir="s3a://sparktf/ckpt", num_workers=2,
                                       keep_checkpoints=2)
    summary = TrainSummary("s3a://sparktf/logs", "app")
    optimizer.set_train_summary(summary)
    optimizer.optimize(MaxEpoch(3), verbose=0)
    names = sorted(fs.ls("sparktf/ckpt", detail=False))
    print(f"RESULT train iterations={optimizer.iteration} checkpoints={','.join(os.path.basename(n) for n in names)} "
          f"loss_rows={len(summary.read_scalar('Loss'))} event_files={len(fs.ls('sparktf/logs/app/train'))}",
          flush=True)

    resumed = TFOptimizer.from_keras(small_model(), cached, model_dir="s3a://sparktf/ckpt", num_workers=2)
    resumed.load_checkpoint()
    same = all(np.array_equal(a, b) for a, b in zip(model.get_weights(), resumed.model.get_weights()))
    resumed.optimize(MaxEpoch(4), verbose=0)
    print(f"RESULT resume from={optimizer.iteration} weights_equal={same} to={resumed.iteration}", flush=True)

    write_records(fs, "sparktf/stream", files=4, per_file=64, padded=(1,))  # of their own: the proxy resets one
    streamed = TFDataset.from_tfrecord_file("s3a://sparktf/stream/train-*.tfrecord", parse, batch_size=32,
                                            cache=False)
    streamed.num_records  # counted (each file read once): the proxy resets no read before it sees the next line
    fs.pipe_file("sparktf/stream-counted", b"")
    stream_optimizer = TFOptimizer.from_keras(small_model(), streamed, num_workers=2, max_failures=1)
    relaunches = []
    logging.getLogger("sparktf.optimizer").addHandler(_Collect(relaunches))
    history = stream_optimizer.optimize(MaxEpoch(2), verbose=0)
    evaluated = stream_optimizer.evaluate(cached)
    named = [message for message in relaunches if "relaunching" in message and "stream/train-1.tfrecord" in message
             and "could not read its TFRecord files mid-epoch" in message]
    print(f"RESULT stream iterations={history['iterations']} losses={len(history['loss'])} "
          f"finite={bool(np.isfinite(history['loss']).all())} evaluated_loss={evaluated['loss']:.4f} "
          f"relaunches={len([m for m in relaunches if 'relaunching' in m])} named={len(named)}", flush=True)

    KerasModel.from_keras(model).write().save("s3a://sparktf/stage")
    loaded = KerasModel.load("s3a://sparktf/stage")
    same = all(np.array_equal(a, b) for a, b in zip(model.get_weights(), loaded.keras_model.get_weights()))
    print(f"RESULT stage weights_equal={same} files={','.join(sorted(fs.find('sparktf/stage')))}", flush=True)
    spark.sparkContext.setLogLevel("ERROR")
    train_until_killed("s3a://sparktf/kill")


def viewfs(folder: str) -> None:
    import sparktf

    conf = dict(CONF, **{"spark.hadoop.fs.viewfs.mounttable.sparktf.link./data": f"file://{folder}"})
    sparktf.init_spark("local[1]", conf=conf)
    train_until_killed("viewfs://sparktf/data/kill")


if __name__ == "__main__":
    {"s3": s3, "viewfs": viewfs}[sys.argv[1]](sys.argv[2])
