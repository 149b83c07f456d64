"""TFDataset from RDDs and ndarrays: specs, casting, batching rules, training partitions."""

import numpy as np
import pytest
import tensorflow as tf

from sparktf import TFDataset
from sparktf.errors import DataError


def test_from_rdd_casts_records_and_gives_the_record_view(sc):
    rdd = sc.parallelize([(np.full([2], i, np.float64), i % 3) for i in range(10)], 3)
    ds = TFDataset.from_rdd(rdd, features=(tf.float32, [2]), labels=("int32", []), batch_size=4)
    assert ds.feature_spec == tf.TensorSpec([2], tf.float32)
    assert ds.label_spec == tf.TensorSpec([], tf.int32)
    assert ds.element_structure == (ds.feature_spec, ds.label_spec) and ds.has_labels
    assert ds.num_records == 10 and ds.partition_counts == [3, 3, 4]
    records = ds.rdd.collect()
    assert [int(label) for _, label in records] == [i % 3 for i in range(10)]
    assert records[4][0].dtype == np.float32 and records[4][0].tolist() == [4.0, 4.0]
    assert ds.val_dataset is None


def test_from_rdd_with_dict_features_and_no_labels(sc):
    rdd = sc.parallelize([{"ids": [i, i + 1], "word": f"w{i}"} for i in range(4)], 2)
    ds = TFDataset.from_rdd(rdd, {"ids": ("int64", [2]), "word": ("string", [])}, batch_per_thread=2)
    assert ds.label_spec is None and ds.element_structure == (ds.feature_spec,)
    first = ds.rdd.first()
    assert first["word"] == b"w0" and first["ids"].tolist() == [0, 1]


def test_a_bad_record_raises_data_error_on_the_driver(sc):
    rdd = sc.parallelize([(np.zeros(2), 1)] * 5 + [(np.zeros(3), 1)], 2)
    ds = TFDataset.from_rdd(rdd, (tf.float32, [2]), (tf.int32, []))
    with pytest.raises(DataError, match=r"partition 1, record 2 .*features has shape \[3\], expected \[2\]"):
        ds.num_records


def test_a_label_outside_its_integer_dtype_names_partition_record_and_range(sc):
    rdd = sc.parallelize([(np.zeros(2), 1)] * 3 + [(np.zeros(2), 2**40)], 2)
    ds = TFDataset.from_rdd(rdd, (tf.float32, [2]), (tf.int32, []))
    with pytest.raises(DataError, match=r"partition 1, record 1 .*outside the range of int32 \[-2147483648, 2147483647\]"):
        ds.num_records


def test_from_rdd_with_sample_weight_gives_weighted_records_and_names_a_bad_weight(sc):
    rdd = sc.parallelize([([float(i)], i % 2, i / 4) for i in range(6)], 2)
    ds = TFDataset.from_rdd(rdd, ("float32", [1]), ("int32", []), batch_size=2, with_sample_weight=True, val_rdd=rdd)
    assert ds.weight_spec == tf.TensorSpec([], tf.float32) and ds.element_structure[2] == ds.weight_spec
    assert [float(w) for _, _, w in ds.rdd.collect()] == [i / 4 for i in range(6)]
    assert ds.val_dataset.weight_spec == ds.weight_spec
    bad = sc.parallelize([([0.0], 0, 1.0)] * 4 + [([0.0], 0, -2.0)], 2)
    with pytest.raises(DataError, match=r"partition 1, record 2 \(0-based within the partition\): sample weight -2.0 is neg"):
        TFDataset.from_rdd(bad, ("float32", [1]), ("int32", []), with_sample_weight=True).num_records
    with pytest.raises(DataError, match="with_sample_weight=True needs labels"):
        TFDataset.from_rdd(rdd, ("float32", [1]), with_sample_weight=True)
    with pytest.raises(DataError, match="sample_weight needs labels"):
        TFDataset.from_ndarrays(np.zeros((3, 1)), sample_weight=np.ones(3))
    with pytest.raises(DataError, match=r"val_tensors' weights\[1\]: sample weight nan is not finite"):
        TFDataset.from_ndarrays((np.zeros((3, 1)), np.zeros(3)), val_tensors=(np.zeros((2, 1)), np.zeros(2), [1, np.nan]))


def test_from_rdd_rejects_a_dataframe(spark):
    with pytest.raises(DataError, match="use TFDataset.from_dataframe"):
        TFDataset.from_rdd(spark.range(3), (tf.float32, []))


def test_validation_rdd_shares_specs_and_batch_options(sc):
    train = sc.parallelize([([1.0], 0)] * 6, 2)
    ds = TFDataset.from_rdd(train, ("float32", [1]), ("int32", []), batch_size=4, val_rdd=sc.parallelize([([2.0], 1)] * 3))
    val = ds.val_dataset
    assert val.num_records == 3 and val.feature_spec == ds.feature_spec and val.batch_size == 4
    assert val.inference_batch_size(2) == 2 and not val.shuffle


