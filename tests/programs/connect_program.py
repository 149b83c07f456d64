"""sparktf in a Spark Connect client session: ``python connect_program.py TMP [sc://host:port]``.

Without an address, ``SPARK_REMOTE=local[2]`` starts a local Connect server.
Prints one ``RESULT <case> <JSON object>`` line per case: ``session``
(init_spark), ``train`` (from_dataframe with a weight column and validation, a callback, live
progress, checkpoints, a TrainSummary, evaluate, predict_dataframe), ``pipeline`` (a
``sparktf.ml`` Pipeline fitted, saved and loaded; CrossValidator, local
only), ``recover`` (from_ndarrays, a worker failure relaunched, against an
uninterrupted run; server only), ``cluster`` (server only:
``resource_profile`` and ``min_workers``), ``tfrecord`` (from_tfrecord_file
in both cache modes; local only), ``stream`` (a streaming DataFrame scored,
``optimize_stream`` refused; local only), ``interrupt`` (Ctrl-C while training
cancels its job; local only), ``concurrent`` (two optimize calls from threads, one on a
``SparseVector`` column; local only), ``run`` (sparktf.run's result and its
children's lines), then, local only (what the client checks whatever the
server), ``run_failure``, ``slots`` (too many workers fails at once),
``rdd_only`` (the errors of what needs RDDs) and ``driver_host`` (an address
this process cannot listen on), and last ``done``.
"""

import contextlib
import io
import json
import os
import signal
import sys
import threading
import time

import sparktf  # first: TensorFlow's start-up lines stay out of this process's output too

import keras
import numpy as np
import tensorflow as tf
from sparktf import TFDataset, TFOptimizer, TFPredictor, TrainSummary
from sparktf.triggers import EveryEpoch, MaxEpoch

from hook_layers import PythonHook  # beside this program


def result(case, **values):
    print(f"RESULT {case} {json.dumps(values)}", flush=True)


def error_of(call):
    """(class name, first 300 characters, seconds) of what ``call`` raises; the class is None when nothing is."""
    started = time.monotonic()
    try:
        call()
    except Exception as error:  # the program reports every error, the test judges it
        return type(error).__name__, str(error)[:300], round(time.monotonic() - started, 1)
    return None, "", round(time.monotonic() - started, 1)


def ranks(args, ctx):
    print(f"rank {ctx.worker_num} of {ctx.num_workers} says {args}", flush=True)
    return {"rank": ctx.worker_num, "role": ctx.role, "tf_config_task": json.loads(os.environ["TF_CONFIG"])["task"]}


def failing(args, ctx):
    raise ValueError(f"planned failure in rank {ctx.worker_num}")


def doubling_net():
    import tensorflow as tf

    return sparktf.TFNet.from_function(tf.function(lambda x: 2.0 * x),
                                       [tf.TensorSpec([None, 2], tf.float32)])


class PathHook(PythonHook):
    """A :class:`PythonHook` with a file or folder of the test, ``where``.

    Its subclasses are classes of the client's script: they reach the executors by value.
    """

    def __init__(self, where, **kwargs):
        super().__init__(**kwargs)
        self.where = where

    def get_config(self):
        return {**super().get_config(), "where": self.where}


class FailOnce(PathHook):
    """Raises in the first training step while the file ``where`` does not exist (then writes it)."""

    def hook(self):
        if not os.path.exists(self.where):
            with open(self.where, "w") as handle:
                handle.write("failed once")
            raise RuntimeError("injected worker failure")


class BlockUntil(PathHook):
    """A step writes ``where/started`` then blocks (60 s at most) while ``where/release`` does not exist."""

    def hook(self):
        open(os.path.join(self.where, "started"), "a").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(self.where, "release")) and time.monotonic() < deadline:
            time.sleep(0.1)


class EpochRecorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append([epoch, sorted(logs or {})])


def regression_data(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return x, (x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32)).astype(np.float32)


def frame(spark, x, y, weights=None):
    if weights is None:
        return spark.createDataFrame([(row.tolist(), float(label)) for row, label in zip(x, y)],
                                     "features array<float>, label float")
    return spark.createDataFrame([(row.tolist(), float(label), float(w)) for row, label, w in zip(x, y, weights)],
                                 "features array<float>, label float, w float")


