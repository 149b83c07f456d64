"""optimize_stream's resident training job: staged micro-batches trained by one long-lived job, exactly once.

The shared session is ``local[2]``: one training worker leaves a slot for the
stream's own jobs, so these tests run the resident job with ``num_workers=1``
(``bench_stream.py`` runs it with 2 workers in ``local[4]``).
"""

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

from sparktf import TFDataset, TFOptimizer
from sparktf.data.staged_batches import staged_batches, staging_root
from sparktf.training.checkpoint import latest_checkpoint, load_checkpoint
from test_streaming import WIDTH, classifier, event_stream, reference_weights, write_events


def stream_optimizer(spark, events, model_dir, model=None, batch_size=16):
    dataset = TFDataset.from_dataframe(event_stream(spark, events), "features", "label", batch_size=batch_size,
                                       shuffle=False)
    return TFOptimizer.from_keras(model or classifier(), dataset, model_dir=model_dir, num_workers=1)


def evaluated_before_each(micro_batches, batch_size):
    """Keras' own evaluate of each micro-batch with the weights from before it, training as one worker does."""
    model, metrics = classifier(), []
    for x, y in micro_batches:
        metrics.append(model.evaluate(x, y.reshape(-1, 1).astype(np.float32), batch_size=64, verbose=0,
                                      return_dict=True))
        reference_weights(model, [(x, y)], batch_size, 1)
    return metrics


def resume_trains_the_rest_exactly(spark, events, model_dir, micro_batches, batch_size, first):
    """A query restarted on ``model_dir`` with a fresh model trains micro-batches ``first``... once each: the weights
    equal one uninterrupted pass over all of them, and nothing stays staged."""
    resumed = stream_optimizer(spark, events, model_dir, batch_size=batch_size)
    query = resumed.optimize_stream(trigger={"availableNow": True})
    query.awaitTermination(600)
    assert query.exception() is None, query.exception()
    assert [entry["batchId"] for entry in query.training_progress] == list(range(first, len(micro_batches)))
    for got, want in zip(resumed.model.get_weights(), reference_weights(classifier(), micro_batches, batch_size, 1)):
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert staged_batches(staging_root(model_dir)) == []


def test_a_resident_job_trains_each_micro_batch_once_tested_before_it_and_leaves_nothing_staged(spark, tmp_path,
                                                                                              caplog):
    rng = np.random.default_rng(11)
    events, model_dir = tmp_path / "events", str(tmp_path / "model")
    micro_batches = [write_events(spark, events, index, rng, 37) for index in range(3)]
    optimizer = stream_optimizer(spark, events, model_dir)
    with caplog.at_level(logging.INFO, logger="sparktf.optimizer"):
        query = optimizer.optimize_stream(trigger={"availableNow": True}, publish_every=1)
        query.awaitTermination(600)
    assert query.exception() is None, query.exception()
    assert "trains in a resident job of 1 workers" in caplog.text
    progress = query.training_progress
    assert [(entry["batchId"], entry["records"], entry["iteration"]) for entry in progress] == [
        (0, 37, 3), (1, 37, 6), (2, 37, 9)]
    assert [entry["version"] for entry in progress] == [1, 2, 3]
    for got, want in zip(optimizer.model.get_weights(), reference_weights(classifier(), micro_batches, 16, 1)):
        np.testing.assert_allclose(got, want, atol=1e-5)
    # test-then-train inside the training job equals a separate evaluation with the weights from before
    for entry, want in zip(progress, evaluated_before_each(micro_batches, 16)):
        assert entry["test_loss"] == pytest.approx(want["loss"], abs=1e-5)
        assert entry["test_auc"] == pytest.approx(want["auc"], abs=1e-4)
    assert load_checkpoint(latest_checkpoint(model_dir)).stream[1] == 2
    assert staged_batches(staging_root(model_dir)) == []


