"""Elastic membership on the driver, without Spark: worker counts, waits, the flapping bound, failure counting.

The cluster is a fake: its task slots are whatever the test sets, and time
advances only when the code under test sleeps.
"""

import logging

import numpy as np
import pytest

from sparktf.errors import DataError, SparkTFError, TrainingError
from sparktf.spark import calls, interrupts, slot_admission
from sparktf.spark.session_state import session_state
from sparktf.spark.cluster import TaskSlots
from sparktf.training.driver import membership as membership_module
from sparktf.training.driver import segment_job
from sparktf.training.worker.segment_spec import SegmentResult, SegmentSpec
from sparktf.training.driver.membership import FLAP_LIMIT, FLAP_WINDOW, Membership
from sparktf.training.driver.preflight import check_membership
from sparktf.training.driver.segment_job import SegmentRunner
from sparktf.triggers import EveryEpoch, MaxIteration, TrainingProgress, TriggerOr


class FakeConf(dict):
    pass


class FakeSession:
    conf = FakeConf({"spark.task.cpus": "1"})

    def rendezvous_host(self):  # the address check of SegmentRunner.start
        return "127.0.0.1"


class FakeCluster:
    """Task slots set by the test; ``sleep`` advances the clock and runs the test's timed events."""

    def __init__(self, total, busy=0):
        self.total, self.busy, self.now = total, busy, 0.0
        self.events = []  # (time, function) run once the clock passes time
        self.slept = 0.0

    def probe(self):
        return TaskSlots(self.total, {"exec:1": self.busy} if self.busy else {})

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds
        self.slept += seconds
        for event in [e for e in self.events if e[0] <= self.now]:
            self.events.remove(event)
            event[1]()

    def at(self, when, function):
        self.events.append((when, function))


def membership(cluster, num_workers=3, min_workers=2, replace_wait=10.0, prepare=None):
    return Membership(FakeSession(), num_workers, min_workers, replace_wait, prepare, probe=cluster.probe,
                      clock=cluster.clock, sleep=cluster.sleep)


def test_a_full_cluster_launches_every_worker_without_waiting():
    cluster = FakeCluster(total=3)
    members = membership(cluster)
    assert members.next_launch(0) == 3 and members.next_launch(4) == 3
    assert cluster.slept == 0 and members.changes == 0


def test_first_launch_on_a_cluster_smaller_than_min_workers_fails_at_once_naming_the_numbers():
    cluster = FakeCluster(total=2)
    with pytest.raises(SparkTFError, match=r"num_workers=3 training workers need 3 free task slots.*only 2 free"):
        membership(cluster, min_workers=3).next_launch(0)
    with pytest.raises(SparkTFError, match=r"min_workers=3 .* only 1 free .*Use min_workers <= 1"):
        membership(FakeCluster(total=1), num_workers=4, min_workers=3).next_launch(0)
    assert cluster.slept == 0


def test_first_launch_with_slots_missing_waits_replace_wait_then_goes_on_with_fewer(caplog):
    cluster = FakeCluster(total=2)
    prepared = []
    members = membership(cluster, replace_wait=10, prepare=prepared.append)
    with caplog.at_level(logging.WARNING, logger="sparktf.optimizer"):
        assert members.next_launch(0) == 2
    assert 10 <= cluster.slept < 10.5
    assert prepared == [2]  # the layout for 2 workers was started while waiting, once
    assert "continuing on 2 of 3 workers from iteration 1" in caplog.text
    assert members.changes == 0  # starting with fewer is not a change


def test_a_lost_executor_after_a_failure_waits_then_continues_on_fewer_and_counts_a_change(caplog):
    cluster = FakeCluster(total=3)
    prepared = []
    members = membership(cluster, replace_wait=15, prepare=prepared.append)
    assert members.next_launch(0) == 3
    cluster.total = 2
    assert members.lost_slots()
    with caplog.at_level(logging.WARNING, logger="sparktf.optimizer"):
        assert members.next_launch(6, failed=True) == 2
    assert 15 <= cluster.slept < 15.5 and prepared == [2] and members.changes == 1
    assert "waiting up to 15 s" in caplog.text and "continuing on 2 of 3 workers from iteration 7" in caplog.text


def test_slots_that_come_back_within_replace_wait_keep_every_worker():
    cluster = FakeCluster(total=2)
    members = membership(cluster, num_workers=2, min_workers=1, replace_wait=20)
    members.current = 2
    cluster.total = 1
    cluster.at(4.0, lambda: setattr(cluster, "total", 2))
    assert members.next_launch(5, failed=True) == 2
    assert 4.0 <= cluster.slept < 4.5 and members.changes == 0


