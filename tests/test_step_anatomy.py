"""Per-rank step anatomy: each rank's split of a step, stragglers named with their phase (live, and from the
segment's records), and a Chrome-trace timeline. A slow rank is injected for real (a hook layer sleeping in compute
on one rank, a batch map sleeping on one partition, a hook slowing the link from one rank to the next); the check that nobody is
named without one runs on step timings recorded by ``benchmarks/record_step_timings.py``, and two real slowdowns
(a slow link, a CPU quota) on recordings of ``benchmarks/straggler_setups.py``."""

import gc
import json
import logging
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
from sparktf.collective.channel import RankReport
from sparktf.collective.link import RingLink
from sparktf.collective.transport import HEADER
from sparktf.training.driver.anatomy import ANATOMY_PHASES, CallAnatomy, chrome_trace, find_stragglers, rank_timings
from sparktf.training.worker.step_clock import STEP_COLUMNS, STEP_PHASES, RankAnatomy, window_summary

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "programs"))
from hook_layers import PythonHook  # noqa: E402

HEADER_BYTES = HEADER.size  # a ring frame's header (a number: this module's code travels by value)
RECORDED = os.path.join(os.path.dirname(__file__), "data", "step_timings_2_ranks.npz")
SLEEP = 0.03


class SlowRankOne(PythonHook):
    """Sleeps in the forward pass on rank 1 only."""

    def hook(self):
        from pyspark import TaskContext

        if TaskContext.get().partitionId() == 1:
            time.sleep(SLEEP)


class SlowLink:
    """The receiving end of a slow link: each frame's bytes after its header take ``SLEEP`` to arrive (the sender's
    socket buffer took them at once, so its sends look fast); everything else is the socket's."""

    def __init__(self, sock):
        self._sock = sock

    def recv_into(self, view, *args):
        if len(view) != HEADER_BYTES:  # a frame's body (this test's frames are never a header's size)
            time.sleep(SLEEP)
        return self._sock.recv_into(view, *args)

    def __getattr__(self, name):
        return getattr(self._sock, name)


class SlowLinkFromRankOne(PythonHook):
    """Puts the link from rank 1 to rank 0 (rank 0's live ``RingLink``'s left socket, found once) behind a
    :class:`SlowLink`."""

    def hook(self):
        from pyspark import TaskContext

        slowed = self.__dict__.get("slowed")
        if TaskContext.get().partitionId() != 0 or (slowed is not None and slowed._left.fileno() != -1):
            return
        for link in [o for o in gc.get_objects() if isinstance(o, RingLink) and o._left.fileno() != -1]:
            if not isinstance(link._left, SlowLink):  # this job's link only: gone with it, nothing left behind
                link._left = SlowLink(link._left)
                object.__setattr__(self, "slowed", link)  # found: no more searching (not a tracked attribute)


def _optimizer(sc, hook=None, map_function=None, records=256):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(records, 4)).astype(np.float32), rng.normal(size=(records, 1)).astype(np.float32)
    dataset = TFDataset.from_ndarrays((x, y), batch_size=32)
    if map_function is not None:
        dataset = dataset.map(map_function)
    layers = [keras.Input((4,))] + ([hook] if hook else []) + [keras.layers.Dense(1)]
    model = keras.Sequential(layers)
    model.compile(optimizer="sgd", loss="mse")
    return TFOptimizer.from_keras(model, dataset, num_workers=2)


def test_a_slow_rank_is_named_with_its_phase_and_the_profiled_steps_make_a_timeline(sc, tmp_path):
    computing = _optimizer(sc, hook=SlowRankOne())
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
    assert {e["name"] for e in slices} >= {"data", "compute", "exchange", "apply"}
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


