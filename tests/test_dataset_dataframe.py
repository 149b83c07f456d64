"""TFDataset.from_dataframe: numeric, array and Vector columns through Arrow."""

from contextlib import contextmanager

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparktf import TFDataset
from sparktf.data import arrow_io
from sparktf.errors import DataError

SCHEMA = T.StructType(
    [
        T.StructField("x", T.DoubleType()),
        T.StructField("ids", T.ArrayType(T.IntegerType())),
        T.StructField("grid", T.ArrayType(T.ArrayType(T.DoubleType()))),
        T.StructField("vec", VectorUDT()),
        T.StructField("flag", T.BooleanType()),
        T.StructField("label", T.LongType()),
    ]
)


@pytest.fixture(scope="module")
def df(spark):
    rows = [
        (
            i / 2,
            [i, -i],
            [[float(i), 1.0], [2.0, 3.0]],
            Vectors.dense([i, 0.5, 1.0]) if i % 2 else Vectors.sparse(3, [0], [float(i)]),
            i % 3 == 0,
            i % 2,
        )
        for i in range(9)
    ]
    return spark.createDataFrame(rows, SCHEMA).repartition(2)


def test_columns_become_specs_and_records(df):
    ds = TFDataset.from_dataframe(df, ["x", "ids", "grid", "vec", "flag"], ["label"], batch_size=2)
    assert ds.feature_spec == [
        tf.TensorSpec([], tf.float32),
        tf.TensorSpec([2], tf.int32),
        tf.TensorSpec([2, 2], tf.float32),
        tf.TensorSpec([3], tf.float32),
        tf.TensorSpec([], tf.bool),
    ]
    assert ds.label_spec == tf.TensorSpec([], tf.int64), "a list of one column is a single spec"
    assert ds.num_records == 9
    by_x = {float(features[0]): (features, label) for features, label in ds.rdd.collect()}
    features, label = by_x[2.5]
    assert features[1].tolist() == [5, -5] and features[2].tolist() == [[5.0, 1.0], [2.0, 3.0]]
    assert features[3].tolist() == [5.0, 0.5, 1.0] and not features[4] and label == 1
    assert by_x[2.0][0][3].tolist() == [4.0, 0.0, 0.0], "sparse vectors are densified"


def test_blocks_are_columnar_not_per_row(spark):
    big = spark.range(0, 5000, numPartitions=2).selectExpr("cast(id as double) as x", "id % 10 as y")
    ds = TFDataset.from_dataframe(big, "x", "y", batch_per_thread=64)
    blocks_per_partition = ds.block_rdd.glom().map(len).collect()
    assert blocks_per_partition == [1, 1]
    assert ds.feature_spec == tf.TensorSpec([], tf.float32) and ds.num_records == 5000


def test_validation_df_must_match(df):
    ds = TFDataset.from_dataframe(df, "vec", "label", batch_size=2, validation_df=df.limit(4))
    assert ds.val_dataset.num_records == 4 and ds.val_dataset.feature_spec == ds.feature_spec
    with pytest.raises(DataError, match="validation_df columns"):
        TFDataset.from_dataframe(df, "x", "label", validation_df=df.selectExpr("cast(x as int) as x", "label"))


def test_unsupported_column_type_names_column_and_type(df):
    with pytest.raises(DataError, match=r"column 'name' has type struct<a:.*cannot feed"):
        TFDataset.from_dataframe(df.selectExpr("named_struct('a', x) as name", "label"), "name", "label")
    with pytest.raises(DataError, match=r"column 'nope' is not in the DataFrame"):
        TFDataset.from_dataframe(df, "nope")


@pytest.mark.parametrize(
    "rows, ddl, fragment",
    [
        ([([1.0, 2.0],), ([1.0],)], "a array<double>", "column 'a', partition 0, row 1 (0-based within the partition): "
         "an array of length 1 at nesting level 0, expected 2"),
        ([([[1, 2]],), ([[1, 2], [3, 4]],)], "a array<array<int>>", "row 1 (0-based within the partition): an array "
         "of length 2 at nesting level 0, expected 1"),
        ([(1.0,), (None,)], "a double", "column 'a', partition 0, row 1 (0-based within the partition) holds a null"),
        ([([1, 2],), ([1, None],)], "a array<int>", "row 1 (0-based within the partition) holds a null"),
    ],
)
def test_bad_rows_name_column_partition_and_row(spark, rows, ddl, fragment):
    ds = TFDataset.from_dataframe(spark.createDataFrame(rows, ddl).coalesce(1), "a")
    with pytest.raises(DataError) as info:
        ds.num_records
    assert fragment in str(info.value)


