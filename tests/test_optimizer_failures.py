"""TFOptimizer's checks and failure handling: bad setup, too many workers, non-finite loss, recovery."""

import os
import re
import sys
import time
import traceback

import keras
import numpy as np
import pytest
import tensorflow as tf

from sparktf import (
    DataError,
    MaxEpoch,
    MaxIteration,
    MaxScore,
    SparkTFError,
    TFDataset,
    TFOptimizer,
    TrainingError,
)
from sparktf.errors import InternalError, WorkerTraceback
from sparktf.spark.cluster import WATCHDOG_SLACK_CONF

from concurrent_calls import in_threads

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs"))
from hook_layers import PythonHook, raise_once  # noqa: E402  (beside the test programs, which use it too)


def data(n=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    return x, (x @ np.array([[1.0], [-2.0], [3.0]], np.float32)).astype(np.float32)


def compiled_model(optimizer="sgd"):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, kernel_initializer="ones")])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def test_uncompiled_model_is_refused_naming_compile(sc):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    with pytest.raises(DataError, match="compile"):
        TFOptimizer.from_keras(model, TFDataset.from_ndarrays(data(), batch_size=8))


def test_dataset_without_batch_size_is_refused_by_optimize(sc):
    optimizer = TFOptimizer.from_keras(compiled_model(), TFDataset.from_ndarrays(data(), batch_per_thread=8))
    with pytest.raises(DataError, match="batch_size"):
        optimizer.optimize(MaxEpoch(1))
    assert set(optimizer.evaluate()) == {"loss"}


def test_too_many_workers_fails_fast_naming_both_numbers(sc):
    dataset = TFDataset.from_ndarrays(data(), batch_size=8)
    optimizer = TFOptimizer.from_keras(compiled_model(), dataset, num_workers=4)
    started = time.monotonic()
    # the free count can lag a task the previous test's job just ended (Spark's status store updates
    # asynchronously): the total is what makes the request impossible
    with pytest.raises(SparkTFError, match=r"num_workers=4 .*only \d free \(of 2 in total.*Use num_workers <= 2"):
        optimizer.optimize(MaxEpoch(1))
    assert time.monotonic() - started < 10


def test_non_finite_loss_raises_naming_the_iteration(sc):
    x, y = data()
    dataset = TFDataset.from_ndarrays((x * 1e3, y * 1e3), batch_size=8)
    optimizer = TFOptimizer.from_keras(compiled_model(keras.optimizers.SGD(1e3)), dataset, max_failures=3)
    with pytest.raises(TrainingError, match=r"not finite at iteration \d+") as raised:
        optimizer.optimize(MaxEpoch(10))
    failed_at = int(raised.value.args[0].split("iteration ")[1].split(":")[0])
    assert failed_at > 1
    assert optimizer.iteration == failed_at - 1  # the last finite update is kept
    assert all(np.isfinite(w).all() for w in optimizer.model.get_weights())
    assert f"keeps the weights of iteration {failed_at - 1}" in str(raised.value)


def test_a_loss_that_is_nan_from_the_first_step_with_finite_gradients_stops_at_iteration_one(sc):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    before = model.get_weights()

    def nan_loss(y_true, y_pred):  # log(-1): NaN, while its gradient (y_pred * 0) is zero
        return tf.reduce_mean(tf.math.log(y_pred * 0.0 - 1.0))

    optimizer = TFOptimizer.from_loss(model, nan_loss, "sgd", TFDataset.from_ndarrays(data(), batch_size=8))
    with pytest.raises(TrainingError, match=r"not finite at iteration 1: .* keeps the weights of iteration 0"):
        optimizer.optimize(MaxIteration(3))
    assert optimizer.iteration == 0
    for got, want in zip(model.get_weights(), before):
        np.testing.assert_array_equal(got, want)


class FailOnce(PythonHook):
    """Raises in the first training step run while ``marker`` does not exist."""

    def __init__(self, marker, **kwargs):
        super().__init__(**kwargs)
        self.marker = marker

    def hook(self):
        if not os.path.exists(self.marker):
            with open(self.marker, "w") as handle:
                handle.write("failed once")
            raise RuntimeError("injected worker failure")

    def get_config(self):
        return {**super().get_config(), "marker": self.marker}