def test_a_rank_behind_a_slow_link_is_named_in_the_exchange_while_training_runs(sc, caplog, capsys):
    class BatchTimes(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            ended.append(time.time())

    ended = []
    sending = _optimizer(sc, hook=SlowLinkFromRankOne(), records=32 * 160)
    with caplog.at_level(logging.WARNING, logger="sparktf.optimizer"):
        sending.optimize(MaxIteration(120), verbose=1, callbacks=[BatchTimes()])
    assert [(s.rank, s.phase) for s in sending.stragglers] == [(1, "exchange")], sending.stragglers
    timings = sending.rank_timings
    # its sends looked fast; its bytes were slow where they arrived (rank 0 received them for SLEEP a frame)
    assert timings[1]["send"] < 120 * SLEEP / 4 < 120 * SLEEP / 2 < timings[1]["delivery"] - timings[0]["delivery"]
    assert sending.stragglers[0].lost_share > 0.1
    warning = next(r for r in caplog.records if "slower than the median in exchange" in r.getMessage())
    assert "rank 1 (executor" in warning.getMessage() and "gradient_compression" in warning.getMessage()
    assert len(ended) == 120 and warning.created < ended[-1]  # named from the live windows, before training ended
    assert "straggler: rank 1 (executor" in capsys.readouterr().out  # one line in the progress output


def _recorded():
    """Step timings recorded from a 2-worker run without injection (``steps_<rank>``: seconds per step phase)."""
    data = np.load(RECORDED)
    return [data[f"steps_{rank}"] for rank in (0, 1)]


def _reports(steps, first, size):
    """Each window of ``size`` steps from ``first`` as the ranks' reports (what the driver's watchdog passes on)."""
    for start in range(first, first + len(steps[0]) - size + 1, size):
        yield {rank: RankReport("train", start, 0.0, windows=(window_summary(
            rows[start - first:start - first + size], f"127.0.0.1:{4000 + rank}", start),))
            for rank, rows in enumerate(steps)}


def _live(steps, size=5):
    anatomy = CallAnatomy()
    for reports in _reports(steps, 1, size):
        anatomy.watch(reports)
    return [(s.rank, s.phase) for s in anatomy.stragglers()]


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
        assert _live(part) == [], window  # the live judgement, on windows of 5 steps
    assert _live(steps, size=1) == []

    for column, phase in (("compute", "compute"), ("data", "data"), ("send", "exchange")):
        slowed = [steps[0], steps[1].copy()]
        slowed[1][:, STEP_COLUMNS.index(column)] += SLEEP
        found = find_stragglers(_records(slowed))
        assert [(s.rank, s.phase) for s in found] == [(1, phase)]
        assert _live([rows[:10] for rows in slowed]) == [(1, phase)]  # two windows of 5 steps are enough

    timings = rank_timings(_records(steps))
    exchange = STEP_PHASES.index("exchange")
    for rank in (0, 1):  # the exchange is split into the wait and the transfer, nothing lost
        assert timings[rank]["exchange_wait"] + timings[rank]["transfer"] == \
            pytest.approx(steps[rank][:, exchange].sum())
    assert chrome_trace(_records(steps))["traceEvents"][0]["ph"] == "M"


def test_a_bursty_rank_is_named_by_the_seconds_the_others_lost_waiting_for_it():
    steps = _recorded()
    stall, every = 0.07, 10  # a CPU quota's bursts: most steps at full speed, one in ten stalled 70 ms
    bursty = [steps[0].copy(), steps[1].copy()]
    stalled = np.arange(0, len(steps[0]), every)
    inside = 0.01  # and stalled inside the all-reduce too, which both ranks' exchange shows
    bursty[1][stalled, STEP_COLUMNS.index("compute")] += stall
    bursty[1][stalled, STEP_PHASES.index("exchange")] += inside
    for column in (STEP_PHASES.index("exchange"), STEP_COLUMNS.index("waited")):  # the healthy rank waits for it
        bursty[0][stalled, column] += stall + inside
    assert find_stragglers(_records(steps)) == []
    injected = (stall + inside) * len(stalled)
    found = find_stragglers(_records(bursty))
    assert [(s.rank, s.phase) for s in found] == [(1, "compute")]  # its median step hardly moved
    healthy = rank_timings(_records(steps))[1]["lost_seconds"]
    assert found[0].lost_seconds - healthy == pytest.approx(injected, rel=0.1)
    assert rank_timings(_records(bursty))[1]["lost_seconds"] - healthy == pytest.approx(injected, rel=0.1)
    assert 0.1 < found[0].lost_share < 1 and "the others waited" in found[0].describe()
    # a rank slower in a phase where the others spend nothing is described without dividing by their zero
    slowed = [steps[0].copy(), steps[1].copy()]
    slowed[0][:, STEP_COLUMNS.index("lookup")] = 0.0  # a model without tables: no lookup at all
    slowed[1][:, STEP_COLUMNS.index("lookup")] = SLEEP
    (lookup,) = find_stragglers(_records(slowed))
    assert lookup.phase == "lookup" and "infx" not in lookup.describe() and "who spend no time" in lookup.describe()


def test_a_rank_behind_a_slow_link_is_named_in_the_exchange_where_its_bytes_arrive():
    # the recorded slow link (50 Mbit, 3.1 MB of gradients): the slow rank's sends went into its socket buffer at
    # once; its peer received its bytes for ~0.5 s a step, and it left each all-reduce about half of that earlier
    steps = _recorded()
    link = 0.48
    slow = [steps[0].copy(), steps[1].copy()]
    exchange, receive, waited = STEP_PHASES.index("exchange"), STEP_COLUMNS.index("receive"), \
        STEP_COLUMNS.index("waited")
    for column in (exchange, receive, waited):
        slow[0][:, column] += link
    for column in (exchange, waited):  # its all-gather's bytes came from rank 0 once rank 0 had its reduce-scatter's
        slow[1][:, column] += link / 2
    found = find_stragglers(_records(slow))
    assert [(s.rank, s.phase) for s in found] == [(1, "exchange")], found
    assert _live([rows[:10] for rows in slow]) == [(1, "exchange")]
    healthy = rank_timings(_records(steps))[1]["lost_seconds"]
    slowdown = link * len(steps[0])
    assert found[0].lost_seconds - healthy == pytest.approx(slowdown, rel=0.1)
    timings = rank_timings(_records(slow))
    assert timings[1]["delivery"] == pytest.approx(timings[0]["receive"]) and timings[1]["send"] < 0.1


@pytest.mark.parametrize("setup, phase, live", [("slow_link", "exchange", True), ("cpu_quota", "compute", False)])
def test_real_slowdowns_recorded_name_the_slowed_rank_and_cost_what_they_slowed(setup, phase, live):
    # recorded by benchmarks/straggler_setups.py on a standalone cluster: one worker in a network namespace behind a
    # 50 Mbit/s link, or in a cgroup with a 30 % CPU quota; 60 iterations healthy, then 60 slowed
    data = np.load(os.path.join(os.path.dirname(__file__), "data", f"straggler_{setup}.npz"))
    slowed_rank = int(data["slowed_rank"])
    healthy, slowed = ([data[f"{run}_{rank}"] for rank in (0, 1)] for run in ("healthy", "slowed"))
    size = 15  # steps a live window holds (about a second's: 20-40 steps here)
    assert find_stragglers(_records(healthy)) == [] and _live(healthy, size) == []
    found = find_stragglers(_records(slowed))
    assert [(s.rank, s.phase) for s in found] == [(slowed_rank, phase)], found
    # a slow link from the live windows' medians; a quota's bursts hardly move them: named by its cost at the end
    assert _live(slowed, size) == ([(slowed_rank, phase)] if live else [])

    def step_seconds(steps):
        return max(rows[:, :len(STEP_PHASES)].sum() for rows in steps)

    assert found[0].lost_seconds == pytest.approx(step_seconds(slowed) - step_seconds(healthy), rel=0.1)


def test_a_rank_training_alone_cost_nobody_any_time():
    (rows,) = _recorded()[:1]
    timings = rank_timings([RankAnatomy(0, "127.0.0.1:4000", "127.0.0.1", {}, rows, 1)])
    assert timings[0]["lost_seconds"] == 0.0 and timings[0]["delivery"] == pytest.approx(rows[:, STEP_COLUMNS.index("receive")].sum())