def linear_model(*layers):
    model = keras.Sequential([keras.Input((4,)), *layers, keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse", metrics=["mae"])
    return model


def train_case(spark, tmp):
    x, y = regression_data(256, 0)
    x_val, y_val = regression_data(64, 1)
    w, w_val = np.linspace(0.5, 2.0, 256, dtype=np.float32), np.linspace(2.0, 0.5, 64, dtype=np.float32)
    val_df = frame(spark, x_val, y_val, w_val)
    dataset = TFDataset.from_dataframe(frame(spark, x, y, w), "features", "label", batch_size=32,
                                       validation_df=val_df, weight_col="w")
    model = linear_model()
    recorder = EpochRecorder()
    model_dir = os.path.join(tmp, "checkpoints")
    optimizer = TFOptimizer.from_keras(model, dataset, model_dir=model_dir)
    summary = TrainSummary(os.path.join(tmp, "logs"), "connect")
    optimizer.set_train_summary(summary)
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):  # the live progress display
        history = optimizer.optimize(MaxEpoch(3), checkpoint_trigger=EveryEpoch(), callbacks=[recorder], verbose=1)
    progress = [line.strip() for line in shown.getvalue().splitlines() if line.strip().startswith("Epoch")]
    evaluated = optimizer.evaluate(dataset.val_dataset)
    local = model.evaluate(x_val, y_val, sample_weight=w_val, verbose=0, return_dict=True)
    scored = TFPredictor.from_keras(model, dataset).predict_dataframe(val_df, "features").collect()
    predicted = np.array([row["prediction"] for row in scored], np.float32).reshape(-1)
    result("train", loss=[round(v, 5) for v in history["loss"]], iterations=history["iterations"],
           val_loss=[round(v, 5) for v in history.get("val_loss", [])], epochs=recorder.epochs,
           checkpoints=len(os.listdir(model_dir)), evaluated=evaluated, local=local, progress=progress,
           summary_rows=len(summary.read_scalar("Loss")),
           prediction_error=float(np.max(np.abs(predicted - model.predict(x_val, verbose=0).reshape(-1)))),
           predict_rdd=error_of(lambda: TFPredictor.from_keras(model, dataset).predict())[:2])


def stream_case(spark, tmp):
    """A streaming DataFrame scored from the client; optimize_stream refused by name."""
    x, y = regression_data(40, 2)
    folder = os.path.join(tmp, "stream")
    frame(spark, x, y).write.parquet(folder)
    stream = spark.readStream.schema("features array<float>, label float").parquet(folder)
    model = linear_model()
    predictor = TFPredictor.from_keras(model, TFDataset.from_dataframe(stream, "features", batch_per_thread=8))
    query = (predictor.predict_dataframe(stream, "features").writeStream.format("memory").queryName("connect_scored")
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    rows = spark.sql("select * from connect_scored").collect()
    scored = {tuple(np.float32(v) for v in row["features"]): float(np.reshape(row["prediction"], -1)[0])
              for row in rows}
    expected = model.predict(x, verbose=0).reshape(-1)
    error = max(abs(scored[tuple(row)] - want) for row, want in zip(x, expected))
    training = TFDataset.from_dataframe(stream, "features", "label", batch_size=8)
    refused = error_of(lambda: TFOptimizer.from_keras(linear_model(), training, model_dir=os.path.join(tmp, "m"))
                       .optimize_stream())
    result("stream", rows=len(rows), error=float(error), refused=refused[:2])


def recover_case(tmp):
    x, y = regression_data(128, 2)
    dataset = TFDataset.from_ndarrays((x, y), batch_size=32, seed=3)
    marker = os.path.join(tmp, "failed-once")
    initial = linear_model(FailOnce(marker)).get_weights()
    weights = []
    for _ in range(2):  # the first run fails once and is relaunched; the second is uninterrupted
        model = linear_model(FailOnce(marker))
        model.set_weights(initial)
        TFOptimizer.from_keras(model, dataset).optimize(MaxEpoch(1), verbose=0)
        weights.append(model.get_weights())
    result("recover", marker=os.path.exists(marker),
           difference=max(float(np.max(np.abs(a - b))) for a, b in zip(*weights)))


def interrupt_case(tmp):
    """Ctrl-C (SIGINT) while a step blocks on the executors: raised at once, the job cancelled, the next one runs."""
    folder = os.path.join(tmp, "interrupt")
    os.makedirs(folder)
    x, y = regression_data(64, 6)
    dataset = TFDataset.from_ndarrays((x, y), batch_size=16)
    signalled = []

    def interrupt_when_started():
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(folder, "started")) and time.monotonic() < deadline:
            time.sleep(0.1)
        signalled.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_when_started, daemon=True).start()
    try:
        TFOptimizer.from_keras(linear_model(BlockUntil(folder)), dataset).optimize(MaxEpoch(1), verbose=0)
        raised = None
    except KeyboardInterrupt:
        raised = round(time.monotonic() - signalled[0], 1)
    started = time.monotonic()
    TFOptimizer.from_keras(linear_model(), dataset).optimize(MaxEpoch(1), verbose=0)
    result("interrupt", raised_after=raised, next_job=round(time.monotonic() - started, 1))