def test_a_driver_killed_with_a_micro_batch_staged_and_untrained_trains_it_at_the_restart(spark, tmp_path):
    rng = np.random.default_rng(12)
    events, model_dir = tmp_path / "events", str(tmp_path / "model")
    micro_batches = [write_events(spark, events, index, rng, 37) for index in range(4)]
    program = os.path.join(os.path.dirname(__file__), "programs", "stream_driver.py")
    # dies in foreachBatch of micro-batch 2 after staging it: staged, untrained, not committed by Spark
    killed = subprocess.run([sys.executable, program, str(events), model_dir, "2", "--workers", "1", "--when", "begin"],
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr[-3000:]
    staged = [batch.batch_id for batch in staged_batches(staging_root(model_dir))]
    assert 2 in staged
    checkpoint = latest_checkpoint(model_dir)
    trained = -1 if checkpoint is None else load_checkpoint(checkpoint).stream[1]
    # what no checkpoint records is staged (and maybe one whose checkpoint was written just before the kill)
    assert [batch_id for batch_id in staged if batch_id > trained] == list(range(trained + 1, 3))

    resume_trains_the_rest_exactly(spark, events, model_dir, micro_batches, 64, trained + 1)


def test_a_resident_job_of_two_ranks_trains_and_tests_as_one_pass_of_the_global_batches(tmp_path, spark):
    rng = np.random.default_rng(22)
    events, model_dir = tmp_path / "events", str(tmp_path / "model")
    micro_batches = [write_events(spark, events, index, rng, 37) for index in range(3)]
    program = os.path.join(os.path.dirname(__file__), "programs", "stream_driver.py")
    # a session of its own with a slot beside the 2 ranks; the test's session writes the files only
    ran = subprocess.run([sys.executable, program, str(events), model_dir, "-1", "--workers", "2", "--master",
                          "local[3]", "--batch-size", "16"], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr[-3000:]
    progress = [json.loads(line.split(" ", 1)[1]) for line in ran.stdout.splitlines() if line.startswith("PROGRESS ")]
    assert [entry["batchId"] for entry in progress] == [0, 1, 2] and all("staging_seconds" in e for e in progress)
    trained = load_checkpoint(latest_checkpoint(model_dir))
    model = classifier()
    trained.apply_to(model)
    for got, want in zip(model.get_weights(), reference_weights(classifier(), micro_batches, 16, 2)):
        np.testing.assert_allclose(got, want, atol=1e-5)
    before, tested = classifier(), []  # the test pass: both ranks' shares, with the weights from before each pass
    for x, y in micro_batches:
        tested.append(before.evaluate(x, y.reshape(-1, 1).astype(np.float32), verbose=0, return_dict=True))
        reference_weights(before, [(x, y)], 16, 2)
    for entry, want in zip(progress, tested):
        assert entry["test_loss"] == pytest.approx(want["loss"], abs=1e-5)


class DiesOnce(keras.layers.Layer):
    """Identity; the process running the ``die_at``-th training step it counts (over every process, in ``folder``)
    SIGKILLs itself, once: a lost executor's Python worker."""

    def __init__(self, folder, die_at, **kwargs):
        super().__init__(**kwargs)
        self.folder, self.die_at = folder, die_at

    def call(self, inputs, training=None):
        if not training:
            return inputs

        def run(values):
            with open(os.path.join(self.folder, "steps"), "a") as steps:
                steps.write(".")
            done = os.path.join(self.folder, "died")
            if os.path.getsize(os.path.join(self.folder, "steps")) >= self.die_at and not os.path.exists(done):
                open(done, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            return values

        out = tf.py_function(run, [inputs], tf.float32)
        out.set_shape(inputs.shape)
        return out

    def get_config(self):
        return {**super().get_config(), "folder": self.folder, "die_at": self.die_at}


def dies_once_model(folder, die_at):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((WIDTH,)), DiesOnce(folder, die_at), keras.layers.Dense(3, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(keras.optimizers.SGD(0.5), "binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    return model


def test_a_rank_lost_in_the_middle_of_a_pass_is_relaunched_and_trains_that_micro_batch_from_its_start(spark,
                                                                                                   tmp_path):
    rng = np.random.default_rng(13)
    events, model_dir = tmp_path / "events", str(tmp_path / "model")
    micro_batches = [write_events(spark, events, index, rng, 37) for index in range(3)]
    # the warm-up's step, 3 of micro-batch 0, then the second of micro-batch 1
    optimizer = stream_optimizer(spark, events, model_dir, dies_once_model(str(tmp_path), 1 + 3 + 2))
    query = optimizer.optimize_stream(trigger={"availableNow": True})
    query.awaitTermination(600)
    assert query.exception() is None, query.exception()
    assert os.path.exists(tmp_path / "died")
    assert [entry["batchId"] for entry in query.training_progress] == [0, 1, 2]
    assert optimizer.iteration == 9
    for got, want in zip(optimizer.model.get_weights(), reference_weights(classifier(), micro_batches, 16, 1)):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_back_pressure_bounds_the_staged_micro_batches_and_a_stopped_query_resumes_exactly(spark, tmp_path):
    rng = np.random.default_rng(14)
    events, model_dir = tmp_path / "events", str(tmp_path / "model")
    micro_batches = [write_events(spark, events, index, rng, 37) for index in range(6)]
    optimizer = stream_optimizer(spark, events, model_dir)
    two_trained = threading.Event()
    seen = keras.callbacks.LambdaCallback(on_epoch_end=lambda batch_id, logs: batch_id >= 1 and two_trained.set())
    query = optimizer.optimize_stream(trigger={"processingTime": "100 milliseconds"}, max_staged=1,
                                      callbacks=[seen])
    try:
        assert two_trained.wait(300), query.exception()
    finally:
        query.stop()
    progress = query.training_progress
    assert all(entry["backlog"] <= 1 for entry in progress)
    last = progress[-1]["batchId"]
    assert load_checkpoint(latest_checkpoint(model_dir)).stream[1] == last
    assert [entry["batchId"] for entry in progress] == list(range(last + 1))
    left = [batch.batch_id for batch in staged_batches(staging_root(model_dir))]
    assert left == list(range(last + 1, last + 1 + len(left))) and len(left) <= 1

    resume_trains_the_rest_exactly(spark, events, model_dir, micro_batches, 16, last + 1)


def test_a_session_without_a_slot_to_spare_trains_a_job_per_micro_batch_and_says_so_once(spark, tmp_path, caplog):
    rng = np.random.default_rng(15)
    write_events(spark, tmp_path / "events", 0, rng, 8)
    dataset = TFDataset.from_dataframe(event_stream(spark, tmp_path / "events"), "features", "label", batch_size=4)
    optimizer = TFOptimizer.from_keras(classifier(), dataset, model_dir=str(tmp_path / "model"), num_workers=2)
    with caplog.at_level(logging.INFO, logger="sparktf.optimizer"):
        query = optimizer.optimize_stream(trigger={"availableNow": True})
        query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    said = [r.getMessage() for r in caplog.records if "jobs of its own" in r.getMessage()]
    assert len(said) == 1 and "2 task slots leave none beside the 2 training workers" in said[0]
    assert [entry["records"] for entry in query.training_progress] == [8]


def ncf_model(users, items):
    keras.utils.set_random_seed(3)
    user, item = keras.Input((), dtype="int32"), keras.Input((), dtype="int32")
    joined = keras.layers.Concatenate()([keras.layers.Embedding(users, 4)(user), keras.layers.Embedding(items, 4)(item)])
    model = keras.Model([user, item], keras.layers.Dense(1, activation="sigmoid")(joined))
    model.compile(keras.optimizers.SGD(0.5), "binary_crossentropy")
    return model


def test_delta_versions_hold_the_changed_rows_load_as_full_ones_and_publish_if_gates_them(spark, tmp_path):
    from sparktf import TFPredictor
    from sparktf.models.published import load_version, read_version, versions

    rng = np.random.default_rng(16)
    events, model_dir, users, items = tmp_path / "events", str(tmp_path / "model"), 500, 50
    for index in range(7):  # each micro-batch touches a few of the 500 users' rows
        user, item = rng.integers(0, 20, 16) + 20 * index, rng.integers(0, items, 16)
        spark.createDataFrame([(int(u), int(i), int((u + i) % 2)) for u, i in zip(user, item)],
                              "user int, item int, label int").coalesce(1).write.parquet(str(events / f"part-{index}"))
    stream = (spark.readStream.schema("user int, item int, label int").option("maxFilesPerTrigger", 1)
              .parquet(str(events / "part-*")))
    dataset = TFDataset.from_dataframe(stream, ["user", "item"], "label", batch_size=8, shuffle=False)
    optimizer = TFOptimizer.from_keras(ncf_model(users, items), dataset, model_dir=model_dir, num_workers=1,
                                       keep_checkpoints=2)
    published, gated = [], []

    def check_version(batch_id, logs):
        if batch_id >= 2:  # the version just published loads as the model stands
            version = read_version(model_dir, versions(model_dir)[-1])
            published.append((version, os.path.getsize(version.files[0])))
            for got, want in zip(load_version(version).get_weights(), optimizer.model.get_weights()):
                np.testing.assert_array_equal(got, want)

    query = optimizer.optimize_stream(
        trigger={"availableNow": True}, publish_every=1, full_every=3,
        publish_if=lambda metrics: gated.append(metrics) or len(gated) > 2,
        callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=check_version)])
    query.awaitTermination(600)
    assert query.exception() is None, query.exception()
    assert [entry.get("publish_refused", False) for entry in query.training_progress] == [True, True] + [False] * 5
    assert {"loss", "test_loss", "records"} <= set(gated[0])
    assert [(version.version, version.full) for version, _ in published] == [(1, 1), (2, 1), (3, 1), (4, 4), (5, 4)]
    assert published[1][1] < published[0][1] / 3  # a delta's bytes against a full version's
    assert versions(model_dir) == [4, 5]  # keep_checkpoints=2: 1-3 went once 4 and 5 needed none of them
    frame = spark.read.parquet(str(events / "part-*"))
    scorer = TFPredictor.from_published(model_dir, TFDataset.from_dataframe(frame, ["user", "item"],
                                                                            batch_per_thread=16))
    rows = scorer.predict_dataframe(frame, ["user", "item"]).collect()
    want = optimizer.model.predict([np.array([r.user for r in rows]), np.array([r.item for r in rows])], verbose=0)
    np.testing.assert_allclose([r.prediction[0] for r in rows], want.reshape(-1), atol=1e-6)


@pytest.mark.parametrize("resident", [True, False], ids=["resident", "jobs"])
def test_a_bad_record_stops_the_training_query_naming_the_micro_batch_column_and_row(spark, tmp_path, resident):
    rng = np.random.default_rng(17)
    write_events(spark, tmp_path / "events", 0, rng, 8)
    write_events(spark, tmp_path / "events", 1, rng, 8, null_row=5)
    optimizer = stream_optimizer(spark, tmp_path / "events", str(tmp_path / "model"), batch_size=4)
    query = optimizer.optimize_stream(trigger={"availableNow": True}, resident=resident)
    with pytest.raises(Exception):
        query.awaitTermination(300)
    text = str(query.exception())
    assert "DataError" in text and "column 'features'" in text and "row 5" in text
    bad_file = next(name for name in os.listdir(tmp_path / "events" / "part-1") if name.endswith(".parquet"))
    assert re.search(r"micro-batch 1, file \S+/events/part-1/" + re.escape(bad_file) + ": ", text), text
    # micro-batch 0 trained, or (a resident job stopped with the query before it) stays staged for the next start
    trained = [entry["batchId"] for entry in query.training_progress]
    staged = [batch.batch_id for batch in staged_batches(staging_root(str(tmp_path / "model")))]
    assert sorted(trained + staged) == [0]


def test_each_scored_row_names_its_version_and_a_version_with_other_inputs_is_refused_by_name(spark, tmp_path):
    from sparktf import TFPredictor
    from sparktf.errors import ConfigurationError
    from sparktf.models.published import publish

    rng = np.random.default_rng(18)
    write_events(spark, tmp_path / "events", 0, rng, 6)
    model_dir = str(tmp_path / "model")
    first, second = classifier(0), classifier(1)
    publish(first, model_dir, {"batchId": 0})
    frame = spark.read.parquet(str(tmp_path / "events" / "part-*"))
    scorer = TFPredictor.from_published(model_dir, TFDataset.from_dataframe(frame, "features", batch_per_thread=8),
                                        version_col="version")
    x = np.array([r.features for r in frame.collect()], np.float32)
    for model, number in ((first, 1), (second, 2)):
        rows = scorer.predict_dataframe(frame, "features").collect()
        assert {row.version for row in rows} == {number}
        got = {tuple(row.features): row.prediction[0] for row in rows}
        np.testing.assert_allclose([got[tuple(v)] for v in x.tolist()], model.predict(x, verbose=0).reshape(-1),
                                   atol=1e-6)
        publish(second, model_dir, {"batchId": 1})
    with pytest.raises(ConfigurationError, match="version_col 'features' names a column"):
        TFPredictor.from_published(model_dir, TFDataset.from_dataframe(frame, "features", batch_per_thread=8),
                                   version_col="features").predict_dataframe(frame, "features")
    with pytest.raises(ConfigurationError, match=r"keywords \['temperature'\] go to the model's method"):
        TFPredictor.from_published(model_dir, TFDataset.from_dataframe(frame, "features"), temperature=0.5)
    wider = keras.Sequential([keras.Input((WIDTH + 1,)), keras.layers.Dense(1, activation="sigmoid")])
    publish(wider, model_dir, {"batchId": 2})  # a version that takes other inputs than the scorer's
    with pytest.raises(Exception, match="every version must keep the inputs and outputs of the first"):
        scorer.predict_dataframe(frame, "features").collect()


def test_another_querys_checkpoint_location_on_a_trained_model_is_refused_unless_it_continues_the_model(spark,
                                                                                                       tmp_path):
    from sparktf.errors import ConfigurationError

    rng = np.random.default_rng(19)
    events, model_dir = tmp_path / "events", str(tmp_path / "model")
    micro_batches = [write_events(spark, events, index, rng, 16) for index in range(2)]
    query = stream_optimizer(spark, events, model_dir).optimize_stream(trigger={"availableNow": True})
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    first_query, other = query.id, str(tmp_path / "other-query")
    with pytest.raises(ConfigurationError) as refused:
        stream_optimizer(spark, events, model_dir).optimize_stream(trigger={"availableNow": True},
                                                                   checkpoint_location=other)
    for named in (first_query, repr(os.path.join(model_dir, "stream")), repr(other), "a new query",
                  "continue_model=True"):
        assert named in str(refused.value)
    continued = stream_optimizer(spark, events, model_dir)
    query = continued.optimize_stream(trigger={"availableNow": True}, checkpoint_location=other, continue_model=True)
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    assert [entry["batchId"] for entry in query.training_progress] == [0, 1]  # the new query's, as asked
    assert continued.iteration == 4
    for got, want in zip(continued.model.get_weights(), reference_weights(classifier(), micro_batches * 2, 16, 1)):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_driver_killed_while_publishing_a_version_publishes_it_at_the_restart_and_keeps_the_cadence(spark,
                                                                                                      tmp_path):
    from sparktf.models.published import load_version, read_version, versions

    rng = np.random.default_rng(20)
    events, model_dir = tmp_path / "events", str(tmp_path / "model")
    micro_batches = [write_events(spark, events, index, rng, 16) for index in range(5)]
    program = os.path.join(os.path.dirname(__file__), "programs", "stream_driver.py")
    # a job per micro-batch, a version every 2: the driver dies writing micro-batch 3's, after its checkpoint
    killed = subprocess.run([sys.executable, program, str(events), model_dir, "3", "--when", "publish",
                             "--publish-every", "2"], capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr[-3000:]
    assert load_checkpoint(latest_checkpoint(model_dir)).stream[1] == 3
    assert [read_version(model_dir, n).manifest["batchId"] for n in versions(model_dir)] == [1]

    dataset = TFDataset.from_dataframe(event_stream(spark, events), "features", "label", batch_size=64,
                                       shuffle=False)
    resumed = TFOptimizer.from_keras(classifier(), dataset, model_dir=model_dir, num_workers=2)
    query = resumed.optimize_stream(trigger={"availableNow": True}, publish_every=2)
    query.awaitTermination(600)
    assert query.exception() is None, query.exception()
    assert [entry["batchId"] for entry in query.training_progress] == [4]
    # micro-batch 3's version at the restart, then the cadence goes on from it: 5 would be next, not 4
    assert [read_version(model_dir, n).manifest["batchId"] for n in versions(model_dir)] == [1, 3]
    assert "version" not in query.training_progress[0]
    third = read_version(model_dir, 2)
    expected = reference_weights(classifier(), micro_batches[:4], 64, 2)
    for got, want in zip(load_version(third).get_weights(), expected):
        np.testing.assert_allclose(got, want, atol=1e-5)
