"""DynamicEmbedding in sparktf's distributed training and scoring, on real Spark: every rank admits alike."""

import keras
import numpy as np
import pytest

from sparktf import TFDataset, TFOptimizer, TFPredictor
from sparktf.errors import ConfigurationError
from sparktf.layers import DynamicEmbedding
from sparktf.triggers import MaxIteration

CAPACITY, DIM = 64, 4


def _records(count, seed=0):
    """Ids of any value (a pool of 40, Zipf-like), their labels from a hidden per-id rule."""
    rng = np.random.default_rng(seed)
    pool = rng.integers(-2 ** 62, 2 ** 62, size=40)
    ids = pool[np.minimum(rng.zipf(1.3, size=count) - 1, 39)].astype(np.int64)
    labels = (np.abs(ids) % 3 == 0).astype(np.float32).reshape(-1, 1)
    return ids, labels


def _model(table):
    ids = keras.Input((), dtype="int64", name="ids")
    vectors = table(ids)
    output = keras.layers.Dense(1, activation="sigmoid", kernel_initializer=keras.initializers.GlorotUniform(3))(vectors)
    model = keras.Model(ids, output)
    model.compile(keras.optimizers.Adam(0.05), "binary_crossentropy")
    return model


def _dynamic_model(**options):
    return _model(DynamicEmbedding(DIM, CAPACITY, embeddings_initializer=keras.initializers.RandomUniform(seed=5),
                                   name="items", **options))


def test_two_ranks_admit_alike_and_train_as_a_fixed_table_of_the_rows_they_gave(sc):
    ids, labels = _records(240)
    dynamic = _dynamic_model()
    TFOptimizer.from_keras(dynamic, TFDataset.from_ndarrays((ids, labels), batch_size=32, shuffle=True, seed=3),
                           num_workers=2).optimize(MaxIteration(15))
    layer = dynamic.get_layer("items")
    # every id seen got a row of its own (the two ranks gave each the same one: a rank's disagreeing row would have
    # taken the other's gradients)
    assert sorted(layer.keys().tolist()) == sorted(set(ids.tolist()))
    row_of = dict(zip(np.asarray(layer.row_keys)[np.asarray(layer.row_used) > 0].tolist(),
                      np.flatnonzero(np.asarray(layer.row_used)).tolist()))
    assert layer.stats()["fallback_reads"] == 0 and layer.stats()["step"] == 15

    fixed = _model(keras.layers.Embedding(CAPACITY, DIM, embeddings_initializer=keras.initializers.RandomUniform(seed=5),
                                          name="items"))
    rows = np.array([row_of[i] for i in ids.tolist()], np.int64)
    TFOptimizer.from_keras(fixed, TFDataset.from_ndarrays((rows, labels), batch_size=32, shuffle=True, seed=3),
                           num_workers=2).optimize(MaxIteration(15))
    np.testing.assert_allclose(layer.embeddings.numpy(), fixed.get_layer("items").embeddings.numpy(), atol=1e-5)
    np.testing.assert_allclose(dynamic.layers[-1].kernel.numpy(), fixed.layers[-1].kernel.numpy(), atol=1e-5)

    # scored on the executors as in this process, the unknown ids from the fallback rows
    unknown = np.array([7, 8, 9], np.int64)
    scored = np.concatenate([ids[:20], unknown])
    predictor = TFPredictor.from_keras(dynamic, TFDataset.from_ndarrays(scored, batch_size=8))
    np.testing.assert_allclose(np.concatenate(predictor.predict().collect()).reshape(-1),
                               dynamic.predict(scored, verbose=0).reshape(-1), atol=1e-5)


def test_eviction_runs_at_a_segments_end_alike_on_every_rank(sc):
    first, labels = _records(64, seed=1)
    later = first + 1  # other ids: the first ones go unseen
    model = _dynamic_model(evict={"ttl_steps": 3})  # the later ids, seen in steps 5-8, stay
    for part in (first, later):
        optimizer = TFOptimizer.from_keras(model, TFDataset.from_ndarrays((part, labels), batch_size=16),
                                           num_workers=2)
        optimizer.optimize(MaxIteration(optimizer.iteration + 4))
    layer = model.get_layer("items")
    assert set(layer.keys().tolist()) == set(later.tolist())  # the first part's ids were not seen for 4 steps
    assert layer.stats()["evicted"] == len(set(first.tolist()))


def test_a_dynamic_table_named_to_be_sharded_is_refused_with_the_reason(sc):
    ids, labels = _records(32)
    model = _dynamic_model()
    with pytest.raises(ConfigurationError, match="DynamicEmbedding.*replicated"):
        TFOptimizer.from_keras(model, TFDataset.from_ndarrays((ids, labels), batch_size=16), num_workers=2,
                               sharded_tables=["items"])


def test_a_stream_admits_new_ids_evicts_stale_ones_at_micro_batch_ends_and_reports_them(spark, tmp_path):
    import os

    events, model_dir = str(tmp_path / "events"), str(tmp_path / "model")
    parts = []
    for index, seed in enumerate((2, 3)):
        ids, labels = _records(32, seed)
        ids = ids + index  # the second micro-batch's ids are others
        parts.append(ids)
        rows = [(int(i), float(label)) for i, label in zip(ids, labels.reshape(-1))]
        spark.createDataFrame(rows, "item long, label float").coalesce(1).write.parquet(
            os.path.join(events, f"part-{index}"))
    stream = spark.readStream.schema("item long, label float").option("maxFilesPerTrigger", 1).parquet(
        os.path.join(events, "part-*"))
    model = _dynamic_model(evict={"ttl_steps": 1})  # a micro-batch is 2 steps: the first one's ids go stale
    optimizer = TFOptimizer.from_keras(model, TFDataset.from_dataframe(stream, "item", "label", batch_size=16,
                                                                       shuffle=False),
                                       model_dir=model_dir, num_workers=1)
    query = optimizer.optimize_stream(trigger={"availableNow": True})
    query.awaitTermination(600)
    assert query.exception() is None, query.exception()
    first, second = (entry["dynamic_tables"]["items"] for entry in query.training_progress)
    assert first["rows"] == len(set(parts[0].tolist())) and first["evicted"] == 0
    assert second["evicted"] == len(set(parts[0].tolist())) and second["rows"] == len(set(parts[1].tolist()))
    assert set(model.get_layer("items").keys().tolist()) == set(parts[1].tolist())


def test_a_checkpoint_of_two_ranks_resumes_on_one_with_the_same_keys_rows_slots_and_counters(sc, tmp_path):
    ids, labels = _records(96, seed=4)
    dataset = TFDataset.from_ndarrays((ids, labels), batch_size=16, shuffle=True, seed=5)
    model_dir = str(tmp_path / "run")
    trained = _dynamic_model(admit_after=2, evict={"lfu": 0.5})
    TFOptimizer.from_keras(trained, dataset, model_dir=model_dir, num_workers=2).optimize(MaxIteration(6))
    resumed = _dynamic_model(admit_after=2, evict={"lfu": 0.5})
    continued = TFOptimizer.from_keras(resumed, dataset, model_dir=model_dir, num_workers=1)
    continued.load_checkpoint()
    for got, want in zip(resumed.get_weights() + resumed.optimizer.variables, trained.get_weights()
                         + trained.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))  # keys, rows, sketch, counts, slots
    assert resumed.get_layer("items").stats() == trained.get_layer("items").stats()
    continued.optimize(MaxIteration(9))  # and it trains on from there, on one rank
    assert resumed.get_layer("items").stats()["step"] == 9