def cluster_case(spark):
    """On a cluster (not local mode): a resource profile for sparktf's stages, and elastic settings."""
    x, y = regression_data(64, 7)
    dataset = TFDataset.from_dataframe(frame(spark, x, y), "features", "label", batch_size=16)
    model = linear_model()
    optimizer = TFOptimizer.from_keras(model, dataset, min_workers=1, resource_profile={"cpus": 1})
    history = optimizer.optimize(MaxEpoch(1), verbose=0)
    result("cluster", iterations=history["iterations"], evaluated=optimizer.evaluate()["loss"],
           local=model.evaluate(x, y, verbose=0, return_dict=True)["loss"])


def concurrent_case(spark):
    """Two optimize calls from threads of this client, both in flight at once (each waits at its first epoch's
    end for the other's): one on a ``SparseVector`` column, one on the same rows as an array column."""
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql.types import FloatType, StructField, StructType

    x, y = regression_data(64, 8)
    x[x < 0.3] = 0.0  # zeros a sparse vector leaves out
    sparse = spark.createDataFrame(
        [(Vectors.sparse(4, {i: float(v) for i, v in enumerate(row) if v}), float(label)) for row, label in zip(x, y)],
        StructType([StructField("features", VectorUDT()), StructField("label", FloatType())]))
    frames = {"sparse": sparse, "dense": frame(spark, x, y)}
    initial, met = linear_model().get_weights(), threading.Barrier(2, timeout=120)
    models, iterations = {}, {}

    def train(name):
        models[name] = model = linear_model()
        model.set_weights(initial)
        # whole-data batches: the rows' order, which Spark does not keep, does not matter
        dataset = TFDataset.from_dataframe(frames[name], "features", "label", batch_size=64)
        meet = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: epoch or met.wait())
        history = TFOptimizer.from_keras(model, dataset, num_workers=1).optimize(MaxEpoch(2), callbacks=[meet],
                                                                                 verbose=0)
        iterations[name] = history["iterations"]

    outcomes = {}
    threads = [threading.Thread(target=lambda n=name: outcomes.update({n: error_of(lambda: train(n))}))
               for name in frames]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    result("concurrent", errors={name: outcome[:2] for name, outcome in outcomes.items()},
           iterations=iterations,
           difference=max(float(np.max(np.abs(a - b)))
                          for a, b in zip(models["sparse"].get_weights(), models["dense"].get_weights())))


