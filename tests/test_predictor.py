"""TFPredictor: order, batching, several inputs/outputs, SavedModels, DataFrames, caching, errors."""

import os
import re

import numpy as np
import keras
import pytest
import tensorflow as tf

from conftest import save_module_with_two_signatures
from sparktf.models import cache as model_cache
from sparktf.dataset import TFDataset
from sparktf.errors import DataError
from sparktf.predictor import TFPredictor
from sparktf.spark.remote_errors import reraise_remote
from sparktf.spark.sessions import session_kind


def _dense_model(inputs=4, units=3, seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(units)])


def _features(ids):
    ids = np.asarray(ids, dtype="float32")
    return np.stack([ids, ids * 0.5, -ids, np.sqrt(ids)], axis=1)


class Squares(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="x")])
    def powers(self, x):
        return {"sq": x * x, "cube": x * x * x}


class JpegStats(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="jpeg")])
    def stats(self, jpeg):
        images = tf.map_fn(lambda b: tf.io.decode_jpeg(b, channels=3), jpeg, fn_output_signature=tf.uint8)
        return {"mean": tf.reduce_mean(tf.cast(images, tf.float32), axis=[1, 2, 3])}


class TextLength(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def length(self, text):
        return {"bytes": tf.strings.length(text)}


@pytest.fixture(scope="module")
def squares_dir(tmp_path_factory):
    module = Squares()
    return save_module_with_two_signatures(module, module.powers, tmp_path_factory.mktemp("squares"))


def test_order_count_and_partitioning_with_uneven_partitions(sc):
    ids = [i for i in range(103) if i < 30 or i % 3 == 0]
    rdd = sc.parallelize(list(_features(range(103))), 4).filter(lambda x: x[0] < 30 or x[0] % 3 == 0)
    dataset = TFDataset.from_rdd(rdd, features=(tf.float32, [4]), batch_per_thread=8)
    model = _dense_model()
    predictions = TFPredictor.from_keras(model, dataset).predict()

    partitions = predictions.glom().collect()
    assert [len(p) for p in partitions] == dataset.partition_counts
    assert len(set(dataset.partition_counts)) > 1  # uneven
    got = np.stack([row for partition in partitions for row in partition])
    np.testing.assert_allclose(got, model.predict(_features(ids), verbose=0), rtol=1e-5, atol=1e-6)


def test_squaring_saved_model_sums_exactly_with_one_record_batches(sc, squares_dir):
    # 1000 records in 3 partitions (333, 333, 334) and batches of 111: the last batch has 1 record.
    dataset = TFDataset.from_rdd(sc.parallelize(range(1000), 3), features=(tf.int64, []), batch_per_thread=111)
    predictions = TFPredictor.from_saved_model(squares_dir, dataset, outputs="sq").predict()
    values = predictions.collect()
    assert all(isinstance(v, np.ndarray) and v.shape == () for v in values)
    assert sum(int(v) for v in values) == sum(i * i for i in range(1000))


def test_saved_model_signature_and_output_selection(sc, squares_dir):
    dataset = TFDataset.from_rdd(sc.parallelize(range(5), 2), features=(tf.int64, []), batch_per_thread=2)
    as_dict = TFPredictor.from_saved_model(squares_dir, dataset, signature="other").predict().collect()
    assert [(int(r["sq"]), int(r["cube"])) for r in as_dict] == [(i * i, i**3) for i in range(5)]
    as_list = TFPredictor.from_saved_model(squares_dir, dataset, outputs=["cube", "sq"]).predict().collect()
    assert all(isinstance(v, np.ndarray) for r in as_list for v in r)
    assert [[int(v) for v in r] for r in as_list] == [[i**3, i * i] for i in range(5)]

    with pytest.raises(DataError, match=r"no signature 'nope'.*\['other', 'serving_default'\]"):
        TFPredictor.from_saved_model(squares_dir, dataset, signature="nope")
    with pytest.raises(DataError, match=r"no output.*\['cube', 'sq'\]"):
        TFPredictor.from_saved_model(squares_dir, dataset, outputs=["square"])


def test_multi_input_list_and_dict_outputs(sc):
    a, b = keras.Input((4,), name="a"), keras.Input((2,), name="b")
    joined = keras.layers.Concatenate()([a, b])
    outputs = {"score": keras.layers.Dense(1)(joined), "embedding": keras.layers.Dense(3)(joined)}
    dict_model = keras.Model([a, b], outputs)
    list_model = keras.Model([a, b], [outputs["score"], outputs["embedding"]])

    rng = np.random.default_rng(0)
    xa, xb = rng.normal(size=(21, 4)).astype("float32"), rng.normal(size=(21, 2)).astype("float32")
    records = sc.parallelize([[xa[i], xb[i]] for i in range(21)], 3)
    dataset = TFDataset.from_rdd(records, features=[(tf.float32, [4]), (tf.float32, [2])], batch_per_thread=5)
    expected = dict_model.predict([xa, xb], verbose=0)

    by_dict = TFPredictor.from_keras(dict_model, dataset).predict().collect()
    np.testing.assert_allclose(np.stack([r["score"] for r in by_dict]), expected["score"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.stack([r["embedding"] for r in by_dict]), expected["embedding"], rtol=1e-5, atol=1e-6)
    by_list = TFPredictor.from_keras(list_model, dataset).predict().collect()
    assert all(isinstance(r, list) and len(r) == 2 for r in by_list)
    np.testing.assert_allclose(np.stack([r[1] for r in by_list]), expected["embedding"], rtol=1e-5, atol=1e-6)


def test_dict_features_feed_inputs_by_name(sc):
    a, b = keras.Input((1,), name="a"), keras.Input((1,), name="b")
    model = keras.Model({"b": b, "a": a}, keras.layers.Subtract()([a, b]))
    records = sc.parallelize([{"a": [float(i)], "b": [1.0]} for i in range(6)], 2)
    dataset = TFDataset.from_rdd(records, features={"a": (tf.float32, [1]), "b": (tf.float32, [1])}, batch_per_thread=4)
    values = TFPredictor.from_keras(model, dataset).predict().collect()
    assert [float(v[0]) for v in values] == [i - 1.0 for i in range(6)]


def test_predict_dataframe_round_trip(spark):
    import pandas as pd
    from pyspark.ml.linalg import Vectors

    ids = np.arange(45)
    x = _features(ids)
    pdf = pd.DataFrame({"id": ids, "label": ids % 2, "features": [row.astype("float64").tolist() for row in x]})
    df = spark.createDataFrame(pdf).repartition(3).sortWithinPartitions("id")
    model = _dense_model()
    dataset = TFDataset.from_ndarrays(x, batch_per_thread=4)
    predictor = TFPredictor.from_keras(model, dataset)

    out = predictor.predict_dataframe(df, "features")
    assert out.columns == ["id", "label", "features", "prediction"]
    assert out.schema["prediction"].dataType.simpleString() == "array<float>"
    rows = out.collect()
    assert [r.id for r in rows] == [r.id for r in df.collect()]
    got = np.array([r.prediction for r in sorted(rows, key=lambda r: r.id)])
    np.testing.assert_allclose(got, model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    assert sorted(r.label for r in rows) == sorted(ids % 2)

    vectors = spark.createDataFrame([(int(i), Vectors.dense(x[i].tolist())) for i in ids], ["id", "v"])
    by_vector = {r.id: r.p for r in predictor.predict_dataframe(vectors, ["v"], output_col="p").collect()}
    np.testing.assert_allclose(np.array([by_vector[i] for i in ids]), model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)


def test_predict_dataframe_several_outputs_is_a_struct(spark, squares_dir):
    df = spark.range(10).selectExpr("id", "id AS x")
    dataset = TFDataset.from_ndarrays(np.arange(10), batch_per_thread=3)
    out = TFPredictor.from_saved_model(squares_dir, dataset).predict_dataframe(df, "x", output_col="powers")
    assert out.schema["powers"].dataType.simpleString() == "struct<cube:bigint,sq:bigint>"
    assert sorted((r.id, r.powers.sq, r.powers.cube) for r in out.collect()) == [(i, i * i, i**3) for i in range(10)]
    with pytest.raises(DataError, match="already exists"):
        TFPredictor.from_saved_model(squares_dir, dataset).predict_dataframe(df, "x", output_col="id")


def test_predict_dataframe_feeds_string_and_binary_columns_to_a_string_input(spark, sc, tmp_path):
    path = str(tmp_path / "length")
    module = TextLength()
    tf.saved_model.save(module, path, signatures={"serving_default": module.length})
    texts = ["héllo", "", "a b", "日本", "x" * 40]
    blobs = [bytearray(b"\x00\xff\x01"), bytearray(), bytearray(b"jpeg?"), bytearray(b"\n"), bytearray(b"ab")]
    df = spark.createDataFrame(list(zip(range(5), texts, blobs)), "id int, text string, blob binary")
    dataset = TFDataset.from_string_rdd(sc.parallelize(["any"]), batch_per_thread=2)
    predictor = TFPredictor.from_saved_model(path, dataset)

    by_text = predictor.predict_dataframe(df, "text", output_col="n")
    assert by_text.schema["n"].dataType.simpleString() == "int"
    assert sorted((r.id, r.n) for r in by_text.collect()) == [(i, len(t.encode())) for i, t in enumerate(texts)]
    by_blob = predictor.predict_dataframe(df, ["blob"], output_col="n").collect()
    assert sorted((r.id, r.n) for r in by_blob) == [(i, len(b)) for i, b in enumerate(blobs)]

    with pytest.raises(DataError, match=r"feature id \(int32 .* does not fit model input 'text' string \[\]"):
        predictor.predict_dataframe(df, "id")
    with_null = spark.createDataFrame([("a",), ("b",), (None,)], "text string").coalesce(1)
    with pytest.raises(Exception) as raised:  # Spark's PythonException: the DataError is its last line
        predictor.predict_dataframe(with_null, "text").collect()
    last_line = str(raised.value).strip().splitlines()[-1]
    assert re.match(r"sparktf\.errors\.DataError: column 'text', partition 0, row 2 .* null", last_line), last_line
    with pytest.raises(DataError, match=r"column 'text', partition 0, row 2 .* null"), reraise_remote(session_kind(spark)):
        predictor.predict_dataframe(with_null, "text").collect()


def test_keras_model_with_a_string_input_on_an_rdd_and_a_dataframe(spark, sc):
    text = keras.Input((), dtype="string", name="text")
    length = keras.layers.Lambda(lambda s: tf.cast(tf.strings.length(s), "float32"), output_shape=())(text)
    model = keras.Model(text, length)
    words = ["a", "héllo", "", "spark", "日本"]
    expected = [float(len(w.encode())) for w in words]
    predictor = TFPredictor.from_keras(model, TFDataset.from_string_rdd(sc.parallelize(words, 2), batch_per_thread=2))
    assert [float(v) for v in predictor.predict().collect()] == expected
    df = spark.createDataFrame(list(enumerate(words)), "id int, text string")
    assert [r.prediction for r in predictor.predict_dataframe(df, "text").orderBy("id").collect()] == expected


def test_loaded_model_is_frozen_out_of_the_workers_garbage_collections(sc):
    dataset = TFDataset.from_ndarrays(_features(range(8)), batch_per_thread=4, num_partitions=2)

    def frozen_objects(records):
        import gc

        yield sum(1 for _ in records), gc.get_freeze_count()

    rows = TFPredictor.from_keras(_dense_model(seed=5), dataset).predict().mapPartitions(frozen_objects).collect()
    assert sum(n for n, _ in rows) == 8
    assert all(frozen > 10_000 for _, frozen in rows), rows  # TensorFlow, Keras and the model


def test_a_load_frees_cycles_that_earlier_frozen_loads_left_behind_once_the_frozen_objects_grew_by_a_quarter():
    import gc
    import weakref

    from sparktf import process_state
    from sparktf.spark.worker_gc import frozen_after

    class Node:
        pass

    def cyclic_model():
        node = Node()
        node.itself = node
        return node

    try:
        process_state.reset()  # forgets the last full collection: the first load collects in full
        model = frozen_after(cyclic_model)()
        evicted = weakref.ref(model)
        del model
        gc.collect()
        assert evicted() is not None  # frozen: full collections skip it
        frozen_after(lambda: None)()  # a small load only freezes its own objects (about 1 ms, not a full collection)
        assert evicted() is not None
        grown = frozen_after(lambda: [Node() for _ in range(gc.get_freeze_count() // 3)])()  # a third more objects
        assert evicted() is None and len(grown) > 0
    finally:
        gc.unfreeze()
        process_state.reset()


def test_model_is_loaded_once_per_worker_and_reused_across_jobs(sc):
    labelled = (_features(range(40)), np.arange(40))  # labels are ignored by prediction
    dataset = TFDataset.from_ndarrays(labelled, batch_per_thread=8, num_partitions=4)
    predictor = TFPredictor.from_keras(_dense_model(seed=3), dataset)

    def loads_after_predicting(records):
        yield os.getpid(), sum(1 for _ in records), model_cache.load_count()

    first = predictor.predict().mapPartitions(loads_after_predicting).collect()
    second = predictor.predict().mapPartitions(loads_after_predicting).collect()
    assert sum(n for _, n, _ in first) == sum(n for _, n, _ in second) == 40
    after_first = {pid: loads for pid, _, loads in first}
    reused = [(pid, loads) for pid, _, loads in second if pid in after_first]
    assert reused, "no Python worker served both jobs"
    for pid, loads in reused:
        assert loads == after_first[pid], f"worker {pid} loaded the model again"


def test_bytes_input_decodes_jpeg(sc, tmp_path):
    path = str(tmp_path / "jpeg")
    module = JpegStats()
    tf.saved_model.save(module, path, signatures={"serving_default": module.stats})
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 255, size=(8, 8, 3), dtype=np.uint8) for _ in range(9)]
    jpegs = [tf.io.encode_jpeg(image).numpy() for image in images]
    dataset = TFDataset.from_bytes_rdd(sc.parallelize(jpegs, 2), batch_per_thread=4)
    means = TFPredictor.from_saved_model(path, dataset).predict().collect()
    expected = [float(tf.reduce_mean(tf.cast(tf.io.decode_jpeg(j), tf.float32))) for j in jpegs]
    np.testing.assert_allclose([float(m) for m in means], expected, rtol=1e-6)


def test_mismatched_features_are_rejected_before_launch(sc, squares_dir):
    model = _dense_model()
    wrong_shape = TFDataset.from_ndarrays(np.zeros((6, 5), "float32"), batch_per_thread=2)
    with pytest.raises(DataError, match=r"(?s)features \(float32 of shape \[5\].*expects \[.* float32 \[4\]\]"):
        TFPredictor.from_keras(model, wrong_shape)
    two_inputs = TFDataset.from_ndarrays([np.zeros((6, 4)), np.zeros((6, 4))], batch_per_thread=2)
    with pytest.raises(DataError, match=r"takes 1 input\(s\).*data has 2 feature\(s\)"):
        TFPredictor.from_keras(model, two_inputs)
    strings = TFDataset.from_bytes_rdd(sc.parallelize([b"a", b"b"]), batch_per_thread=2)
    with pytest.raises(DataError, match=r"string of shape \[\].*'x' int64 \[\]"):
        TFPredictor.from_saved_model(squares_dir, strings)
    no_batch = TFDataset.from_ndarrays(np.zeros((6, 4), "float32"))
    with pytest.raises(DataError, match="batch_per_thread"):
        TFPredictor.from_keras(model, no_batch)


def test_bad_record_and_rejected_batch_raise_data_error(sc):
    good, bad = [0.0, 1.0, 2.0, 3.0], [0.0, 1.0]
    records = sc.parallelize([good, good, good, bad, good], 1)
    dataset = TFDataset.from_rdd(records, features=(tf.float32, [4]), batch_per_thread=2)
    predictions = TFPredictor.from_keras(_dense_model(), dataset).predict()
    # The user's action raises the DataError itself (not Spark's Py4J report), also after narrow transformations.
    for action in (
        lambda: predictions.collect(),
        lambda: predictions.count(),
        lambda: predictions.map(lambda p: float(p[0])).filter(lambda v: v > 0).take(5),
        lambda: list(predictions.toLocalIterator()),
    ):
        with pytest.raises(DataError, match="partition 0, record 3") as raised:
            action()
        assert raised.value.__cause__ is not None  # Spark's error, for the full trace

    class Subclassed(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    subclassed = Subclassed()
    subclassed(np.zeros((1, 3), "float32"))  # built for 3 features; the data has 4
    dataset = TFDataset.from_ndarrays(np.zeros((5, 4), "float32"), batch_per_thread=2, num_partitions=1)
    with pytest.raises(DataError, match=r"partition 0, records 0\.\.1: the model rejected the batch"):
        TFPredictor.from_keras(subclassed, dataset).predict().collect()


def test_keras_runner_traces_once_for_full_and_short_batches():
    from sparktf.inference.runners import KerasRunner

    model = _dense_model()
    runner = KerasRunner(model)
    x = _features(range(1, 9))
    np.testing.assert_allclose(runner(x), model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(runner(x[:3]), model.predict(x[:3], verbose=0), rtol=1e-5, atol=1e-6)  # a short last batch
    assert len(runner._calls) == 1


def test_a_resource_profile_on_a_dataframe_stage_is_passed_under_spark4_and_refused_naming_it_under_35(spark):
    from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

    from sparktf.errors import SparkTFError
    from sparktf.spark.resources import PYSPARK_MAJOR, map_in_arrow

    def same(batches):
        return batches

    profile = ResourceProfileBuilder().require(TaskResourceRequests().cpus(1)).build
    df = spark.range(2)
    if PYSPARK_MAJOR >= 4:  # lazy: the plan carries the profile, no job runs
        assert map_in_arrow(df, same, df.schema, profile=profile).columns == ["id"]
    else:
        with pytest.raises(SparkTFError, match="needs Spark 4"):
            map_in_arrow(df, same, df.schema, profile=profile)
    assert map_in_arrow(df, same, df.schema).count() == 2  # no profile: every pyspark
