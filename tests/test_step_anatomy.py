"""Per-rank step anatomy: each rank's split of a step, stragglers named with their phase, and a Chrome-trace
timeline. A slow rank is injected for real (a hook layer sleeping in compute on one rank, a batch map sleeping on
one partition); the check that nobody is named without one runs on recorded step timings."""

import json
import os
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from sparktf import MaxIteration, TFDataset, TFOptimizer
from sparktf.errors import ConfigurationError
from sparktf.summary import TrainSummary
from sparktf.training.anatomy import ANATOMY_PHASES, chrome_trace, find_stragglers, rank_timings
from sparktf.training.step_clock import STEP_PHASES, RankAnatomy

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "programs"))
from hook_layers import PythonHook  # noqa: E402

RECORDED = os.path.join(os.path.dirname(__file__), "data", "step_timings_2_ranks.npz")
SLEEP = 0.03


class SlowRankOne(PythonHook):
    """Sleeps in the forward pass on rank 1 only."""

    def hook(self):
        from pyspark import TaskContext

        if TaskContext.get().partitionId() == 1:
            time.sleep(SLEEP)


def _optimizer(sc, hook=False, map_function=None):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(256, 4)).astype(np.float32), rng.normal(size=(256, 1)).astype(np.float32)
    dataset = TFDataset.from_ndarrays((x, y), batch_size=32)
    if map_function is not None:
        dataset = dataset.map(map_function)
    layers = [keras.Input((4,))] + ([SlowRankOne()] if hook else []) + [keras.layers.Dense(1)]
    model = keras.Sequential(layers)
    model.compile(optimizer="sgd", loss="mse")
    return TFOptimizer.from_keras(model, dataset, num_workers=2)


def test_a_slow_rank_is_named_with_its_phase_and_the_profiled_steps_make_a_timeline(sc, tmp_path):
    computing = _optimizer(sc, hook=True)
    with pytest.raises(ConfigurationError, match=r"profile_steps must be \(start, end\)"):
        computing.optimize(MaxIteration(1), profile_steps=(5, 3))
    summary = TrainSummary(str(tmp_path), "anatomy")
    computing.set_train_summary(summary)
    computing.optimize(MaxIteration(14), verbose=0, profile_steps=(4, 6))
    named = [(s.rank, s.phase) for s in computing.stragglers]
    assert named[0] == (1, "compute") and all(rank == 1 for rank, _ in named), computing.stragglers  # slowest first
    straggler = computing.stragglers[0]
    assert straggler.factor >= 1.5 and straggler.host and straggler.executor
    assert "rank 1 (executor" in straggler.describe() and "slower than the median in compute" in straggler.describe()
    timings = computing.rank_timings
    assert sorted(timings) == [0, 1] and all(set(ANATOMY_PHASES) <= set(t) for t in timings.values())
    assert timings[1]["compute"] - timings[0]["compute"] > 10 * SLEEP / 2
    assert timings[0]["exchange_wait"] > timings[1]["exchange_wait"]  # rank 0 waited for rank 1 at every step
    assert computing.last_timings["compute"] == pytest.approx(timings[0]["compute"], rel=0.2)  # rank 0's, as before
    slow, fast = (summary.read_scalar(f"StepTime/rank{rank}/compute") for rank in (1, 0))
    assert len(slow) == 1 and slow[0][0] == 14 and slow[0][1] - fast[0][1] > SLEEP / 2  # per step, in TensorBoard

    with open(computing.last_timeline) as trace:
        events = json.load(trace)["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["tid"] for e in slices} == {0, 1}
    assert {e["args"]["iteration"] for e in slices} == {4, 5, 6}
    assert {e["name"] for e in slices} >= {"data", "compute", "all-reduce", "apply"}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in slices)

    def slow_partition_one(features, labels):  # defined here: it travels by value
        def wait(values):
            from pyspark import TaskContext

            if TaskContext.get().partitionId() == 1:
                time.sleep(SLEEP)
            return values

        out = tf.py_function(wait, [features], tf.float32)
        out.set_shape(features.shape)
        return out, labels

    loading = _optimizer(sc, map_function=slow_partition_one)
    loading.optimize(MaxIteration(14), verbose=0)
    named = [(s.rank, s.phase) for s in loading.stragglers]
    assert named[0] == (1, "data") and all(rank == 1 for rank, _ in named), loading.stragglers
    assert loading.last_timeline is None


def _recorded():
    """Step timings recorded from a 2-worker run without injection (``steps_<rank>``: seconds per step phase)."""
    data = np.load(RECORDED)
    return [data[f"steps_{rank}"] for rank in (0, 1)]


def _records(steps, first=1):
    return [RankAnatomy(rank, f"127.0.0.1:{4000 + rank}", "127.0.0.1", {}, rows, first)
            for rank, rows in enumerate(steps)]


def test_recorded_runs_without_a_slow_rank_name_nobody_and_a_slowed_one_is_named():
    steps = _recorded()
    windows = 20
    size = len(steps[0]) // windows
    assert size >= 10
    for window in range(windows):
        part = [rows[window * size:(window + 1) * size] for rows in steps]
        assert find_stragglers(_records(part)) == [], window

    slowed = [steps[0], steps[1].copy()]
    slowed[1][:, STEP_PHASES.index("compute")] += SLEEP
    found = find_stragglers(_records(slowed))
    assert [(s.rank, s.phase) for s in found] == [(1, "compute")]

    timings = rank_timings(_records(steps))
    exchange = STEP_PHASES.index("exchange")
    for rank in (0, 1):  # the exchange is split into the wait and the transfer, nothing lost
        assert timings[rank]["exchange_wait"] + timings[rank]["transfer"] == \
            pytest.approx(steps[rank][:, exchange].sum())
    assert chrome_trace(_records(steps))["traceEvents"][0]["ph"] == "M"
