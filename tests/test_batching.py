"""batching: endless training batches with wrap-around, order-keeping inference batches."""

import itertools

import numpy as np
import pytest

from sparktf.data.batching import Shard, inference_batches
from sparktf.data.train_batches import TrainBatches
from sparktf.errors import DataError


def shard_of(n, blocks=3):
    ids = np.arange(n)
    bounds = np.linspace(0, n, blocks + 1).astype(int)
    return Shard.from_blocks((ids[a:b], ids[a:b] * 10.0) for a, b in zip(bounds[:-1], bounds[1:]))


def take_ids(batches, count):
    return [batch[0] for batch in itertools.islice(batches, count)]


def test_shard_concatenates_blocks():
    shard = shard_of(10)
    assert shard.num_records == 10
    np.testing.assert_array_equal(shard.arrays[0], np.arange(10))
    assert Shard.from_blocks([]).num_records == 0


def test_shuffled_batches_are_full_cover_each_pass_and_keep_leaves_aligned():
    batches = TrainBatches(shard_of(10), local_batch=4, shuffle=True, seed=7, rank=0)
    drawn = list(itertools.islice(batches, 5))  # 20 records = two passes
    assert all(len(ids) == 4 and len(values) == 4 for ids, values in drawn)
    assert all(np.array_equal(ids * 10.0, values) for ids, values in drawn)
    ids = np.concatenate([ids for ids, _ in drawn])
    assert sorted(ids[:10]) == list(range(10)) and sorted(ids[10:]) == list(range(10))
    assert not np.array_equal(ids[:10], ids[10:]), "every pass is reshuffled"
    assert batches.passes == 2


def test_shuffle_is_deterministic_per_seed_and_rank():
    def first_ids(seed, rank):
        return np.concatenate(take_ids(TrainBatches(shard_of(50), 5, True, seed, rank), 10))

    np.testing.assert_array_equal(first_ids(1, 0), first_ids(1, 0))
    assert not np.array_equal(first_ids(1, 0), first_ids(1, 1))
    assert not np.array_equal(first_ids(1, 0), first_ids(2, 0))


def test_sequential_order_wraps_around_without_partial_batches():
    batches = TrainBatches(shard_of(5), local_batch=3, shuffle=False, seed=0, rank=0, sequential_order=True)
    assert [ids.tolist() for ids in take_ids(batches, 4)] == [[0, 1, 2], [3, 4, 0], [1, 2, 3], [4, 0, 1]]


def test_a_batch_larger_than_the_shard_wraps_several_times():
    batches = TrainBatches(shard_of(2, blocks=1), local_batch=5, shuffle=False, seed=0, rank=0, sequential_order=True)
    assert next(batches)[0].tolist() == [0, 1, 0, 1, 0]


def test_unshuffled_non_sequential_starts_at_a_seeded_offset_and_keeps_order():
    starts = set()
    for seed in range(8):
        ids = np.concatenate(take_ids(TrainBatches(shard_of(10), 5, False, seed, rank=0), 4))
        np.testing.assert_array_equal(ids, np.roll(np.arange(10), -ids[0]).tolist() * 2)
        starts.add(int(ids[0]))
    assert len(starts) > 1


def test_empty_shard_and_bad_batch_raise_data_error():
    with pytest.raises(DataError, match="training worker rank 3 got no records"):
        TrainBatches(Shard.from_blocks([]), 4, True, 0, rank=3)
    with pytest.raises(DataError, match="local batch size must be positive"):
        TrainBatches(shard_of(4), 0, True, 0, rank=0)


def test_inference_batches_keep_every_record_in_order():
    ids = np.arange(11)
    blocks = [(ids[0:4], ids[0:4] * 2), (ids[4:5], ids[4:5] * 2), (ids[5:11], ids[5:11] * 2)]
    batches = list(inference_batches(blocks, 3))
    assert [len(b[0]) for b in batches] == [3, 3, 3, 2]
    np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), ids)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), ids * 2)
    assert [len(b[0]) for b in inference_batches(blocks, 100)] == [11]
    assert list(inference_batches([], 3)) == []
    with pytest.raises(DataError, match="inference batch size must be positive"):
        list(inference_batches(blocks, 0))


