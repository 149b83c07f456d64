"""columnar: records -> Blocks with errors naming partition and record; routing blocks to workers."""

import numpy as np
import pytest
import tensorflow as tf

from sparktf.data import columnar
from sparktf.data.columnar import BlockRouter, RecordFormat, block_size, keyed_block
from sparktf.errors import DataError

IMAGE_LABEL = RecordFormat.from_specs(tf.TensorSpec([2], tf.float32), tf.TensorSpec([], tf.int32))


def test_records_become_blocks_cast_to_the_specs(monkeypatch):
    monkeypatch.setattr(columnar, "TARGET_BLOCK_BYTES", 3 * 12)  # 3 records of 8 + 4 bytes per block
    records = [(np.array([i, i + 0.5], dtype=np.float64), i) for i in range(7)] + [([7, 7.5], np.int64(7))]
    blocks = list(IMAGE_LABEL.to_blocks(0, iter(records)))
    assert [block_size(b) for b in blocks] == [3, 3, 2]
    features, labels = (np.concatenate(column) for column in zip(*blocks))
    assert features.dtype == np.float32 and labels.dtype == np.int32
    np.testing.assert_array_equal(features[:, 1], np.arange(8) + 0.5)
    np.testing.assert_array_equal(labels, np.arange(8))
    assert all(array.flags.c_contiguous for block in blocks for array in block)


def test_blocks_turn_back_into_records():
    record_format = RecordFormat.from_specs(
        {"a": tf.TensorSpec([2], tf.int64), "b": tf.TensorSpec([], tf.string)}, tf.TensorSpec([1], tf.float32)
    )
    records = [({"b": "x", "a": [1, 2]}, [0.5]), ({"a": np.array([3, 4]), "b": b"y"}, np.array([1.5]))]
    (block,) = record_format.to_blocks(0, records)
    back = list(record_format.to_records(block))
    assert back[0][0]["b"] == b"x" and back[1][0]["b"] == b"y"
    np.testing.assert_array_equal(back[1][0]["a"], [3, 4])
    np.testing.assert_array_equal(back[1][1], np.array([1.5], np.float32))


def test_records_without_labels_are_the_features():
    record_format = RecordFormat.from_specs([tf.TensorSpec([], tf.float32), tf.TensorSpec([2], tf.uint8)])
    (block,) = record_format.to_blocks(0, [(1, [2, 3]), [4, (5, 6)]])
    assert [a.dtype for a in block] == [np.float32, np.uint8]
    assert [list(map(np.ndarray.tolist, map(np.asarray, r))) for r in record_format.to_records(block)] == [
        [1.0, [2, 3]],
        [4.0, [5, 6]],
    ]


@pytest.mark.parametrize(
    "bad_record, fragment",
    [
        ((np.zeros(3), 1), "features has shape [3], expected [2]"),
        ((np.zeros(2), [1, 2]), "labels has shape [2], expected []"),
        ((None, 1), "features is None, expected a float32 value of shape [2]"),
        ((["a", "b"], 1), "features could not be converted to float32 with shape [2]"),
        ((np.zeros(2),), "a record should be (features, labels) because labels were given"),
        ((np.zeros(2), 2**40), "labels holds 1099511627776, outside the range of int32 [-2147483648, 2147483647]"),
        ((np.zeros(2), 0.9), "labels holds the non-integral value 0.9 for an integer spec int32"),
        (([1.0, None], 1), "features holds None at position [1], expected float32 numbers"),
    ],
)
def test_a_bad_record_names_partition_record_and_leaf(bad_record, fragment):
    records = [(np.zeros(2), 0)] * 4 + [bad_record]
    with pytest.raises(DataError) as info:
        list(IMAGE_LABEL.to_blocks(3, iter(records)))
    message = str(info.value)
    assert message.startswith("partition 3, record 4 (0-based within the partition): ")
    assert fragment in message


