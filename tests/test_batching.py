"""batching: endless training batches with wrap-around, order-keeping inference batches."""

import itertools

import numpy as np
import pytest

from sparktf.data.batching import Shard, TrainBatches, inference_batches
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