def spilled(tmp_path, n, blocks=3):
    """The records of ``shard_of(n)`` written to local-disk files, plus a string leaf."""
    from sparktf.data.shard_files import ShardFiles

    ids = np.arange(n)
    words = np.array([b"r%d" % i for i in ids], dtype=object)
    bounds = np.linspace(0, n, blocks + 1).astype(int)
    parts = ((ids[a:b], ids[a:b] * 10.0, words[a:b]) for a, b in zip(bounds[:-1], bounds[1:]))
    return ShardFiles.write(str(tmp_path / "part-0"), parts)


def test_spilled_shard_reads_ranges_back_and_is_found_again(tmp_path):
    from sparktf.data.shard_files import ShardFiles

    files = spilled(tmp_path, 10)
    ids, values, words = files.read([(7, 10), (0, 2)])
    assert ids.tolist() == [7, 8, 9, 0, 1] and values.tolist() == [70.0, 80.0, 90.0, 0.0, 10.0]
    assert words.tolist() == [b"r7", b"r8", b"r9", b"r0", b"r1"]
    assert ShardFiles.open(files.directory).num_records == 10
    assert ShardFiles.open(str(tmp_path / "part-1")) is None
    assert [p.name for p in tmp_path.iterdir()] == ["part-0"], "no scratch folder is left behind"


@pytest.mark.parametrize("sequential_order", [True, False])
def test_streamed_unshuffled_batches_equal_in_memory_ones(tmp_path, sequential_order):
    files = spilled(tmp_path, 23)
    in_memory = TrainBatches(shard_of(23), 5, False, 3, 1, sequential_order)
    streamed = TrainBatches(files, 5, False, 3, 1, sequential_order, window_records=4)
    assert streamed.streamed and not in_memory.streamed
    np.testing.assert_array_equal(np.concatenate(take_ids(streamed, 14)), np.concatenate(take_ids(in_memory, 14)))
    streamed.close()


def test_streamed_shuffle_covers_each_pass_holds_one_window_and_resumes_exactly(tmp_path):
    files = spilled(tmp_path, 40)

    def stream(seed, start_batch=0):
        return TrainBatches(files, 6, True, seed, 0, window_records=8, start_batch=start_batch)

    batches = stream(5)
    drawn = list(itertools.islice(batches, 20))  # 120 records = three passes
    assert all(np.array_equal(ids * 10.0, values) for ids, values, _ in drawn)
    assert all(words.tolist() == [b"r%d" % i for i in ids] for ids, _, words in drawn)
    assert len(batches._arrays[0]) <= 8, "a window holds at most window_records records"
    ids = np.concatenate([d[0] for d in drawn])
    for k in range(3):
        assert sorted(ids[40 * k : 40 * (k + 1)]) == list(range(40)), f"pass {k} visits every record once"
    assert not np.array_equal(ids[:40], ids[40:80]), "every pass is reshuffled"
    assert not np.array_equal(ids[:40], np.sort(ids[:40])), "records are shuffled"
    resumed = stream(5, start_batch=11)  # a relaunch at iteration 12 continues the same stream
    np.testing.assert_array_equal(np.concatenate(take_ids(resumed, 9)), ids[66:])
    other_seed = np.concatenate(take_ids(stream(6), 7))
    assert not np.array_equal(other_seed, ids[:42])
    for each in (batches, resumed):
        each.close()


def test_in_memory_stream_resumes_at_any_batch():
    uninterrupted = np.concatenate(take_ids(TrainBatches(shard_of(10), 4, True, 2, 0), 8))
    resumed = np.concatenate(take_ids(TrainBatches(shard_of(10), 4, True, 2, 0, start_batch=3), 5))
    np.testing.assert_array_equal(resumed, uninterrupted[12:])


def test_keyed_pieces_arriving_out_of_order_are_spilled_in_key_order(tmp_path):
    from sparktf.data.columnar import keyed_block
    from sparktf.data.shard_files import ShardFiles

    ids = np.arange(12)
    pieces = [((0, p, q), (ids[4 * p + 2 * q : 4 * p + 2 * q + 2],)) for p in range(3) for q in range(2)]
    arrival = [keyed_block(piece) for piece in reversed(pieces)]
    files = ShardFiles.write(str(tmp_path / "part-0"), iter(arrival), keyed=True)
    assert files.read([(0, 12)])[0].tolist() == list(range(12))
    assert [p.name for p in tmp_path.iterdir()] == ["part-0"]