def fail_once_model(marker, weights=None):
    model = keras.Sequential([keras.Input((3,)), FailOnce(marker), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    if weights is not None:
        model.set_weights(weights)
    return model


def test_worker_failure_is_recovered_and_equals_an_uninterrupted_run(sc, tmp_path):
    x, y = data(64)
    initial = fail_once_model(str(tmp_path / "unused")).get_weights()
    weights = []
    for name, pre_create in (("clean", True), ("failing", False)):
        marker = str(tmp_path / name)
        if pre_create:
            open(marker, "w").close()
        dataset = TFDataset.from_ndarrays((x, y), batch_size=16, seed=5)
        model = fail_once_model(marker, initial)
        optimizer = TFOptimizer.from_keras(model, dataset, model_dir=str(tmp_path / f"{name}-ckpt"))
        history = optimizer.optimize(MaxEpoch(3))
        assert history["iterations"] == 12 and len(history["loss"]) == 12
        weights.append(model.get_weights())
    assert open(str(tmp_path / "failing")).read() == "failed once"
    for clean, recovered in zip(*weights):
        np.testing.assert_allclose(recovered, clean, rtol=1e-6, atol=1e-6)


class AlwaysFails(PythonHook):
    """Fails every step with an error that looks like an infrastructure failure (relaunched)."""

    def hook(self):
        raise RuntimeError("the layer always fails")


def test_persistent_failure_raises_training_error_with_worker_message(sc):
    model = keras.Sequential([keras.Input((3,)), AlwaysFails(), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    optimizer = TFOptimizer.from_keras(model, TFDataset.from_ndarrays(data(), batch_size=8), max_failures=0)
    with pytest.raises(TrainingError, match=r"(?s)failed 1 time.*the layer always fails"):
        optimizer.optimize(MaxIteration(2))
    assert optimizer.iteration == 0


class BreakTheExchangeOnce(PythonHook):
    """On rank 0, makes this worker's next gradient exchange raise a ValueError, as a bug of sparktf's would.

    The exchange is patched for one call only (a reused Python worker runs later tests). ``marker`` gets a
    line per step run on rank 0, so the test sees whether the segment was relaunched.
    """

    def __init__(self, marker, **kwargs):
        super().__init__(**kwargs)
        self.marker = marker

    def hook(self):
        from pyspark import TaskContext

        from sparktf.training.worker.gradient_exchange import GradientExchange

        if TaskContext.get().partitionId() != 0:
            return
        with open(self.marker, "a") as handle:
            handle.write("step\n")
        raise_once(GradientExchange, "__call__", ValueError("injected: row offsets out of range"))

    def get_config(self):
        return {**super().get_config(), "marker": self.marker}


def test_a_bug_in_the_exchange_inside_a_spark_task_is_an_internal_error_at_once_never_the_datas(sc, tmp_path):
    marker = str(tmp_path / "steps")
    model = keras.Sequential([keras.Input((3,)), BreakTheExchangeOnce(marker), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    optimizer = TFOptimizer.from_keras(model, TFDataset.from_ndarrays(data(), batch_size=8), max_failures=3)
    with pytest.raises(InternalError, match=r"(?s)row offsets out of range.*please report it") as raised:
        optimizer.optimize(MaxIteration(2), verbose=0)
    assert not isinstance(raised.value, DataError)
    assert isinstance(raised.value.__cause__, WorkerTraceback)  # the barrier task's traceback, down to the injection
    assert "ValueError: injected: row offsets out of range" in str(raised.value.__cause__)
    assert open(marker).read() == "step\n"  # one step on rank 0, no relaunch although max_failures=3
    assert optimizer.iteration == 0


class FailEvaluationOnce(PythonHook):
    """On partition 1, makes this worker's evaluation task raise a ``StorageError`` (with its path and route) once
    Keras' evaluate is done: a sparktf error inside an evaluation task."""

    def hook(self):
        from pyspark import TaskContext

        from sparktf.errors import StorageError
        from sparktf.training.worker import evaluation

        if TaskContext.get().partitionId() == 1:
            raise_once(evaluation, "metric_variables",
                       StorageError("injected: the store refused the read", path="s3://bucket/eval", route="fsspec"))


def test_a_sparktf_error_in_an_evaluation_task_reaches_the_driver_as_its_record_with_its_fields(sc, monkeypatch):
    from sparktf.errors import StorageError, WorkerTraceback
    from sparktf.spark import remote_errors

    monkeypatch.setattr(remote_errors, "_error_in_text", lambda error: None)  # the driver cannot read Spark's text
    model = keras.Sequential([keras.Input((3,)), FailEvaluationOnce(), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    dataset = TFDataset.from_ndarrays(data(), batch_size=8)
    with pytest.raises(StorageError, match="injected: the store refused the read") as raised:
        TFOptimizer.from_keras(model, dataset).evaluate()
    # Spark's text carries neither the path nor the route: the record did
    assert (raised.value.path, raised.value.route, raised.value.transient) == ("s3://bucket/eval", "fsspec", False)
    # its one cause is the worker's traceback, down to the frame that raised; Spark's and Py4J's wrappers are not shown
    cause = raised.value.__cause__
    assert isinstance(cause, WorkerTraceback) and cause.__cause__ is None and raised.value.__suppress_context__
    assert "in evaluate_partition" in str(cause) and "in raising" in str(cause) and "injected: the store" in str(cause)
    shown = "".join(traceback.format_exception(raised.value))
    assert "Py4J" not in shown and "PythonException" not in shown and shown.count("the worker's traceback") == 1


class StallRankOne(PythonHook):
    """Makes the barrier task of rank 1 sleep, so rank 0 waits in the all-reduce."""

    def hook(self):
        from pyspark import TaskContext

        if TaskContext.get().partitionId() == 1:
            time.sleep(8)


def test_collective_timeout_surfaces_as_training_error_naming_the_rank(sc):
    model = keras.Sequential([keras.Input((3,)), StallRankOne(), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    dataset = TFDataset.from_ndarrays(data(), batch_size=8)
    optimizer = TFOptimizer.from_keras(model, dataset, max_failures=0, collective_timeout=1)
    started = time.monotonic()
    with pytest.raises(TrainingError, match=r"rank 1"):
        optimizer.optimize(MaxIteration(2))
    assert time.monotonic() - started < 30


def test_max_score_without_validation_data_is_refused(sc):
    optimizer = TFOptimizer.from_keras(compiled_model(), TFDataset.from_ndarrays(data(), batch_size=8))
    with pytest.raises(DataError, match="MaxScore.*validation data"):
        optimizer.optimize(end_trigger=MaxScore(0.9))


class SleepOnce(PythonHook):
    """Blocks inside a graph op (a ``tf.py_function`` that sleeps) on ``rank``, once (while ``marker`` is absent)."""

    def __init__(self, marker, rank, **kwargs):
        super().__init__(**kwargs)
        self.marker = marker
        self.rank = rank

    def hook(self):
        from pyspark import TaskContext

        task = TaskContext.get()
        if task is not None and task.partitionId() == self.rank and not os.path.exists(self.marker):
            with open(self.marker, "w") as handle:
                handle.write(str(os.getpid()))
            time.sleep(600)  # far beyond every bound: only sparktf can end this worker

    def get_config(self):
        return {**super().get_config(), "marker": self.marker, "rank": self.rank}


class SleepAtStep(SleepOnce):
    """As ``SleepOnce``, at the rank's ``step``-th training step (its warm-up's included), counted in ``marker.steps``."""

    def __init__(self, marker, rank, step, **kwargs):
        super().__init__(marker, rank, **kwargs)
        self.step = step

    def hook(self):
        from pyspark import TaskContext

        task = TaskContext.get()
        if task is not None and task.partitionId() == self.rank:
            with open(self.marker + ".steps", "a") as steps:
                steps.write(".")
            if os.path.getsize(self.marker + ".steps") >= self.step:
                super().hook()

    def get_config(self):
        return {**super().get_config(), "step": self.step}


def sleep_once_model(marker, rank, step=None):
    hook = SleepOnce(marker, rank) if step is None else SleepAtStep(marker, rank, step)
    model = keras.Sequential([keras.Input((3,)), hook, keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def test_a_rank_blocked_inside_a_graph_op_is_ended_and_training_completes(sc, tmp_path, caplog):
    marker = str(tmp_path / "slept")
    dataset = TFDataset.from_ndarrays(data(64), batch_size=16)
    optimizer = TFOptimizer.from_keras(sleep_once_model(marker, rank=1), dataset, collective_timeout=5)
    started = time.monotonic()
    history = optimizer.optimize(MaxIteration(4))
    # rank 0's collective timeout failed the segment; the message says where rank 1 was: in the hook's sleep (its
    # file and line, though AutoGraph converted the layer's call), at the iteration it hung in
    assert re.search(r"rank 1 stayed longest in phase '\w+' at iteration \d; its innermost frames: .*"
                     r"test_optimizer_failures\.py:\d+ in hook: time\.sleep\(600\).*every rank's stack", caplog.text)
    assert history["iterations"] == 4 and len(history["loss"]) == 4
    assert time.monotonic() - started < 5 + 60
    assert_process_ends(int(open(marker).read()))


def test_a_rank_hung_in_a_training_step_is_named_with_its_step_phase_and_iteration(sc, tmp_path, caplog):
    marker = str(tmp_path / "slept")
    dataset = TFDataset.from_ndarrays(data(64), batch_size=16)
    # rank 1 hangs in the forward pass of its third step (the warm-up, iterations 1 and 2, then 3)
    model_dir = str(tmp_path / "model")
    optimizer = TFOptimizer.from_keras(sleep_once_model(marker, rank=1, step=4), dataset, collective_timeout=5,
                                       model_dir=model_dir)
    history = optimizer.optimize(MaxIteration(4))
    assert history["iterations"] == 4
    assert re.search(r"rank 1 stayed longest in phase 'compute' at iteration 3; its innermost frames: .*"
                     r"test_optimizer_failures\.py:\d+ in hook: time\.sleep\(600\)", caplog.text), caplog.text
    # the stacks file shows where rank 0 waited (its ring receive), not the code that reported its failure
    with open(re.search(r"every rank's stack is in (\S+\.txt)", caplog.text).group(1)) as stacks:
        waiting = stacks.read().split("rank 1, ")[0]
    assert waiting.startswith("rank 0, phase 'exchange', iteration 3:") and "thread_stack" not in waiting
    assert re.search(r"ring\.py:\d+ in ring_allreduce", waiting), waiting
    assert_process_ends(int(open(marker).read()))


@pytest.fixture
def watchdog_slack_8s(sc):
    """The watchdog waits collective_timeout + 8 s instead of + 30 s, for the jobs this test starts."""
    sc.setLocalProperty(WATCHDOG_SLACK_CONF, "8")
    yield 8
    sc.setLocalProperty(WATCHDOG_SLACK_CONF, None)


def test_a_stall_the_collective_cannot_see_is_cancelled_by_the_watchdog(sc, tmp_path, caplog, watchdog_slack_8s):
    marker = str(tmp_path / "slept")
    dataset = TFDataset.from_ndarrays(data(64), batch_size=16)
    model_dir = str(tmp_path / "model")
    optimizer = TFOptimizer.from_keras(sleep_once_model(marker, rank=0), dataset, num_workers=1,
                                       collective_timeout=2, model_dir=model_dir)
    started = time.monotonic()
    history = optimizer.optimize(MaxIteration(3))
    assert history["iterations"] == 3
    assert time.monotonic() - started < 2 + watchdog_slack_8s + 60
    assert "watchdog" in caplog.text and "rank 0 made no progress" in caplog.text
    # where it hung: the task thread waits in the step's graph, whose tf.py_function sleeps in the hook layer
    assert re.search(r"its innermost frames: \S+ in quick_execute: .*\(and thread \S+ at \S+ in hook: ", caplog.text)
    dump = re.search(r"every rank's stack is in (\S+\.txt)", caplog.text).group(1)
    assert os.path.dirname(dump) == os.path.join(model_dir, "stacks")
    with open(dump) as stacks:
        assert re.match(r"rank 0, phase 'warm_up', iteration 0:\n  \S+", stacks.read())
    assert_process_ends(int(open(marker).read()))


def test_a_stalled_evaluation_task_is_cancelled_by_the_watchdog_and_its_worker_ended(sc, tmp_path, watchdog_slack_8s):
    marker = str(tmp_path / "slept")
    dataset = TFDataset.from_ndarrays(data(64), batch_size=16)
    optimizer = TFOptimizer.from_keras(sleep_once_model(marker, rank=0), dataset, collective_timeout=2)
    started = time.monotonic()
    with pytest.raises(TrainingError, match=r"watchdog: partition 0 made no progress .* phase 'evaluate' at batch 0"):
        optimizer.evaluate()
    assert time.monotonic() - started < 2 + watchdog_slack_8s + 30
    assert_process_ends(int(open(marker).read()))
    sc.setLocalProperty(WATCHDOG_SLACK_CONF, None)  # fresh Python workers may take more than 10 s under load
    assert set(optimizer.evaluate()) == {"loss"}  # the slot is free again (and the layer sleeps only once)


def assert_process_ends(pid, within=30):
    """The stuck Python worker ``pid`` is gone (or a zombie) within ``within`` seconds (polled)."""
    deadline = time.monotonic() + within
    while True:
        try:
            with open(f"/proc/{pid}/status") as status:
                if "zombie" in status.read():
                    return
        except FileNotFoundError:
            return
        assert time.monotonic() < deadline, f"the stuck Python worker {pid} is still alive"
        time.sleep(0.2)


# ---------------------------------------------------------------------- concurrent calls (model selection)

def _planner(spark):
    from sparktf.spark.sessions import session_kind
    from sparktf.spark.session_state import session_state

    return session_state(session_kind(spark)).planner


def test_one_concurrent_call_fails_while_the_other_completes(spark):
    failing = keras.Sequential([keras.Input((3,)), AlwaysFails(), keras.layers.Dense(1)])
    failing.compile(optimizer="sgd", loss="mse")
    bad = TFOptimizer.from_keras(failing, TFDataset.from_ndarrays(data(), batch_size=8), num_workers=1, max_failures=0)
    good = TFOptimizer.from_keras(compiled_model(), TFDataset.from_ndarrays(data(), batch_size=8), num_workers=1)
    threads, outcomes = in_threads({"bad": lambda: bad.optimize(MaxIteration(2), verbose=0),
                                     "good": lambda: good.optimize(MaxIteration(60), verbose=0)})
    for thread in threads:
        thread.join(120)
    assert isinstance(outcomes["bad"], TrainingError) and "the layer always fails" in str(outcomes["bad"])
    assert "failed 1 time(s)" in str(outcomes["bad"])
    assert outcomes["good"]["iterations"] == 60 and np.isfinite(outcomes["good"]["loss"]).all()
    assert bad.iteration == 0 and good.iteration == 60 and _planner(spark).held() == 0


def test_ctrl_c_during_two_calls_cancels_both_and_frees_every_slot(spark, sc):
    import signal
    import threading

    from sparktf.spark.cluster import busy_task_slots

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    planner = _planner(spark)
    optimizers = [TFOptimizer.from_keras(compiled_model(), TFDataset.from_ndarrays(data(), batch_size=8), num_workers=1)
                  for _ in range(2)]
    threads, outcomes = in_threads({f"trial {i}": (lambda o=o: o.optimize(MaxIteration(10 ** 7), verbose=0))
                                     for i, o in enumerate(optimizers)})
    deadline = time.monotonic() + 120
    while planner.held() < 2 or sum(busy_task_slots(sc).values()) < 2:  # both trials' tasks run
        assert time.monotonic() < deadline and not outcomes, outcomes
        time.sleep(0.05)
    interrupted = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)  # Ctrl-C: the main thread gets it, as in a script or notebook
    for thread in threads:
        thread.join(60)
    ended = time.monotonic() - interrupted
    assert all(isinstance(outcome, SparkTFError) and "cancelled: Ctrl-C" in str(outcome) for outcome in outcomes.values()), outcomes
    assert len(outcomes) == 2 and ended < 30 and planner.held() == 0
    while busy_task_slots(sc):  # the cancelled tasks end (their Python workers at the latest 3 s after the channel)
        assert time.monotonic() - interrupted < 60, busy_task_slots(sc)
        time.sleep(0.1)


def test_a_job_a_call_submits_after_ctrl_c_is_cancelled_too(spark, sc):
    """Ctrl-C may come while a call is between two jobs: the job it submits next, before it sees its flag, is cancelled."""
    import signal
    import threading

    from sparktf.spark.sessions import session_kind
    from sparktf.spark.calls import call_scope
    from sparktf.spark.interrupts import install_interrupt_handler

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    install_interrupt_handler()
    in_scope, interrupted = threading.Event(), threading.Event()

    def call_between_jobs():
        with call_scope(session_kind(spark), "a late call"):
            in_scope.set()
            assert interrupted.wait(60)
            return sc.parallelize([0], 1).map(lambda x: time.sleep(90) or x).collect()  # submitted after the Ctrl-C

    threads, outcomes = in_threads({"late": call_between_jobs})
    assert in_scope.wait(60), outcomes
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    interrupted.set()
    threads[0].join(60)
    assert isinstance(outcomes.get("late"), SparkTFError) and "cancelled: Ctrl-C" in str(outcomes["late"]), outcomes
    assert time.monotonic() - started < 30 and _planner(spark).held() == 0
