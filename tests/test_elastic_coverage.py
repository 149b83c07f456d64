"""The record coverage of an epoch in which the number of workers changes (docs/guides/validation-checkpoints-recovery.md).

A worker's batches are a function of (layout, rank, absolute iteration): its
shard is its balanced share of the records for that worker count, its stream
the passes over that shard, and a segment starting after iteration k opens
the stream at batch k. These tests replay exactly that with the workers' own
classes (``balanced_bounds`` for shards and local batches, ``TrainBatches``
for the streams) on record ids, and check the documented bound.
"""

import itertools
import math
import os
import tempfile

import numpy as np
import pytest

from sparktf.data.batching import Shard
from sparktf.data.columnar import balanced_bounds
from sparktf.data.shard_files import ShardFiles
from sparktf.data.train_batches import TrainBatches


def sightings(records, batch, stretches, shuffle=True, window=None, seed=11):
    """How often each record is drawn by ``stretches``: ``(workers, iterations done before, last iteration)``.

    With ``window`` the shards are streamed from local-disk spills, as for shards beyond the memory budget.
    """
    counts = np.zeros(records, np.int64)
    with tempfile.TemporaryDirectory() as spills:
        for workers, done, last in stretches:
            shards, batches = balanced_bounds(records, workers), balanced_bounds(batch, workers)
            for rank in range(workers):
                ids = np.arange(shards[rank], shards[rank + 1])
                source = Shard([ids]) if window is None else ShardFiles.write(
                    os.path.join(spills, f"{workers}-{rank}-{done}"), [(ids,)])
                local = batches[rank + 1] - batches[rank]
                stream = TrainBatches(source, local, shuffle, seed, rank, window_records=window, start_batch=done)
                for _ in range(last - done):
                    np.add.at(counts, next(stream)[0], 1)
                stream.close()
    return counts


ALIGNED = [(96, 24, 3, 2), (96, 24, 2, 3), (96, 24, 4, 3), (96, 24, 3, 1), (96, 32, 2, 1)]


@pytest.mark.parametrize("records, batch, before, after", ALIGNED)
@pytest.mark.parametrize("shuffle, window", [(True, None), (True, 10), (False, None)])
def test_aligned_layouts_see_a_record_at_most_once_per_worker_count(records, batch, before, after, shuffle, window):
    """Shards a whole number of local batches per epoch: every record at most twice, at least half of them seen."""
    per_epoch = math.ceil(records / batch)
    for epoch in range(3):
        start = epoch * per_epoch
        for change in range(1, per_epoch):
            first = (before, start, start + change)
            second = (after, start + change, start + per_epoch)
            counts = sightings(records, batch, [first, second], shuffle, window)
            assert counts.sum() == per_epoch * batch  # the global batch every iteration, as undisturbed
            assert counts.max() <= 2
            assert sightings(records, batch, [first], shuffle, window).max() == 1
            assert sightings(records, batch, [second], shuffle, window).max() == 1
            assert (counts > 0).sum() >= max(change, per_epoch - change) * batch >= records / 2
            # the next epoch on the new count is one whole pass again
            following = (after, start + per_epoch, start + 2 * per_epoch)
            np.testing.assert_array_equal(sightings(records, batch, [following], shuffle, window), 1)


def test_an_epoch_that_changes_twice_sees_a_record_at_most_once_per_worker_count():
    records, batch, per_epoch = 96, 24, 4
    for first, second in itertools.combinations(range(1, per_epoch), 2):
        stretches = [(3, 4, 4 + first), (2, 4 + first, 4 + second), (3, 4 + second, 8)]
        counts = sightings(records, batch, stretches)
        assert counts.sum() == per_epoch * batch and counts.max() <= 2


def test_any_layout_sees_a_record_at_most_once_per_pass_a_stretch_touches():
    """In general: a stretch of t iterations sees a record of a shard of s records at most ceil(t*b/s) + 1 times."""
    rng = np.random.default_rng(0)
    for _ in range(150):
        records = int(rng.integers(8, 80))
        batch = int(rng.integers(3, records + 1))
        workers = int(rng.integers(1, min(4, batch) + 1))
        done = int(rng.integers(0, 12))
        span = int(rng.integers(1, 2 * math.ceil(records / batch) + 1))
        counts = sightings(records, batch, [(workers, done, done + span)], shuffle=bool(rng.integers(2)))
        shards, batches = balanced_bounds(records, workers), balanced_bounds(batch, workers)
        assert counts.sum() == span * batch
        for rank in range(workers):
            size, local = shards[rank + 1] - shards[rank], batches[rank + 1] - batches[rank]
            assert counts[shards[rank]:shards[rank + 1]].max() <= math.ceil(span * local / size) + 1