def test_integral_floats_and_in_range_integers_still_convert():
    record = ([1, 2], np.float64(3.0))
    (block,) = IMAGE_LABEL.to_blocks(0, [record])
    assert block[1].tolist() == [3] and block[0].tolist() == [[1.0, 2.0]]
    leaf = IMAGE_LABEL.leaves[1]
    with pytest.raises(DataError, match=r"non-integral value 2.5 at position \[1\]"):
        columnar.to_leaf_column(np.array([1.0, 2.5]), leaf)


def test_string_leaves_hold_bytes():
    leaf = RecordFormat.from_specs(tf.TensorSpec([2], tf.string)).leaves[0]
    column = columnar.to_leaf_column(np.array([["é", "b"], ["c", "d"]]), leaf)
    assert column.dtype == object and column[0, 0] == "é".encode()
    with pytest.raises(DataError, match="expected str or bytes, got int"):
        columnar.to_leaf_array([b"a", 3], leaf)


def test_to_leaf_column_checks_the_per_record_shape():
    leaf = IMAGE_LABEL.leaves[0]
    assert columnar.to_leaf_column(np.ones((5, 2)), leaf).dtype == np.float32
    with pytest.raises(DataError, match=r"records of shape \[3\] \(array shape \[5, 3\]\), expected \[2\]"):
        columnar.to_leaf_column(np.ones((5, 3)), leaf)