def test_busy_slots_are_not_lost_ones_and_are_waited_for_separately(monkeypatch):
    cluster = FakeCluster(total=3, busy=2)  # e.g. a finished job's tasks not yet counted as ended
    prepared = []
    members = membership(cluster, prepare=prepared.append)
    members.current = 2
    assert members.next_launch(3) == 2  # not grown (one slot free), not waited for (none is gone)
    assert cluster.slept == 0 and prepared == [] and members.changes == 0
    monkeypatch.setattr(membership_module, "SLOT_WAIT_SECONDS", 0.3)
    with pytest.raises(SparkTFError, match=r"busy: exec:1 runs 2\). The busy slots were not released within 0.3 s"):
        members.wait_free(2)
    cluster.busy = 0
    members.wait_free(3)


def test_a_degraded_run_grows_back_at_the_next_boundary_without_waiting(caplog):
    cluster = FakeCluster(total=2)
    members = membership(cluster)
    members.current = 2
    assert members.next_launch(4) == 2 and cluster.slept == 0  # nothing came back: no wait
    cluster.total = 3
    with caplog.at_level(logging.WARNING, logger="sparktf.optimizer"):
        assert members.next_launch(8) == 3
    assert cluster.slept == 0 and members.changes == 1
    assert "continuing on 3 of 3 workers from iteration 9: task slots came back" in caplog.text


def test_after_a_failure_a_degraded_run_does_not_grow():
    cluster = FakeCluster(total=3)
    members = membership(cluster, replace_wait=0)
    members.current = 2
    assert members.next_launch(4, failed=True) == 2


def test_below_min_workers_after_replace_wait_is_a_training_error_naming_the_slots():
    cluster = FakeCluster(total=3)
    members = membership(cluster, min_workers=3, replace_wait=12)
    assert members.next_launch(0) == 3
    cluster.total = 2
    assert not members.lost_slots()  # not elastic: a loss is a failure like any other
    with pytest.raises(TrainingError, match=r"min_workers=3 free task slots, but has only 2 \(of the 3 .*_wait=12 s"):
        members.next_launch(4, failed=True)
    assert 12 <= cluster.slept < 12.5


def test_changes_beyond_the_flapping_bound_end_training():
    cluster = FakeCluster(total=3)
    members = membership(cluster, replace_wait=0)
    members.next_launch(0)
    for change in range(FLAP_LIMIT):
        cluster.total = 2 if change % 2 == 0 else 3
        members.next_launch(change, failed=cluster.total == 2)
    assert members.changes == FLAP_LIMIT
    cluster.total = 2
    with pytest.raises(TrainingError, match=rf"changed {FLAP_LIMIT + 1} times within {FLAP_WINDOW:g} s"):
        members.next_launch(99, failed=True)


def test_changes_spread_over_more_than_the_window_are_allowed():
    cluster = FakeCluster(total=3)
    members = membership(cluster, replace_wait=0)
    members.next_launch(0)
    for change in range(3 * FLAP_LIMIT):
        cluster.now += FLAP_WINDOW / 4
        cluster.total = 2 if change % 2 == 0 else 3
        members.next_launch(change, failed=cluster.total == 2)
    assert members.changes == 3 * FLAP_LIMIT


def test_min_workers_out_of_range_is_refused():
    with pytest.raises(ValueError, match="min_workers"):
        membership(FakeCluster(total=3), num_workers=3, min_workers=4)


@pytest.mark.parametrize("min_workers, replace_wait", [(4, 60), (0, 60), (2.5, 60), (2, -1), (2, float("inf")),
                                                       (2, "60")])
def test_tfoptimizer_settings_out_of_range_are_refused_naming_them(min_workers, replace_wait):
    name = "replace_wait" if min_workers == 2 else "min_workers"
    with pytest.raises(ValueError, match=name):
        check_membership(3, min_workers, replace_wait)


def test_min_workers_defaults_to_num_workers():
    assert check_membership(3, None, 60) == 3 and check_membership(3, 1, 0) == 1


# ---------------------------------------------------------------------- the runner's failure counting


