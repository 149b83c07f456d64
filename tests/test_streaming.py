"""Structured Streaming: scoring a stream, training from one exactly once, published versions."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from sparktf import TFDataset, TFOptimizer, TFPredictor
from sparktf.data.columnar import balanced_bounds, pass_bounds
from sparktf.errors import ConfigurationError
from sparktf.models.published import publish
from sparktf.training.checkpoint import latest_checkpoint, load_checkpoint
from sparktf.ml import KerasModel

WIDTH = 4


def write_events(spark, folder, index, rng, count, null_row=None):
    """One parquet file of ``count`` events (features: array<float> of WIDTH, label: int)."""
    x = rng.normal(size=(count, WIDTH)).astype(np.float32)
    y = (x @ np.array([1.0, -1.0, 0.5, 0.0]) > 0).astype(np.int32)
    rows = [(None if i == null_row else [float(v) for v in row], int(label)) for i, (row, label) in enumerate(zip(x, y))]
    frame = spark.createDataFrame(rows, "features array<float>, label int").coalesce(1)
    frame.write.mode("overwrite").parquet(os.path.join(str(folder), f"part-{index}"))
    return x, y


def event_stream(spark, folder):
    return (spark.readStream.schema("features array<float>, label int").option("maxFilesPerTrigger", 1)
            .parquet(os.path.join(str(folder), "part-*")))


def classifier(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dense(3, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(keras.optimizers.SGD(0.5), "binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    return model


def memory_rows(spark, frame, name):
    query = frame.writeStream.format("memory").queryName(name).trigger(availableNow=True).start()
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    return spark.sql(f"select * from {name}").collect()


def test_a_stream_scores_as_the_batch_path_and_a_bad_record_fails_its_query_by_name(spark, tmp_path):
    rng = np.random.default_rng(1)
    for index in range(2):
        write_events(spark, tmp_path / "ok", index, rng, 20)
    model = classifier()
    batch = spark.read.parquet(str(tmp_path / "ok" / "part-*"))
    predictor = TFPredictor.from_keras(model, TFDataset.from_dataframe(batch, "features", batch_per_thread=8))
    expected = {tuple(r.features): r.prediction[0] for r in predictor.predict_dataframe(batch, "features").collect()}

    stream = event_stream(spark, tmp_path / "ok")
    scored = predictor.predict_dataframe(stream, "features")
    assert scored.isStreaming
    rows = memory_rows(spark, scored, "scored_stream")
    assert len(rows) == 40
    for row in rows:
        assert row.prediction[0] == pytest.approx(expected[tuple(row.features)], abs=1e-6)
    # the ML stage takes the stream too
    staged = KerasModel.from_keras(model, featuresCol="features", task="regression").transform(stream)
    rows = memory_rows(spark, staged, "staged_stream")
    assert sorted(r.prediction for r in rows) == pytest.approx(sorted(expected.values()), abs=1e-6)

    write_events(spark, tmp_path / "bad", 0, rng, 10, null_row=6)
    query = (predictor.predict_dataframe(event_stream(spark, tmp_path / "bad"), "features").writeStream
             .format("memory").queryName("bad_stream").trigger(availableNow=True).start())
    with pytest.raises(Exception):
        query.awaitTermination(300)
    text = str(query.exception())
    assert "DataError" in text and "column 'features'" in text and "row 6" in text


def test_pass_bounds_give_every_shard_its_local_batches_and_its_part_of_the_last():
    for total, batch, parts in [(37, 16, 2), (32, 3, 2), (5, 8, 2), (100, 7, 3)]:
        bounds = pass_bounds(total, batch, parts)
        sizes = np.diff(bounds)
        local = np.diff(balanced_bounds(batch, parts))
        assert bounds[-1] == total and (sizes >= 0).all()
        steps = -(-total // batch)
        assert all(-(-n // b) <= steps for n, b in zip(sizes, local))


def reference_weights(model, micro_batches, batch_size, workers):
    """What training the micro-batches one after another gives: each one pass of global batches cut as the
    workers' shards are (pass_bounds), one SGD step per global batch."""
    for x, y in micro_batches:
        bounds = pass_bounds(len(x), batch_size, workers)
        local = np.diff(balanced_bounds(batch_size, workers))
        for step in range(-(-len(x) // batch_size)):
            picks = np.concatenate([np.arange(bounds[r] + step * local[r], min(bounds[r + 1], bounds[r] + (step + 1)
                                                                               * local[r])) for r in range(workers)])
            model.train_on_batch(x[picks], y[picks].reshape(-1, 1).astype(np.float32))
    return model.get_weights()


def test_optimize_stream_trains_each_micro_batch_once_across_a_restart_and_publishes_versions(spark, tmp_path):
    rng = np.random.default_rng(2)
    events = tmp_path / "events"
    micro_batches = [write_events(spark, events, index, rng, 37) for index in range(2)]
    model_dir = str(tmp_path / "model")

    def stream_optimizer():
        dataset = TFDataset.from_dataframe(event_stream(spark, events), "features", "label", batch_size=16,
                                           shuffle=False)
        return TFOptimizer.from_keras(classifier(), dataset, model_dir=model_dir, num_workers=2)

    seen = []
    logger = keras.callbacks.LambdaCallback(on_epoch_end=lambda batch_id, logs: seen.append((batch_id, logs)))
    optimizer = stream_optimizer()
    query = optimizer.optimize_stream(trigger={"availableNow": True}, publish_every=1, callbacks=[logger])
    query.awaitTermination(600)
    assert query.exception() is None, query.exception()
    assert [entry["batchId"] for entry in query.training_progress] == [0, 1]
    assert [batch_id for batch_id, _ in seen] == [0, 1]
    assert {"loss", "test_loss", "test_auc", "records"} <= set(seen[0][1]) and seen[0][1]["records"] == 37
    assert optimizer.iteration == 2 * 3  # ceil(37 / 16) global batches a micro-batch

    # a scorer of the published versions, on a batch job
    frame = spark.read.parquet(str(events / "part-*"))
    scorer = TFPredictor.from_published(model_dir, TFDataset.from_dataframe(frame, "features", batch_per_thread=16))
    scored = np.array([r.prediction[0] for r in scorer.predict_dataframe(frame, "features").orderBy("features").collect()])
    direct = optimizer.model.predict(np.array([r.features for r in frame.orderBy("features").collect()]), verbose=0)
    np.testing.assert_allclose(scored, direct.reshape(-1), atol=1e-5)
    manifest = sorted(os.listdir(os.path.join(model_dir, "published")))
    assert manifest == ["1", "2"]

    # as if the driver died after training micro-batch 1 and before Spark committed it: Spark replays it
    for name in ("1", ".1.crc"):
        os.remove(os.path.join(model_dir, "stream", "commits", name))
    micro_batches.append(write_events(spark, events, 2, rng, 37))
    restarted = stream_optimizer()  # a fresh model object, the same model_dir
    query = restarted.optimize_stream(trigger={"availableNow": True})
    query.awaitTermination(600)
    assert query.exception() is None, query.exception()
    assert [entry["batchId"] for entry in query.training_progress] == [2]  # 1 was skipped: in the checkpoint
    expected = reference_weights(classifier(), micro_batches, 16, 2)
    for got, want in zip(restarted.model.get_weights(), expected):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_driver_killed_between_its_checkpoint_and_sparks_commit_resumes_without_training_twice(spark, tmp_path):
    rng = np.random.default_rng(4)
    events, model_dir = tmp_path / "events", str(tmp_path / "model")
    micro_batches = [write_events(spark, events, index, rng, 37) for index in range(3)]
    program = os.path.join(os.path.dirname(__file__), "programs", "stream_driver.py")
    killed = subprocess.run([sys.executable, program, str(events), model_dir, "1"], capture_output=True, text=True,
                            timeout=300)
    assert killed.returncode == -9, killed.stdout + killed.stderr[-3000:]
    committed = sorted(name for name in os.listdir(os.path.join(model_dir, "stream", "commits"))
                       if not name.startswith("."))
    assert committed == ["0"] and load_checkpoint(latest_checkpoint(model_dir)).stream[1] == 1

    dataset = TFDataset.from_dataframe(event_stream(spark, events), "features", "label", batch_size=64, shuffle=False)
    resumed = TFOptimizer.from_keras(classifier(), dataset, model_dir=model_dir, num_workers=2)  # a fresh model
    query = resumed.optimize_stream(trigger={"availableNow": True})
    query.awaitTermination(600)
    assert query.exception() is None, query.exception()
    assert [entry["batchId"] for entry in query.training_progress] == [2]  # 1 replayed by Spark, skipped
    assert resumed.iteration == 3
    for got, want in zip(resumed.model.get_weights(), reference_weights(classifier(), micro_batches, 64, 2)):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_micro_batch_of_two_files_and_one_of_one_record_train_exactly(spark, tmp_path):
    rng = np.random.default_rng(6)
    events = tmp_path / "events"
    files = [write_events(spark, events, index, rng, 1) for index in range(3)]  # picked by modification time
    micro_batches = [(np.concatenate([files[0][0], files[1][0]]), np.concatenate([files[0][1], files[1][1]])),
                     files[2]]  # two partitions laid out for two workers; then one record, trained on one
    stream = (spark.readStream.schema("features array<float>, label int").option("maxFilesPerTrigger", 2)
              .parquet(str(events / "part-*")))
    optimizer = TFOptimizer.from_keras(
        classifier(), TFDataset.from_dataframe(stream, "features", "label", batch_size=32, shuffle=False),
        model_dir=str(tmp_path / "model"), num_workers=2)
    query = optimizer.optimize_stream(trigger={"availableNow": True})
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    assert [(entry["batchId"], entry["records"]) for entry in query.training_progress] == [(0, 2), (1, 1)]
    # full batches: the order of records within a micro-batch does not matter
    for got, want in zip(optimizer.model.get_weights(), reference_weights(classifier(), micro_batches, 32, 1)):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_running_scoring_query_picks_up_a_new_version_without_a_restart(spark, tmp_path):
    rng = np.random.default_rng(5)
    events, model_dir = tmp_path / "events", str(tmp_path / "model")
    x0, _ = write_events(spark, events, 0, rng, 6)
    first, second = classifier(0), classifier(1)
    publish(first, model_dir, {"batchId": 0})
    stream = event_stream(spark, events)
    scorer = TFPredictor.from_published(model_dir, TFDataset.from_dataframe(stream, "features", batch_per_thread=8))
    query = (scorer.predict_dataframe(stream, "features").writeStream.format("memory").queryName("versions")
             .trigger(processingTime="100 milliseconds").start())
    try:
        query.processAllAvailable()
        publish(second, model_dir, {"batchId": 1})
        x1, _ = write_events(spark, events, 1, rng, 6)
        query.processAllAvailable()
    finally:
        query.stop()
    got = {tuple(r.features): r.prediction[0] for r in spark.sql("select * from versions").collect()}
    for x, model in ((x0, first), (x1, second)):  # each file scored by the version newest when it arrived
        want = model.predict(x, verbose=0).reshape(-1)
        np.testing.assert_allclose([got[tuple(row)] for row in x.tolist()], want, atol=1e-6)


def test_streaming_configuration_is_refused_before_any_job(spark, tmp_path):
    rng = np.random.default_rng(3)
    write_events(spark, tmp_path / "events", 0, rng, 8)
    stream = TFDataset.from_dataframe(event_stream(spark, tmp_path / "events"), "features", "label", batch_size=4)
    with pytest.raises(ConfigurationError, match="optimize_stream"):
        TFOptimizer.from_keras(classifier(), stream, model_dir=str(tmp_path / "m")).optimize()
    with pytest.raises(ConfigurationError, match="model_dir"):
        TFOptimizer.from_keras(classifier(), stream).optimize_stream()
    with pytest.raises(ConfigurationError, match="not one Spark knows"):
        TFOptimizer.from_keras(classifier(), stream, model_dir=str(tmp_path / "m")).optimize_stream(
            trigger={"processingTim": "1 second"})
    batch = TFDataset.from_dataframe(spark.read.parquet(str(tmp_path / "events" / "part-*")), "features", "label",
                                     batch_size=4)
    with pytest.raises(ConfigurationError, match="batch one"):
        TFOptimizer.from_keras(classifier(), batch, model_dir=str(tmp_path / "m")).optimize_stream()
    with pytest.raises(Exception, match="no version is published"):
        TFPredictor.from_published(str(tmp_path / "m"), batch)


def test_one_resolver_takes_a_streams_lengths_from_the_models_inputs_the_schema_or_a_fallback(spark, tmp_path):
    from sparktf.errors import DataError
    from sparktf.inference.columns import stream_leaves
    from sparktf.inference.feeds import TensorInfo

    stream = spark.readStream.schema("features array<float>, label array<float>, n int").parquet(str(tmp_path))
    declared = [TensorInfo("x", np.dtype("float32"), (4,))]
    leaves = stream_leaves(stream, ["features", "label", "n"], declared, [None, (2,)], features=1)
    assert [(leaf.path, leaf.dtype.name, leaf.shape) for leaf in leaves] == \
        [("features", "float32", (4,)), ("label", "float32", (2,)), ("n", "int32", ())]
    assert stream_leaves(stream, ["features"], None, [(3,)])[0].shape == (3,)
    with pytest.raises(DataError, match=r"columns \['label'\] of the streaming DataFrame are not known.*or so"):
        stream_leaves(stream, ["features", "label"], declared, [None, (2, 1)], features=1, advice=", or so")