def write_records(path, x, y):
    with tf.io.TFRecordWriter(path) as writer:
        for row, label in zip(x, y):
            feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                       "y": tf.train.Feature(float_list=tf.train.FloatList(value=[label]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def parse_record(serialized):
    parsed = tf.io.parse_single_example(serialized, {"x": tf.io.FixedLenFeature([4], tf.float32),
                                                     "y": tf.io.FixedLenFeature([], tf.float32)})
    return parsed["x"], parsed["y"]


def tfrecord_case(tmp):
    x, y = regression_data(120, 5)
    folder = os.path.join(tmp, "records")
    os.makedirs(folder)
    for part in range(3):
        write_records(os.path.join(folder, f"part-{part}.tfrecord"), x[part::3], y[part::3])
    losses = {}
    for cache in (True, False):
        dataset = TFDataset.from_tfrecord_file(os.path.join(folder, "*.tfrecord"), parse_record, batch_size=20,
                                               cache=cache)
        model = linear_model()
        history = TFOptimizer.from_keras(model, dataset).optimize(MaxEpoch(2), verbose=0)
        evaluated = TFOptimizer.from_keras(model, dataset).evaluate()["loss"]
        local = model.evaluate(x, y, verbose=0, return_dict=True)["loss"]
        losses[str(cache)] = [dataset.num_records, history["iterations"], evaluated, local]
    result("tfrecord", **losses)


def pipeline_case(spark, tmp, cross_validate):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.evaluation import RegressionEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    from sparktf.ml import KerasEstimator

    x, y = regression_data(128, 4)
    df = frame(spark, x, y)
    estimator = KerasEstimator(model=linear_model(), epochs=2, batchSize=32)
    fitted = Pipeline(stages=[estimator]).fit(df)
    path = os.path.join(tmp, "pipeline")
    fitted.write().overwrite().save(path)
    before = [row["prediction"] for row in fitted.transform(df).collect()]
    after = [row["prediction"] for row in PipelineModel.load(path).transform(df).collect()]
    values = {"epochs": len(fitted.stages[-1].history["loss"]), "rows": len(after),
              "difference": float(np.max(np.abs(np.array(before) - np.array(after))))}
    if cross_validate:
        grid = ParamGridBuilder().addGrid(estimator.epochs, [1, 3]).build()
        tuned = CrossValidator(estimator=estimator, estimatorParamMaps=grid, numFolds=2,
                               evaluator=RegressionEvaluator(metricName="rmse")).fit(df)
        values.update(cv_metrics=[round(value, 4) for value in tuned.avgMetrics],
                      best_epochs=len(tuned.bestModel.history["loss"]))
    result("pipeline", **values)


def main():
    tmp = sys.argv[1]
    remote = sys.argv[2] if len(sys.argv) > 2 else None
    if remote is None:
        os.environ["SPARK_REMOTE"] = "local[2]"
    local_conf = {"spark.driver.host": "127.0.0.1", "spark.ui.enabled": "false",  # a server has its own
                  "spark.python.daemon.module": "sparktf.spark.tf_daemon"}
    spark = sparktf.init_spark(remote=remote, conf=None if remote else local_conf)
    result("session", module=type(spark).__module__, again=sparktf.init_spark() is spark)

    pipeline_case(spark, tmp, cross_validate=not remote)
    if remote:  # what a cluster runs differently (executors of their own), or only a cluster runs
        recover_case(tmp)
        cluster_case(spark)
    else:  # the same code paths as on a server (whose cases above train too), run once
        train_case(spark, tmp)
        concurrent_case(spark)
        tfrecord_case(tmp)
        interrupt_case(tmp)
        stream_case(spark, tmp)

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        value = sparktf.run(ranks, args="hi", num_workers=2)
    result("run", value=value, lines=sorted(line for line in printed.getvalue().splitlines() if "says" in line))
    if not remote:  # the same on any server: run once
        client_checks(spark)
    result("done")
    spark.stop()


def client_checks(spark):
    """What fails in the client whatever the server: a failing child, too many workers, RDD entry points, an
    address this client cannot listen on."""
    name, message, _ = error_of(lambda: sparktf.run(failing, num_workers=2))
    result("run_failure", error=name, message=message.splitlines()[0] if message else "")

    name, message, seconds = error_of(lambda: sparktf.run(ranks, num_workers=3))
    result("slots", error=name, message=message, seconds=seconds)

    rdd_only = {
        "from_rdd": error_of(lambda: sparktf.TFDataset.from_rdd(None, ("float32", [2]))),
        "from_string_rdd": error_of(lambda: sparktf.TFDataset.from_string_rdd(None)),
        "TFNet_distributed": error_of(lambda: doubling_net().predict(np.ones((4, 2), np.float32), distributed=True)),
    }
    rdd_only["TFNet_local"] = (doubling_net().predict(np.ones((4, 2), np.float32)).tolist(), "")
    result("rdd_only", **{key: value[:2] for key, value in rdd_only.items()})

    from sparktf.spark import remote_errors

    def unread(error):
        raise AssertionError("the client read Spark's text of the task failure")

    read_text, remote_errors._error_in_text = remote_errors._error_in_text, unread
    with_null = spark.createDataFrame([(1.0, 1.0), (2.0, 2.0), (None, 3.0)], "x double, y double").coalesce(1)
    name, message, _ = error_of(lambda: TFDataset.from_dataframe(with_null, "x", "y").num_records)
    remote_errors._error_in_text = read_text
    result("bad_record", error=name, message=message)

    spark.conf.set("spark.sparktf.driverHost", "192.0.2.1")  # TEST-NET-1: never an address of this machine
    name, message, seconds = error_of(lambda: sparktf.run(ranks, num_workers=1))
    x, y = regression_data(64, 4)
    training = TFOptimizer.from_keras(linear_model(), TFDataset.from_ndarrays((x, y), batch_size=32), max_failures=3)
    trained = error_of(lambda: training.optimize(MaxEpoch(1), verbose=0))  # raised once, before any training job
    result("driver_host", error=name, message=message, seconds=seconds, optimize=trained)


if __name__ == "__main__":
    sys.exit(main())