class FakeInputs:
    def __init__(self):
        self.opened = []

    def get(self, workers):
        self.opened.append(workers)
        return f"rdd-{workers}", f"feed-{workers}"

    def local_batches(self, workers):
        return [64 // workers + (1 if rank < 64 % workers else 0) for rank in range(workers)]


def spec():
    return SegmentSpec(None, (), TrainingProgress(4, 4, None, None), MaxIteration(100), None, 1.0)


def result(iteration=5):
    empty = np.zeros(0)
    return SegmentResult(iteration, None, None, empty, empty, empty, empty)


def scripted_jobs(monkeypatch, outcomes, cluster=None, lose_on_failure=False):
    """``run_segment_job`` replaced: each call takes the next outcome (an exception to raise, or a result)."""
    calls = []

    def fake(sc, data, job_spec, state, workers, on_reports=None, profile=None, stacks_folder=None):
        calls.append((data, job_spec, workers))
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            if lose_on_failure:
                cluster.total -= 1
            raise outcome
        return outcome

    monkeypatch.setattr(segment_job, "run_segment_job", fake)
    return calls


def test_a_failure_that_changes_the_count_is_not_counted_in_max_failures(monkeypatch):
    cluster = FakeCluster(total=3)
    inputs = FakeInputs()
    runner = SegmentRunner(FakeSession(), inputs, membership(cluster, replace_wait=5), max_failures=0)
    calls = scripted_jobs(monkeypatch, [RuntimeError("executor lost"), result()], cluster, lose_on_failure=True)
    launches = []
    done = runner.run(spec(), lambda: None, on_launch=launches.append)
    assert done.workers == 2 and launches == [3, 2] and runner.failures == 0
    assert inputs.opened == [3, 2]
    (_, first, _), (data, second, workers) = calls
    assert first.local_batches == [22, 21, 21] and first.feed == "feed-3" and repr(first.stop) == "MaxIteration(100)"
    assert data == "rdd-2" and workers == 2 and second.local_batches == [32, 32] and second.feed == "feed-2"
    assert repr(second.stop) == repr(TriggerOr(MaxIteration(100), EveryEpoch()))  # degraded: ends with the epoch


def test_a_failure_on_the_same_count_is_counted_and_max_failures_stops_at_once(monkeypatch):
    cluster = FakeCluster(total=3)
    runner = SegmentRunner(FakeSession(), FakeInputs(), membership(cluster, replace_wait=60), max_failures=1)
    scripted_jobs(monkeypatch, [RuntimeError("flaky"), result()])
    assert runner.run(spec(), lambda: None).workers == 3 and runner.failures == 1
    scripted_jobs(monkeypatch, [RuntimeError("flaky again")])
    with pytest.raises(TrainingError, match=r"failed 2 time\(s\) \(max_failures=1\).*flaky again"):
        runner.run(spec(), lambda: None)
    assert cluster.slept == 0  # no waiting before giving up


def test_deterministic_errors_are_not_relaunched(monkeypatch):
    runner = SegmentRunner(FakeSession(), FakeInputs(), membership(FakeCluster(total=3)), max_failures=3)
    scripted_jobs(monkeypatch, [DataError("bad record")])
    with pytest.raises(DataError):
        runner.run(spec(), lambda: None)
    assert runner.failures == 0


def test_start_decides_the_first_launch_before_any_job(monkeypatch):
    cluster = FakeCluster(total=3)
    runner = SegmentRunner(FakeSession(), FakeInputs(), membership(cluster), max_failures=3)
    assert runner.start(0) == 3
    probes = []
    runner.membership.next_launch = lambda *args, **kwargs: probes.append(args)  # must not be asked again
    calls = scripted_jobs(monkeypatch, [result()])
    assert runner.run(spec(), lambda: None).workers == 3 and calls[0][2] == 3 and probes == []


def test_busy_slots_are_waited_for_once_the_launch_data_is_ready(monkeypatch):
    cluster = FakeCluster(total=3, busy=3)  # a layout job, built while waiting, holds the slots

    class LayoutInputs(FakeInputs):
        def get(self, workers):
            cluster.busy = 0  # joining the layout job: it ends
            return super().get(workers)

    monkeypatch.setattr(membership_module, "SLOT_WAIT_SECONDS", 0.2)
    runner = SegmentRunner(FakeSession(), LayoutInputs(), membership(cluster), max_failures=0)
    scripted_jobs(monkeypatch, [result()])
    assert runner.run(spec(), lambda: None).workers == 3


# ---------------------------------------------------------------------- the slot planner (concurrent calls)

class WaitingCall:
    """What the planner needs of a call, and nothing of Spark."""

    def __init__(self, what):
        self.what, self.held, self.key, self.timeout, self.interrupted = what, 0, "", 5.0, False

    def check(self):
        if self.interrupted:
            raise SparkTFError(f"{self.what} cancelled")

    def cancel_jobs(self):
        pass


def test_admission_alone_is_fifo_per_profile_and_grows_only_when_nobody_waits():
    import threading
    import types

    planner = slot_admission.SlotPlanner()
    first, big = WaitingCall("first"), WaitingCall("big")
    planner.acquire(first, 2, lambda: 3, first.timeout)
    assert planner.held() == 2 and planner.grantable(3) == 1
    taken = threading.Thread(target=planner.acquire, args=(big, 3, lambda: 3, big.timeout))
    taken.start()
    while not planner._queue:  # the big request queued, holding nothing
        pass
    assert planner.grantable(3) == 0 and not planner.try_grow(1, 3)  # a later small one waits behind it
    gpus = types.SimpleNamespace(id=7, taskResources={}, executorResources={})
    assert planner.try_grow(1, 3, profile=gpus) and planner.held(gpus) == 1  # another profile's, counted apart
    planner.release(2)
    taken.join(10)
    assert not taken.is_alive() and planner.held() == 3 and not planner._queue
    with pytest.raises(SparkTFError, match="needs 4 task slots at once, but the cluster has only 3"):
        planner.acquire(WaitingCall("huge"), 4, lambda: 3, 1.0)


class PlannerKind:
    """A session for spark/calls.py: ``total`` slots, no busy ones; cancelled tags recorded."""

    def __init__(self, total, slot_wait="3600"):
        self.total, self.cancelled, self.tags = total, [], []
        self.holder = type("Holder", (), {})()
        self._slot_wait = slot_wait

    def setting(self, key, default):
        return self._slot_wait if key == slot_admission.SLOT_WAIT_CONF else default

    def slots(self, profile=None):
        return TaskSlots(self.total, {})

    def add_tag(self, tag):
        self.tags.append(tag)

    def remove_tag(self, tag):
        self.tags.remove(tag)

    def cancel_tag(self, tag):
        self.cancelled.append(tag)

    @staticmethod
    def holder_stopped(holder):
        return False


def test_slot_requests_are_granted_in_order_and_never_hold_while_waiting():
    import threading

    kind = PlannerKind(total=3)
    order, started = [], threading.Event()
    with calls.call_scope(kind, "first") as first:
        assert first.hold(2) == 2 and session_state(kind).planner.held() == 2

        def wait_for(name, slots):
            with calls.call_scope(kind, name) as call:
                started.set()
                call.hold(slots)
                order.append((name, session_state(kind).planner.held()))

        big = threading.Thread(target=wait_for, args=("big", 3))
        big.start()
        assert started.wait(10)
        while not session_state(kind).planner._queue:  # the big request queued (it holds nothing meanwhile)
            pass
        # a later small request that would fit now waits behind the big one (FIFO: no starvation)
        assert session_state(kind).planner.grantable(3) == 0
        assert not first.planner.try_grow(1, 3)
    big.join(10)  # `first` ended and gave its slots back: the big one ran
    assert order == [("big", 3)] and session_state(kind).planner.held() == 0 and kind.tags == []


def test_a_request_beyond_the_cluster_fails_at_once_and_a_wait_past_slot_wait_names_the_holders():
    kind = PlannerKind(total=2, slot_wait="0.3")
    with calls.call_scope(kind, "optimize") as call:
        with pytest.raises(SparkTFError, match=r"optimize needs 3 task slots at once, but the cluster has only 2"):
            call.hold(3)
        assert call.hold(2) == 2
        with calls.call_scope(kind, "sparktf.run") as other:
            with pytest.raises(SparkTFError, match=r"sparktf.run waited 0 s for 1 .* held by other calls of this "
                                                   r"driver: optimize holds 2.*spark.sparktf.slotWait"):
                other.hold(1)
            assert other.held == 0 and call.busy_wait() >= calls.BUSY_WAIT_SECONDS
        assert call.busy_wait() == calls.BUSY_WAIT_SECONDS  # alone again
    assert session_state(kind).planner.held() == 0 and not session_state(kind).planner._queue


def test_an_interrupted_call_stops_waiting_and_has_its_jobs_cancelled():
    import threading
    import time

    kind = PlannerKind(total=1)
    errors = []
    with calls.call_scope(kind, "first") as first:
        first.hold(1)

        def waiting():
            with calls.call_scope(kind, "second") as call:
                try:
                    call.hold(1)
                except SparkTFError as error:
                    errors.append((str(error), call.tag))

        thread = threading.Thread(target=waiting)
        thread.start()
        while not session_state(kind).planner._queue:
            pass
        interrupts.interrupt_every_call()  # what Ctrl-C's handler does
        thread.join(10)
        deadline = time.monotonic() + 10
        while first.tag not in kind.cancelled and time.monotonic() < deadline:  # the background cancel's first round
            time.sleep(0.01)
        assert first.interrupted
    cancelling = [t for t in threading.enumerate() if t.name == "sparktf-interrupt"]
    for background in cancelling:
        background.join(10)  # it cancels again until the interrupted calls end: both have
    assert cancelling and not any(background.is_alive() for background in cancelling)
    assert errors and "cancelled: Ctrl-C" in errors[0][0]
    assert errors[0][1] in kind.cancelled and first.tag in kind.cancelled