def test_from_ndarrays_dtypes_partitions_and_validation(sc):
    x = np.random.rand(11, 3)
    y = np.arange(11)
    ds = TFDataset.from_ndarrays((x, y), batch_size=4, val_tensors=(x[:3], y[:3]), num_partitions=3)
    assert ds.feature_spec == tf.TensorSpec([3], tf.float32)
    assert ds.label_spec == tf.TensorSpec([], tf.int64)
    assert ds.partition_counts == [3, 4, 4] and ds.block_rdd.getNumPartitions() == 3
    assert ds.val_dataset.num_records == 3
    features = np.stack([f for f, _ in ds.rdd.collect()])
    np.testing.assert_allclose(features, x.astype(np.float32))
    assert TFDataset.from_ndarrays(x).partition_counts == [5, 6]  # sc.defaultParallelism partitions


def test_from_ndarrays_nested_features_and_strings(sc):
    x1 = np.zeros((4, 2), np.int32)
    text = np.array(["a", "b", "c", "d"])
    ds = TFDataset.from_ndarrays(({"num": x1, "text": text},), batch_per_thread=2)
    assert ds.label_spec is None
    assert ds.feature_spec == {"num": tf.TensorSpec([2], tf.int32), "text": tf.TensorSpec([], tf.string)}
    assert [r["text"] for r in ds.rdd.collect()] == [b"a", b"b", b"c", b"d"]
    multi = TFDataset.from_ndarrays(([x1, x1.astype(np.float64)], np.ones(4, bool)))
    assert multi.feature_spec == [tf.TensorSpec([2], tf.int32), tf.TensorSpec([2], tf.float32)]
    assert multi.label_spec == tf.TensorSpec([], tf.bool)


@pytest.mark.parametrize(
    "tensors, fragment",
    [
        ((np.zeros((4, 2)), np.zeros(5)), "different numbers of records"),
        ((np.zeros(4), np.zeros(4), np.zeros(4)), "tuple of 3"),
        ([np.zeros(3), 5], "features[1]"),
        (np.array(3.0), "features is a single float32 value, not a column of records"),
        (([1.0, 2.0], [0, 1]), "is a single float32 value, not a column of records"),
    ],
)
def test_from_ndarrays_rejects_bad_arrays(sc, tensors, fragment):
    with pytest.raises(DataError) as info:
        TFDataset.from_ndarrays(tensors)
    assert fragment in str(info.value)


def test_val_tensors_must_nest_like_tensors(sc):
    with pytest.raises(DataError, match="val_tensors"):
        TFDataset.from_ndarrays((np.zeros((4, 2)), np.zeros(4)), val_tensors=np.zeros((2, 2)))


def test_batch_option_rules(sc):
    x = np.zeros((10, 1))
    with pytest.raises(DataError, match="not both"):
        TFDataset.from_ndarrays(x, batch_size=4, batch_per_thread=2)
    with pytest.raises(DataError, match="batch_size must be a positive integer"):
        TFDataset.from_ndarrays(x, batch_size=0)
    ds = TFDataset.from_ndarrays(x, batch_size=6)
    assert ds.local_batch_size(3) == 2 and ds.inference_batch_size(3) == 2
    assert ds.iterations_per_epoch() == 2 and ds.iterations_per_epoch(num_workers=1) == 2
    assert [ds.local_batch_size(4, rank) for rank in range(4)] == [1, 2, 1, 2]  # any batch on any workers
    with pytest.raises(DataError, match="batch_size 6 is smaller than the number of training workers 7"):
        ds.local_batch_size(7)
    unbatched = TFDataset.from_ndarrays(x)
    with pytest.raises(DataError, match="training needs batch_size"):
        unbatched.local_batch_size(2)
    with pytest.raises(DataError, match="batch_per_thread"):
        unbatched.inference_batch_size(2)
    assert TFDataset.from_ndarrays(x, batch_per_thread=3).inference_batch_size(2) == 3


def test_training_blocks_balance_contiguous_ranges(sc):
    rdd = sc.parallelize(range(10), 3).mapPartitionsWithIndex(lambda p, it: it if p != 1 else iter([]))
    ds = TFDataset.from_rdd(rdd.map(lambda i: ([float(i)], i)), ("float32", [1]), ("int64", []), batch_size=2)
    assert ds.partition_counts == [3, 0, 4]
    training = ds.training_blocks(2)
    assert training.num_partitions == 2
    assert training.keyed  # shuffled blocks carry their key; the worker spills them in key order

    def labels_in_key_order(blocks):
        return np.concatenate([b[2] for b in sorted(blocks, key=lambda b: tuple(b[0]))]).tolist()

    assert training.rdd.glom().map(labels_in_key_order).collect() == [[0, 1, 2], [6, 7, 8, 9]]
    assert ds.training_blocks(2) is training
    balanced = TFDataset.from_ndarrays(np.zeros((9, 1)), num_partitions=2)
    assert balanced.training_blocks(2) is balanced.blocks and not balanced.blocks.keyed
    with pytest.raises(DataError, match="has 9 records, fewer than the 10 training workers"):
        balanced.training_blocks(10)


def test_string_and_bytes_rdds(sc):
    ds = TFDataset.from_string_rdd(sc.parallelize(["héllo", "world"]), batch_per_thread=1)
    assert ds.feature_spec == tf.TensorSpec([], tf.string) and ds.label_spec is None
    assert ds.rdd.collect() == ["héllo".encode(), b"world"]
    raw = TFDataset.from_bytes_rdd(sc.parallelize([b"\x00\x01"]))
    assert raw.rdd.collect() == [b"\x00\x01"] and raw.batch_per_thread == -1
