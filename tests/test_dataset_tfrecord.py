"""TFDataset.from_tfrecord_file: real TFRecord files parsed on the executors."""

import os

import numpy as np
import pytest
import tensorflow as tf

from sparktf import TFDataset
from sparktf.errors import DataError
from sparktf.data.tfrecord_stream import TFRecordFeed
from sparktf.spark.task_devices import GpuPlan
from sparktf.spark.user_code import pickle_by_value

pytestmark = pytest.mark.usefixtures("spark")

FEATURES = {"x": tf.io.FixedLenFeature([2], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}


def parse_example(serialized):
    parsed = tf.io.parse_single_example(serialized, FEATURES)
    return parsed["x"], parsed["y"]


@pytest.fixture(scope="module")
def record_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tfrecords")
    for part in range(3):
        with tf.io.TFRecordWriter(str(folder / f"part-{part}.tfrecord")) as writer:
            for i in range(4 + part):
                x = tf.train.Feature(float_list=tf.train.FloatList(value=[i, part]))
                y = tf.train.Feature(int64_list=tf.train.Int64List(value=[10 * part + i]))
                example = tf.train.Example(features=tf.train.Features(feature={"x": x, "y": y}))
                writer.write(example.SerializeToString())
    (folder / "broken.tfrecord").write_bytes(b"this is not a TFRecord file at all")
    return folder


def test_glob_gives_one_partition_per_file_in_order(record_dir):
    ds = TFDataset.from_tfrecord_file(
        str(record_dir / "part-*.tfrecord"), parse_example, batch_size=4, validation_paths=str(record_dir / "part-0.tfrecord")
    )
    assert ds.feature_spec == tf.TensorSpec([2], tf.float32)
    assert ds.label_spec == tf.TensorSpec([], tf.int64)
    assert ds.partition_counts == [4, 5, 6]
    records = ds.rdd.collect()
    assert [int(y) for _, y in records] == [0, 1, 2, 3, 10, 11, 12, 13, 14, 20, 21, 22, 23, 24, 25]
    np.testing.assert_array_equal(records[5][0], np.array([1.0, 1.0], np.float32))
    assert ds.val_dataset.num_records == 4


def test_dict_features_without_labels_and_a_list_of_paths(record_dir):
    def parse_features(serialized):
        parsed = tf.io.parse_single_example(serialized, FEATURES)
        return {"x": parsed["x"], "text": tf.strings.as_string(parsed["y"])}

    paths = [str(record_dir / "part-2.tfrecord"), str(record_dir / "part-0.tfrecord")]
    ds = TFDataset.from_tfrecord_file(paths, parse_features, batch_per_thread=8)
    assert ds.label_spec is None
    assert ds.feature_spec == {"x": tf.TensorSpec([2], tf.float32), "text": tf.TensorSpec([], tf.string)}
    assert [r["text"] for r in ds.rdd.collect()] == [b"20", b"21", b"22", b"23", b"24", b"25", b"0", b"1", b"2", b"3"]


def test_a_corrupt_file_raises_data_error_naming_it(record_dir):
    ds = TFDataset.from_tfrecord_file(str(record_dir / "broken.tfrecord"), parse_example)
    with pytest.raises(DataError, match=r"broken\.tfrecord \(partition 0\): reading or parsing failed after record 0"):
        ds.num_records


def test_paths_matching_nothing_and_shapeless_outputs_are_rejected(record_dir):
    with pytest.raises(DataError, match="matches no file"):
        TFDataset.from_tfrecord_file(str(record_dir / "missing-*.tfrecord"), parse_example)

    def sparse_parse(serialized):
        return tf.io.parse_single_example(serialized, {"x": tf.io.VarLenFeature(tf.float32)})["x"]

    with pytest.raises(DataError, match="parse_fn output output is a SparseTensorSpec"):
        TFDataset.from_tfrecord_file(str(record_dir / "part-0.tfrecord"), sparse_parse)

    def unknown_shape(serialized):
        return tf.io.parse_tensor(serialized, tf.float32)

    with pytest.raises(DataError, match="unknown dimension"):
        TFDataset.from_tfrecord_file(str(record_dir / "part-0.tfrecord"), unknown_shape)


def test_files_are_read_on_the_executors(record_dir, sc):
    ds = TFDataset.from_tfrecord_file(str(record_dir / "part-1.tfrecord"), parse_example)
    assert ds.block_rdd.map(lambda block: os.getpid()).first() != os.getpid()


def test_reader_caps_block_size_and_keeps_order(tmp_path):
    from sparktf.data import tfrecord_io
    from sparktf.data.columnar import RecordFormat

    path = str(tmp_path / "many.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(tfrecord_io.MAX_RECORDS_PER_BLOCK + 3):
            writer.write(tf.io.serialize_tensor(tf.constant(i, tf.int64)).numpy())

    def parse_scalar(serialized):
        return tf.ensure_shape(tf.io.parse_tensor(serialized, tf.int64), [])

    feature_spec, label_spec, _ = tfrecord_io.trace_parse_fn(parse_scalar)
    reader = tfrecord_io.TFRecordReader(parse_scalar, RecordFormat.from_specs(feature_spec, label_spec), GpuPlan())
    blocks = list(reader(0, [path]))
    assert [len(block[0]) for block in blocks] == [tfrecord_io.MAX_RECORDS_PER_BLOCK, 3]
    np.testing.assert_array_equal(np.concatenate([block[0] for block in blocks]), np.arange(len(blocks[0][0]) + 3))


def weighted_by_x(serialized):
    x, y = parse_example(serialized)
    return x, y, 3.0 - x[0]  # part-0: 3, 2, 1, 0; part-1: 3, 2, 1, 0, -1


def test_a_parse_fn_returning_a_weight_gives_weighted_records_cached_or_streamed(record_dir):
    ds = TFDataset.from_tfrecord_file(str(record_dir / "part-0.tfrecord"), weighted_by_x, batch_size=2)
    assert ds.weight_spec == tf.TensorSpec([], tf.float32)
    assert [float(w) for _, _, w in ds.rdd.collect()] == [3, 2, 1, 0]
    bad = TFDataset.from_tfrecord_file([str(record_dir / f"part-{i}.tfrecord") for i in (0, 1)], weighted_by_x)
    with pytest.raises(DataError, match=r"partition 1, record 4 \(0-based within the partition\): sample weight -1.0"):
        bad.num_records
    feed = TFRecordFeed([[str(record_dir / "part-1.tfrecord")]], [5], pickle_by_value({"parse_fn": weighted_by_x}),
                        bad.record_format, shuffle=False, seed=0, shuffle_buffer=8)
    stream = feed.open(0, [], 2, 0)
    try:
        assert [float(w) for w in next(stream)[2]] == [3, 2]  # cache=False: a training worker's stream
        next(stream)
        with pytest.raises(DataError, match=r"training worker rank 0 read from .*part-1.tfrecord.*: sample weight -1.0"):
            next(stream)
    finally:
        stream.close(wait=False, timeout=0)


def test_records_split_across_chunks_anywhere_are_tensorflows_and_a_cut_file_names_its_record(tmp_path):
    from sparktf.data.tfrecord_readahead import records_of_chunks

    path = tmp_path / "sizes.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for index, size in enumerate((0, 1, 11, 300, 5)):
            writer.write(bytes([index]) * size)
    data = path.read_bytes()
    expected = [record.numpy() for record in tf.data.TFRecordDataset(str(path))]

    def records(data, step):
        chunks = (data[start:start + step] for start in range(0, len(data), step))
        return [record for run in records_of_chunks(chunks, "f") for record in run]

    for step in (1, 7, 12, 16, len(data)):
        assert records(data, step) == expected
    # the last record: a 12-byte header, 5 bytes, a 4-byte footer
    for cut, message in ((-21 + 6, "record 4 has no valid header"), (-7, r"record 4 is cut short \(2 of 5 bytes\)"),
                         (-2, r"record 4 is cut short \(5 of 5 bytes\)")):
        with pytest.raises(DataError, match=f"TFRecord file f: {message}"):
            records(data[:cut], 16)
    with pytest.raises(DataError, match="record 0 has no valid header"):
        records(b"this is not a TFRecord file at all", 16)