@pytest.mark.parametrize("counts, num_workers", [([7, 1, 2], 2), ([0, 5, 0, 6], 3), ([10], 4), ([3, 3, 3, 3], 2)])
def test_router_gives_each_worker_a_contiguous_balanced_range(counts, num_workers):
    offsets = np.concatenate([[0], np.cumsum(counts)])
    partitions = []
    for p, count in enumerate(counts):  # blocks of at most 2 records holding their global record numbers
        ids = np.arange(offsets[p], offsets[p + 1])
        partitions.append([(ids[i : i + 2],) for i in range(0, count, 2)])
    router = BlockRouter(counts, num_workers)
    routed = {w: [] for w in range(num_workers)}
    for p, blocks in reversed(list(enumerate(partitions))):  # arrival order must not matter
        for key, block in router(p, iter(blocks)):
            routed[key[0]].append(keyed_block((key, block)))
    total = sum(counts)
    for w in range(num_workers):
        in_key_order = sorted(routed[w], key=lambda keyed: tuple(keyed[0]))
        records = np.concatenate([keyed[1] for keyed in in_key_order])
        np.testing.assert_array_equal(records, np.arange(w * total // num_workers, (w + 1) * total // num_workers))


def sparse_vectors(rows: np.ndarray, dense_rows=()) -> "pa.Array":
    """The rows as Arrow's form of MLlib vectors (what Spark sends): sparse, or dense at ``dense_rows``."""
    import pyarrow as pa
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T

    from sparktf.data import arrow_io

    schema = arrow_io.to_arrow_schema(T.StructType([T.StructField("v", VectorUDT().sqlType())]))
    vectors = [{"type": 1, "size": None, "indices": None, "values": row.tolist()} if i in dense_rows else
               {"type": 0, "size": len(row), "indices": np.flatnonzero(row).tolist(), "values": row[row != 0].tolist()}
               for i, row in enumerate(rows)]
    return pa.array(vectors, type=schema.field(0).type)


def test_sparse_columns_slice_gather_travel_and_spill_in_bytes_of_their_non_zeros_not_their_width(tmp_path):
    from sparktf.data import arrow_io, specs
    from sparktf.data.batching import Shard
    from sparktf.data.block_serializer import decode_block, encode_block
    from sparktf.data.shard_files import ShardFiles
    from sparktf.data.sparse import model_values
    from sparktf.data.train_batches import TrainBatches

    rng = np.random.default_rng(0)

    def column(width, nnz, rows=12, dense_rows=()):
        dense = np.zeros((rows, width), np.float32)
        for row in range(rows):
            dense[row, rng.choice(width, nnz, replace=False)] = rng.normal(size=nnz)
        dense[list(dense_rows), :4] = [1, 0, 2, 3]  # a dense vector among the sparse ones: every position stored
        leaf = specs.LeafSpec("features", np.dtype(np.float32), (width,), sparse=True)
        return arrow_io.arrow_to_numpy(sparse_vectors(dense, dense_rows)[1:], leaf, "v", 0, 1), dense[1:]

    wide, dense = column(16, 5, dense_rows=[3])
    assert wide.nnz == 10 * 5 + 16 and np.array_equal(wide.toarray(), dense)
    rows = np.arange(len(dense))
    batches = TrainBatches(Shard([wide, rows]), 4, shuffle=True, seed=1, rank=0)
    for _ in range(4):  # across passes: gathered rows, batches joined across a pass's end
        features, ids = next(batches)
        np.testing.assert_array_equal(features.toarray(), dense[ids])
    block = (wide[2:9], rows[2:9])
    frame = decode_block(encode_block(block))
    np.testing.assert_array_equal(frame[0].toarray(), dense[2:9])
    spill = ShardFiles.write(str(tmp_path / "part-0"), [(wide[5:], rows[5:]), (wide[:5], rows[:5])])
    spilled = np.concatenate([dense[5:], dense[:5]])  # in the order the Blocks came
    np.testing.assert_array_equal(spill.read([(0, 2), (5, 8)])[0].toarray(), spilled[[0, 1, 5, 6, 7]])
    streamed = TrainBatches(spill, 3, shuffle=True, seed=1, rank=0, window_records=4)  # windows read on a thread
    for _ in range(5):
        features, ids = next(streamed)
        np.testing.assert_array_equal(features.toarray(), dense[ids])
    streamed.close()
    sparse, as_dense = model_values([tf.SparseTensorSpec([16], tf.float32), tf.TensorSpec([16], tf.float32)],
                                    [wide[1:4], wide[1:4]])
    np.testing.assert_array_equal(tf.sparse.to_dense(sparse).numpy(), dense[1:4])
    np.testing.assert_array_equal(as_dense, dense[1:4])

    def stored_bytes(width, nnz):  # a Block's frame, its spill on disk and in memory, per record
        wide, _ = column(width, nnz, rows=51)
        spill = ShardFiles.write(str(tmp_path / f"w{width}-{nnz}"), [(wide,)])
        on_disk = sum(path.stat().st_size for path in (tmp_path / f"w{width}-{nnz}").iterdir())
        return [size / len(wide) for size in (len(encode_block((wide,))), on_disk, spill.nbytes, wide.nbytes)]

    narrow, wide_18, more = stored_bytes(1 << 10, 8), stored_bytes(1 << 18, 8), stored_bytes(1 << 18, 64)
    assert all(8 + 8 * 8 <= b < 8 + 8 * 8 + 8 for b in wide_18), wide_18  # an offset, int32 index + float32 value
    np.testing.assert_allclose(narrow, wide_18, atol=1)  # 256x the width: the same bytes
    assert all(m > 6 * w for m, w in zip(more, wide_18))  # 8x the non-zeros: ~8x the bytes (1 MiB per record dense)


def test_a_sparse_input_trains_on_batches_of_any_number_of_non_zeros_without_retracing():
    import keras

    from sparktf.data.sparse import SparseColumn
    from sparktf.training.worker.step import TrainStep

    width = 1 << 18
    model = keras.Sequential([keras.Input((width,), sparse=True), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    step = TrainStep(model)
    rng = np.random.default_rng(0)
    for nnz in (3, 40, 7):
        lengths = rng.integers(0, nnz, size=8)
        indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        indices = np.concatenate([np.sort(rng.choice(width, n, replace=False)) for n in lengths]).astype(np.int32)
        features = SparseColumn(indptr, indices, rng.normal(size=indptr[-1]).astype(np.float32), width).to_tensor()
        step.warm_up(features, np.ones((8, 1), np.float32))
    assert len(step._traces) == 1  # one traced step for every number of non-zeros