def test_weight_col_weights_rows_and_a_missing_text_or_bad_weight_is_named(spark):
    df = spark.createDataFrame([(float(i), i % 2, i // 2) for i in range(6)], "x double, label int, w long").coalesce(1)
    ds = TFDataset.from_dataframe(df, "x", "label", batch_size=2, weight_col="w", validation_df=df)
    assert ds.weight_spec == tf.TensorSpec([], tf.float32) and ds.val_dataset.weight_spec == ds.weight_spec
    assert [float(w) for _, _, w in ds.rdd.collect()] == [0, 0, 1, 1, 2, 2]
    with pytest.raises(DataError, match="weight_col 'nope' is not a column of the DataFrame"):
        TFDataset.from_dataframe(df, "x", "label", weight_col="nope")
    with pytest.raises(DataError, match=r"weight_col 'name' has type string, but sample weights are numbers"):
        TFDataset.from_dataframe(df.selectExpr("x", "label", "'a' as name"), "x", "label", weight_col="name")
    bad = df.selectExpr("x", "label", "if(x = 4, double('NaN'), 1.0) as w")
    with pytest.raises(DataError, match=r"weight column 'w', partition 0, record 4 .*sample weight nan is not finite"):
        TFDataset.from_dataframe(bad, "x", "label", weight_col="w").num_records


def test_array_lengths_need_a_first_row(spark):
    with pytest.raises(DataError, match="empty DataFrame"):
        TFDataset.from_dataframe(spark.createDataFrame([], "a array<float>"), "a")
    with pytest.raises(DataError, match="null in the first row"):
        TFDataset.from_dataframe(spark.createDataFrame([(None,)], "a array<float>"), "a")


def test_feature_values_round_trip_exactly(spark):
    x = np.random.default_rng(0).random((20, 4)).astype(np.float32)
    frame = spark.createDataFrame([(row.tolist(), i) for i, row in enumerate(x)], "x array<float>, i int")
    ds = TFDataset.from_dataframe(frame, "x", "i")
    got = {int(i): f for f, i in ds.rdd.collect()}
    np.testing.assert_array_equal(np.stack([got[i] for i in range(20)]), x)


@contextmanager
def max_records_per_batch(spark, rows: int):
    """Spark's Arrow batches of at most ``rows`` rows inside the block (the conf is read when planning)."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    previous = spark.conf.get(key)
    spark.conf.set(key, str(rows))
    try:
        yield
    finally:
        spark.conf.set(key, previous)


def test_jvm_arrow_batches_decode_and_join_into_one_block(spark):
    frame = spark.range(0, 10, numPartitions=1).selectExpr("array(id, -id) as a", "cast(id as double) as x")
    with max_records_per_batch(spark, 3):
        messages = arrow_io.arrow_batch_rdd(frame).collect()
        ds = TFDataset.from_dataframe(frame, ["a", "x"])
    schema = arrow_io.arrow_schema(frame)
    assert [pa.ipc.read_record_batch(pa.py_buffer(m), schema).num_rows for m in messages] == [3, 3, 3, 1]
    (block,) = ds.block_rdd.collect()
    assert block[0].tolist() == [[i, -i] for i in range(10)] and block[1].dtype == np.float32
    assert block[1].tolist() == list(range(10)) and all(a.flags.c_contiguous for a in block)


def test_bad_row_index_counts_rows_of_earlier_batches(spark):
    frame = spark.createDataFrame([(float(i) if i != 7 else None,) for i in range(9)], "a double").coalesce(1)
    with max_records_per_batch(spark, 2):
        ds = TFDataset.from_dataframe(frame, "a")
    with pytest.raises(DataError, match=r"partition 0, row 7 \(0-based within the partition\) holds a null"):
        ds.num_records


def test_dataframe_is_computed_once_then_read_from_the_cache(spark, sc):
    evaluations = sc.accumulator(0)

    def plus_one(value):
        evaluations.add(1)
        return value + 1.0

    frame = spark.range(0, 6, numPartitions=2).select(F.udf(plus_one, "double")(F.col("id").cast("double")).alias("x"))
    ds = TFDataset.from_dataframe(frame, "x", batch_per_thread=4)
    assert sorted(ds.rdd.collect()) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    rows_evaluated = evaluations.value
    assert rows_evaluated == 6, "each row is computed once while the blocks are first read"
    assert ds.block_rdd.map(lambda block: len(block[0])).sum() == 6
    assert evaluations.value == rows_evaluated, "the second read comes from the cached Arrow batches"


def test_empty_partitions_give_no_blocks(spark):
    ds = TFDataset.from_dataframe(spark.range(0, 3, numPartitions=4).selectExpr("array(id, id) as a"), "a")
    assert ds.partition_counts == [0, 1, 1, 1]
    assert [len(blocks) for blocks in ds.block_rdd.glom().collect()] == [0, 1, 1, 1]


def test_string_and_binary_columns_become_string_records(spark):
    rows = [("héllo", bytearray(b"\x00\xff"), 1), ("", bytearray(b""), 0), ("x" * 300, bytearray(b"ab"), 1)]
    frame = spark.createDataFrame(rows, "text string, blob binary, label int").coalesce(2)
    ds = TFDataset.from_dataframe(frame, ["text", "blob"], "label", batch_per_thread=2)
    assert ds.feature_spec == [tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.string)]
    records = ds.rdd.collect()
    assert [(text, blob, int(label)) for (text, blob), label in records] == [
        ("héllo".encode(), b"\x00\xff", 1), (b"", b"", 0), (b"x" * 300, b"ab", 1)
    ]
    with_null = spark.createDataFrame([("a", 1), (None, 0)], "text string, label int").coalesce(1)
    with pytest.raises(DataError, match=r"column 'text', partition 0, row 1 .* null"):
        TFDataset.from_dataframe(with_null, "text", "label").num_records


def test_a_wide_sparse_vector_column_stays_sparse_and_trains_evaluates_and_predicts_as_dense_keras(spark):
    import keras
    from pyspark.ml.feature import HashingTF

    from sparktf import MaxIteration, TFOptimizer, TFPredictor
    from sparktf.ml import KerasModel

    width, rng = 1 << 18, np.random.default_rng(0)
    rows = [([f"w{j}" for j in rng.choice(40, size=int(rng.integers(1, 6)), replace=False)], float(i % 2))
            for i in range(32)]
    frame = HashingTF(numFeatures=width, inputCol="words", outputCol="tf").transform(
        spark.createDataFrame(rows, ["words", "label"]).repartition(3)).cache()  # 3 partitions: 2 workers' shuffle
    ds = TFDataset.from_dataframe(frame, "tf", "label", batch_size=32)
    assert ds.feature_spec == tf.SparseTensorSpec([width], tf.float32)
    with pytest.raises(DataError, match="from_rdd takes dense"):
        TFDataset.from_rdd(spark.sparkContext.parallelize([0]), features=ds.feature_spec)
    stored = ds.block_rdd.map(lambda block: (len(block[0]), block[0].nbytes)).collect()
    assert sum(size for size, _ in stored) == 32 and all(nbytes < 100 * size for size, nbytes in stored)
    collected = frame.select("tf", "label").collect()
    x = np.stack([row["tf"].toArray() for row in collected]).astype(np.float32)  # for one-process Keras
    y = np.array([row["label"] for row in collected], np.float32)

    def model(sparse, weights=None):
        built = keras.Sequential([keras.Input((width,), sparse=sparse), keras.layers.Dense(1, activation="sigmoid")])
        built.compile(keras.optimizers.Adam(0.1), "binary_crossentropy", metrics=["accuracy"])
        if weights is not None:
            built.set_weights(weights)
        return built

    reference = model(False)
    initial = reference.get_weights()
    reference.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0)  # full batches: the order does not matter
    expected = reference.predict(x, verbose=0)
    for sparse in (True, False):
        trained = model(sparse, initial)
        optimizer = TFOptimizer.from_keras(trained, ds, num_workers=2)
        optimizer.optimize(MaxIteration(3))
        for got, want in zip(trained.get_weights(), reference.get_weights()):
            np.testing.assert_allclose(got, want, atol=1e-5)
    scores = optimizer.evaluate(batch_per_thread=5)  # the dense model; the sparse one is evaluated below
    for name, value in reference.evaluate(x, y, verbose=0, return_dict=True).items():
        assert scores[name] == pytest.approx(value, abs=1e-5)
    sparse_model = model(True, reference.get_weights())
    assert TFOptimizer.from_keras(sparse_model, ds).evaluate(batch_per_thread=5) == pytest.approx(scores, abs=1e-5)
    features = TFDataset.from_dataframe(frame, "tf", batch_per_thread=7)
    predictor = TFPredictor.from_keras(sparse_model, features)
    np.testing.assert_allclose(np.concatenate(predictor.predict().collect()), expected.ravel(), atol=1e-5)
    scored = predictor.predict_dataframe(frame, "tf").select("label", "tf", "prediction").collect()
    assert [row["label"] for row in scored] == y.tolist()
    np.testing.assert_allclose([row["prediction"] for row in scored], expected, atol=1e-5)
    transformed = KerasModel.from_keras(sparse_model, task="regression", featuresCol="tf").transform(frame)
    np.testing.assert_allclose([row["prediction"] for row in transformed.select("prediction").collect()],
                               expected.ravel(), atol=1e-5)
