"""How Blocks are cached and travel: raw-bytes frames (BlockSerializer), driver arrays via broadcasts."""

import io

import numpy as np
import pytest

from sparktf import TFDataset
from sparktf.data.block_serializer import BlockSerializer, block_rdd
from sparktf.data.columnar import TARGET_BLOCK_BYTES


def _assert_same_blocks(expected, actual):
    assert len(expected) == len(actual)
    for want, got in zip(expected, actual):
        assert len(want) == len(got)
        for a, b in zip(want, got):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert a.tolist() == b.tolist()


BLOCKS = [
    (np.arange(12, dtype=np.float32).reshape(3, 4), np.array([b"a", b"", b"\x00\xff"], dtype=object)),
    (np.zeros((0, 4), np.float32), np.array([], dtype=object)),
    (np.array([[255, 0]], np.uint8), np.array([[True]])),
]


def test_block_frames_round_trip_every_dtype_and_stop_at_the_end_marker():
    stream = io.BytesIO()
    BlockSerializer().dump_stream(iter(BLOCKS), stream)
    stream.write(b"\xff\xff\xff\xff")  # PySpark's END_OF_DATA_SECTION
    stream.write(b"bytes after the data section")
    stream.seek(0)
    _assert_same_blocks(BLOCKS, list(BlockSerializer().load_stream(io.BufferedReader(stream))))


def test_a_truncated_frame_raises_eof_instead_of_returning_a_short_array():
    stream = io.BytesIO()
    BlockSerializer().dump_stream(iter(BLOCKS[:1]), stream)
    truncated = io.BufferedReader(io.BytesIO(stream.getvalue()[:-10]))
    with pytest.raises(EOFError, match="ended inside a Block"):
        list(BlockSerializer().load_stream(truncated))


def test_blocks_cached_by_spark_come_back_identical(sc):
    cached = block_rdd(sc.parallelize(range(3), 3).map(lambda i: BLOCKS[i])).cache()
    assert cached.count() == 3
    _assert_same_blocks(BLOCKS, cached.collect())  # the driver reads the JVM's frames
    assert cached.map(lambda block: float(block[0].sum())).collect() == [66.0, 0.0, 255.0]  # and so do workers


def test_from_ndarrays_caches_blocks_of_the_target_size_and_rebuilds_a_lost_cache(sc):
    record_bytes = 4096 * 4
    per_block = TARGET_BLOCK_BYTES // record_bytes
    x = np.arange((2 * per_block + 5) * 4096, dtype=np.float32).reshape(-1, 4096)
    ds = TFDataset.from_ndarrays(x, batch_per_thread=64, num_partitions=2)
    assert ds.block_rdd.is_cached
    sizes = ds.block_rdd.glom().map(lambda blocks: [len(b[0]) for b in blocks]).collect()
    assert sizes == [[per_block, 2], [per_block, 3]]
    ds.block_rdd.unpersist(blocking=True)  # as when an executor holding the cache is lost
    rebuilt = np.concatenate([block[0] for block in ds.block_rdd.collect()])
    assert np.array_equal(rebuilt, x)
