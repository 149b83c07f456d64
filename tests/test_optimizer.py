"""TFOptimizer training on real Spark barrier tasks: exactness, convergence, triggers, model kinds."""

import os
import sys
import time

import keras
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from sparktf import (
    EveryEpoch,
    MaxEpoch,
    MaxIteration,
    MinLoss,
    TFDataset,
    TFOptimizer,
    TriggerAnd,
    TriggerOr,
    SeveralIteration,
    TFPredictor,
)
from sparktf.errors import SparkTFError

from concurrent_calls import in_threads

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs"))
from hook_layers import PythonHook  # noqa: E402  (beside the test programs, which use it too)


def linear_model(optimizer, inputs=3):
    model = keras.Sequential(
        [keras.Input((inputs,)), keras.layers.Dense(1, kernel_initializer="zeros")]
    )
    model.compile(optimizer=optimizer, loss="mse")
    return model


def regression_data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = x @ np.array([[1.0], [-2.0], [3.0]], np.float32) + 0.5
    return x, y


def hand_sgd(x, y, batches, learning_rates):
    """Plain NumPy SGD on the mean squared error of a linear model from zero weights."""
    kernel, bias = np.zeros((x.shape[1], 1)), 0.0
    for rows, rate in zip(batches, learning_rates):
        xb, yb = x[rows].astype(np.float64), y[rows].astype(np.float64)
        grad = 2 * (xb @ kernel + bias - yb) / len(rows)
        kernel -= rate * xb.T @ grad
        bias -= rate * grad.sum()
    return kernel, bias


@pytest.mark.parametrize(
    "num_workers, batches",
    [
        (1, [np.arange(0, 8), np.arange(8, 16)]),
        (2, [np.r_[0:4, 8:12], np.r_[4:8, 12:16]]),
    ],
)
def test_one_epoch_equals_two_hand_computed_steps(sc, num_workers, batches):
    x, y = regression_data(16)
    dataset = TFDataset.from_ndarrays(
        (x, y), batch_size=8, shuffle=False, sequential_order=True, num_partitions=1
    )
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 1, 0.1, staircase=True)
    model = linear_model(keras.optimizers.SGD(schedule))
    optimizer = TFOptimizer.from_keras(model, dataset, num_workers=num_workers)
    history = optimizer.optimize(MaxEpoch(1), verbose=0)
    kernel, bias = hand_sgd(x, y, batches, [0.1, 0.01])
    np.testing.assert_allclose(model.get_weights()[0], kernel, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.get_weights()[1], [bias], rtol=1e-5, atol=1e-6)
    assert history["iterations"] == 2 and history["epochs"] == 1 and len(history["loss"]) == 2
    assert int(model.optimizer.iterations.numpy()) == 2
    # silent and without callbacks, the call still keeps its Keras History: the epoch's mean loss
    assert optimizer.history.history["loss"] == pytest.approx([np.mean(history["loss"])], rel=1e-6)


def nonlinear_model(weights=None):
    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    if weights is not None:
        model.set_weights(weights)
    return model


@pytest.mark.parametrize("records", [32, 31])  # 31: local batches of 15 and 16, a record-weighted mean
def test_full_batch_adam_same_weights_on_one_and_two_workers(sc, records):
    x, y = regression_data(records, seed=1)
    y = np.sin(y)
    initial = nonlinear_model().get_weights()
    results = []
    for workers in (1, 2):
        dataset = TFDataset.from_ndarrays((x, y), batch_size=records, shuffle=True, seed=3)
        model = nonlinear_model(initial)
        history = TFOptimizer.from_keras(model, dataset, num_workers=workers).optimize(MaxIteration(4))
        results.append((model.get_weights(), history["loss"]))
    (one, one_loss), (two, two_loss) = results
    for a, b in zip(one, two):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(one_loss, two_loss, rtol=1e-5, atol=1e-6)
    assert not np.allclose(one[0], initial[0])


def test_linear_regression_converges_and_continues(sc):
    x, y = regression_data(256)
    dataset = TFDataset.from_ndarrays((x, y), batch_size=32, seed=0)
    model = linear_model(keras.optimizers.SGD(0.1))
    optimizer = TFOptimizer.from_keras(model, dataset)
    first = optimizer.optimize(MaxEpoch(4))
    assert first["iterations"] == 32 and first["epochs"] == 4 and len(first["loss"]) == 32
    second = optimizer.optimize(MaxEpoch(8))
    assert second["iterations"] == 64 and len(second["loss"]) == 32
    assert second["loss"][-1] < first["loss"][-1] < first["loss"][0]
    np.testing.assert_allclose(model.get_weights()[0].ravel(), [1, -2, 3], atol=1e-3)
    np.testing.assert_allclose(model.get_weights()[1], [0.5], atol=1e-3)
    timings = optimizer.last_timings
    assert {"compute", "exchange", "apply", "launch", "data_cache", "state_fetch"} <= set(timings)
    # a new TFOptimizer on the same (now trained) model finds the executors' model and traced step
    again = TFOptimizer.from_keras(model, dataset)
    again.optimize(MaxIteration(4))
    assert again.iteration == 4 and "warm_up" not in again.last_timings
    np.testing.assert_allclose(model.get_weights()[0].ravel(), [1, -2, 3], atol=1e-3)


@pytest.mark.parametrize(
    "trigger, iterations",
    [
        (MaxIteration(11), 11),  # several epochs of 4 iterations, stopped mid-epoch
        (MaxEpoch(2), 8),
        (TriggerAnd(MaxEpoch(1), SeveralIteration(3)), 6),
        (TriggerOr(MaxIteration(5), MaxEpoch(3)), 5),
    ],
)
def test_end_triggers_run_exactly_their_iterations(sc, trigger, iterations):
    x, y = regression_data(64)
    dataset = TFDataset.from_ndarrays((x, y), batch_size=16)
    optimizer = TFOptimizer.from_keras(linear_model(keras.optimizers.SGD(0.01)), dataset)
    history = optimizer.optimize(end_trigger=trigger)
    assert history["iterations"] == iterations
    assert len(history["loss"]) == iterations
    assert history["epochs"] == iterations // 4


def test_min_loss_stops_when_loss_is_low(sc):
    x, y = regression_data(64)
    dataset = TFDataset.from_ndarrays((x, y), batch_size=16)
    optimizer = TFOptimizer.from_keras(linear_model(keras.optimizers.SGD(0.2)), dataset)
    history = optimizer.optimize(end_trigger=TriggerOr(MinLoss(0.05), MaxEpoch(50)))
    assert history["loss"][-1] < 0.05
    assert all(loss >= 0.05 for loss in history["loss"][:-1])
    assert history["iterations"] < 200


@pytest.mark.parametrize("bad", [10, "MaxEpoch(1)", None])
def test_non_trigger_raises_type_error(sc, bad):
    x, y = regression_data(16)
    optimizer = TFOptimizer.from_keras(
        linear_model("sgd"), TFDataset.from_ndarrays((x, y), batch_size=8)
    )
    with pytest.raises(TypeError, match="trigger"):
        optimizer.optimize(end_trigger=bad)


@pytest.mark.parametrize("profile, message", [
    ({"gpus": 1}, "local mode"),
    ({"gpu": 1}, r"takes the keys \['cpus', 'gpus'\]"),
    ({"cpus": 1.5}, "positive integer"),
    ("1 gpu", "must be a pyspark.resource.ResourceProfile"),
])
def test_resource_profile_is_refused_before_any_job_where_spark_cannot_run_it(sc, profile, message):
    data = TFDataset.from_ndarrays(regression_data(16), batch_size=8)
    with pytest.raises(SparkTFError, match=message):
        TFOptimizer.from_keras(linear_model("sgd"), data, resource_profile=profile)
    with pytest.raises(SparkTFError, match=message):
        TFPredictor.from_keras(linear_model("sgd"), data).predict(resource_profile=profile)


def embedding_model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Embedding(500, 8),
                              keras.layers.Flatten(), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="binary_crossentropy")
    return model


def test_embedding_gradients_travel_as_rows_and_two_workers_equal_fit(sc):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 500, size=(128, 4)).astype(np.int32)  # ids repeat within and across the workers
    y = (ids.sum(axis=1, keepdims=True) % 2).astype(np.float32)
    model, expected = embedding_model(), embedding_model()
    table = model.layers[0].get_weights()[0].copy()
    dataset = TFDataset.from_ndarrays((ids, y), batch_size=32, shuffle=False, sequential_order=True,
                                      num_partitions=1)
    optimizer = TFOptimizer.from_keras(model, dataset, num_workers=2)
    optimizer.optimize(MaxEpoch(2))
    # worker 0 reads records 0-63 and worker 1 64-127, 16 each per global batch
    order = np.concatenate([np.r_[16 * k:16 * k + 16, 64 + 16 * k:64 + 16 * k + 16] for k in range(4)])
    expected.fit(ids[order], y[order], batch_size=32, epochs=2, shuffle=False, verbose=0)
    for got, want in zip(model.get_weights(), expected.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    changed = np.any(model.layers[0].get_weights()[0] != table, axis=1)
    assert not changed[np.setdiff1d(np.arange(500), ids)].any()  # untouched rows stay
    traffic = optimizer.last_traffic
    assert traffic.sparse_tables == traffic.steps == 8 and traffic.dense_tables == 0
    assert traffic.sent * 5 < traffic.dense  # 8 x 500 floats of table against about 2 x 64 rows of 8


class ScaledDense(keras.layers.Layer):
    """A custom layer defined in the test module: it must reach the executors by value."""

    def __init__(self, units, scale=2.0, **kwargs):
        super().__init__(**kwargs)
        self.units, self.scale = units, scale

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], self.units), initializer="zeros")

    def call(self, inputs):
        return self.scale * tf.matmul(inputs, self.kernel)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "scale": self.scale}


def half_squared_error(y_true, y_pred):
    return 0.5 * tf.reduce_mean(tf.square(y_true - y_pred))


def test_custom_layer_and_loss_from_test_module_train_with_from_loss(sc):
    x, y = regression_data(64)
    y = y - 0.5
    model = keras.Sequential([keras.Input((3,)), ScaledDense(1)])
    dataset = TFDataset.from_ndarrays((x, y), batch_size=16)
    optimizer = TFOptimizer.from_loss(model, half_squared_error, keras.optimizers.SGD(0.05), dataset)
    history = optimizer.optimize(MaxEpoch(10))
    np.testing.assert_allclose(2 * model.get_weights()[0].ravel(), [1, -2, 3], atol=0.05)
    assert history["loss"][-1] < 0.01 * history["loss"][0]


def test_batchnorm_statistics_come_back_averaged(sc):
    x = np.concatenate([np.zeros((8, 2)), np.full((8, 2), 4.0)]).astype(np.float32)
    y = np.zeros((16, 1), np.float32)
    model = keras.Sequential(
        [keras.Input((2,)), keras.layers.BatchNormalization(momentum=0.0), keras.layers.Dense(1)]
    )
    model.compile(optimizer="sgd", loss="mse")
    dataset = TFDataset.from_ndarrays(
        (x, y), batch_size=16, shuffle=False, sequential_order=True, num_partitions=1
    )
    TFOptimizer.from_keras(model, dataset, num_workers=2).optimize(MaxIteration(1))
    moving_mean = model.layers[0].moving_mean.numpy()
    # worker 0 saw only zeros, worker 1 only fours: the average of their statistics is 2
    np.testing.assert_allclose(moving_mean, [2.0, 2.0], atol=1e-6)


def test_gradient_clipping_applies_to_the_global_gradient(sc):
    x, y = regression_data(32)
    dataset = TFDataset.from_ndarrays((x, y * 100), batch_size=32)
    by_norm = linear_model(keras.optimizers.SGD(1.0))
    TFOptimizer.from_keras(by_norm, dataset).set_gradient_clipping_by_l2_norm(0.5).optimize(MaxIteration(1))
    step = np.concatenate([w.ravel() for w in by_norm.get_weights()])  # from zero weights
    np.testing.assert_allclose(np.linalg.norm(step), 0.5, rtol=1e-5)
    by_value = linear_model(keras.optimizers.SGD(1.0))
    optimizer = TFOptimizer.from_keras(by_value, dataset).set_constant_gradient_clipping(-0.1, 0.1)
    optimizer.optimize(MaxIteration(1))
    np.testing.assert_allclose(np.abs(by_value.get_weights()[0]), 0.1, rtol=1e-6)


def test_from_keras_optimizer_and_metrics_replace_the_compiled_ones(sc):
    x, y = regression_data(16)
    model = linear_model("adam")
    optimizer = TFOptimizer.from_keras(
        model,
        TFDataset.from_ndarrays((x, y), batch_size=8),
        optimizer=keras.optimizers.SGD(0.5),
        metrics=["mae"],
    )
    assert isinstance(model.optimizer, keras.optimizers.SGD)
    np.testing.assert_allclose(float(model.optimizer.learning_rate), 0.5)
    assert set(optimizer.evaluate()) == {"loss", "mae"}


def test_bf16_gradient_compression_rounds_only_the_gradients_on_the_wire(sc):
    x, y = regression_data(16)
    dataset = TFDataset.from_ndarrays((x, y), batch_size=16, seed=0)
    runs = {}
    for compression in (None, "bf16"):
        model = linear_model(keras.optimizers.SGD(0.5))
        optimizer = TFOptimizer.from_keras(model, dataset, num_workers=2, gradient_compression=compression)
        loss = optimizer.optimize(MaxIteration(1))["loss"]
        runs[compression] = np.concatenate([w.ravel() for w in model.get_weights()]), loss
    (exact, exact_loss), (compressed, compressed_loss) = runs[None], runs["bf16"]
    # one SGD step from zero weights is -0.5 x the all-reduced gradient: bf16 values times a power of two
    np.testing.assert_array_equal(compressed, compressed.astype(ml_dtypes.bfloat16).astype(np.float32))
    # Each worker sends its share of the gradient, a sum of per-record terms g_i = 2 [x_i, 1] (0 - y_i) / 16;
    # one worker's share and the total are rounded to bf16 (8 significant bits), each off by at most
    # 2**-8 of a value of at most A = sum |g_i|; 2**-22 A covers the float32 sums of both runs.
    per_record = 2 * np.c_[x, np.ones(16)].astype(np.float64) * -y / 16
    bound = 0.5 * (2 * 2.0 ** -8 * (1 + 2.0 ** -8) + 2.0 ** -22) * np.abs(per_record).sum(axis=0)
    assert np.all(np.abs(compressed - exact) <= bound) and not np.array_equal(compressed, exact)
    np.testing.assert_allclose(compressed_loss, exact_loss, rtol=1e-6)  # the loss travels exactly
    with pytest.raises(ValueError, match="'bf16' or 'fp16', got 'int8'"):
        TFOptimizer.from_keras(model, dataset, gradient_compression="int8")


def weighted_classifier(weights=None):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(keras.optimizers.SGD(0.5), "sparse_categorical_crossentropy", metrics=["sparse_categorical_accuracy"],
                  weighted_metrics=[keras.metrics.SparseCategoricalCrossentropy(name="weighted_xent")])
    if weights is not None:
        model.set_weights(weights)
    return model


def test_sample_and_class_weights_train_validate_and_evaluate_as_keras_fit_and_evaluate(sc):
    rng = np.random.default_rng(7)
    x, xv = rng.normal(size=(64, 3)).astype(np.float32), rng.normal(size=(20, 3)).astype(np.float32)
    y, yv = rng.integers(0, 3, 64).astype(np.int32), rng.integers(0, 3, 20).astype(np.int32)
    w, wv = rng.uniform(0, 2, 64).astype(np.float32), rng.uniform(0, 2, 20).astype(np.float32)
    class_weight = {0: 0.5, 1: 2.0, 2: 1.5}
    dataset = TFDataset.from_ndarrays((x, y), sample_weight=w, val_tensors=(xv, yv, wv), batch_size=16,
                                      shuffle=False, sequential_order=True, num_partitions=2)
    model = weighted_classifier()
    reference = weighted_classifier(model.get_weights())
    optimizer = TFOptimizer.from_keras(model, dataset, num_workers=2)
    history = optimizer.optimize(MaxEpoch(1), validation_trigger=EveryEpoch(), class_weight=class_weight)
    # worker 0 holds records 0-31, worker 1 records 32-63; global batch k is 8 records of each
    order = np.concatenate([np.r_[8 * k:8 * k + 8, 32 + 8 * k:40 + 8 * k] for k in range(4)])
    folded = w * np.vectorize(class_weight.get)(y)  # Keras 3's fit refuses class_weight with sample_weight
    fitted = reference.fit(x[order], y[order], sample_weight=folded[order], batch_size=16, shuffle=False, verbose=0)
    for ours, keras_weights in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(ours, keras_weights, atol=1e-5)
    assert len(history["loss"]) == 4
    np.testing.assert_allclose(np.mean(history["loss"]), fitted.history["loss"][0], atol=1e-5)
    for name in ("weighted_xent", "sparse_categorical_accuracy"):
        np.testing.assert_allclose(history[name], fitted.history[name], atol=1e-5)
    validated = reference.evaluate(xv, yv, sample_weight=wv, verbose=0, return_dict=True)
    evaluated = reference.evaluate(x, y, sample_weight=w, verbose=0, return_dict=True)  # no class weights
    assert validated["weighted_xent"] != pytest.approx(reference.evaluate(xv, yv, verbose=0, return_dict=True)["weighted_xent"])
    for name, value in validated.items():
        np.testing.assert_allclose(history[f"val_{name}"], [value], atol=1e-5)
    for name, value in optimizer.evaluate().items():
        np.testing.assert_allclose(value, evaluated[name], atol=1e-5)
    predictions = np.stack(TFPredictor.from_keras(model, dataset).predict().collect())  # the weights are no input
    np.testing.assert_allclose(predictions, reference.predict(x, verbose=0), atol=1e-5)


class MeetOnce(PythonHook):
    """At its second step in a process (a training iteration, after the warm-up's step if there was one), writes
    ``marker`` and waits (at most 60 s) for ``partner``'s: two calls whose models meet train at once, if sparktf lets
    them."""

    def __init__(self, marker, partner=None, **kwargs):
        super().__init__(**kwargs)
        self.marker, self.partner, self.steps = marker, partner, 0

    def hook(self):
        self.steps += 1
        if self.steps == 2:
            open(self.marker, "w").close()
            deadline = time.monotonic() + 60
            while self.partner and not os.path.exists(self.partner) and time.monotonic() < deadline:
                time.sleep(0.01)

    def get_config(self):
        return {**super().get_config(), "marker": self.marker, "partner": self.partner}


def test_concurrent_calls_overlap_and_a_third_waits_its_turn_for_slots(spark, tmp_path, capsys):
    """Three 1-worker optimize calls from threads of the driver on local[2]: two train at once (their
    iterations' wall times overlap), the third gets a slot when one of them ends, and all three end with
    the same weights, as each would alone."""
    from sparktf import TrainSummary
    from sparktf.spark.sessions import session_kind
    from sparktf.spark.session_state import session_state

    planner = session_state(session_kind(spark)).planner
    x, y = regression_data(64)
    partners = {"a": "b", "b": "a", "c": None}
    optimizers = {}
    for name, partner in partners.items():
        dataset = TFDataset.from_ndarrays((x, y), batch_size=8, shuffle=False, sequential_order=True)
        meet = MeetOnce(str(tmp_path / f"{name}.met"), partner and str(tmp_path / f"{partner}.met"))
        model = keras.Sequential([keras.Input((3,)), meet, keras.layers.Dense(1, kernel_initializer="zeros")])
        model.compile(keras.optimizers.SGD(0.01), "mse")
        optimizers[name] = TFOptimizer.from_keras(model, dataset, num_workers=1)
        optimizers[name].set_train_summary(TrainSummary(str(tmp_path), name))
    train = {name: (lambda o=o: o.optimize(MaxIteration(200), verbose=2)) for name, o in optimizers.items()}
    threads, outcomes = in_threads({"a": train["a"], "b": train["b"]})
    deadline = time.monotonic() + 60
    while planner.held() < 2 and not outcomes:  # both first calls hold their slot: the third must wait
        assert time.monotonic() < deadline
        time.sleep(0.01)
    more, _ = in_threads({"c": train["c"]})
    for thread in threads + more:
        thread.join(120)
    outcomes.update(_)
    assert all(isinstance(outcomes[name], dict) and outcomes[name]["iterations"] == 200 for name in "abc"), \
        {name: str(outcome)[:3000] for name, outcome in outcomes.items()}
    walls = {name: optimizers[name].train_summary.read_scalar("Loss")[:, 2] for name in "abc"}
    assert walls["a"][0] < walls["b"][-1] and walls["b"][0] < walls["a"][-1]  # a and b trained at once
    assert walls["c"][0] >= min(walls["a"][-1], walls["b"][-1])  # c's first step after a or b ended
    for name in "bc":
        for ours, theirs in zip(optimizers[name].model.get_weights(), optimizers["a"].model.get_weights()):
            np.testing.assert_allclose(ours, theirs, atol=1e-6)
    assert planner.held() == 0
    printed = capsys.readouterr().out
    assert "[a] Epoch 25 - " in printed and "[c] Epoch 25 - " in printed  # labelled lines, no bars


def test_an_update_without_tables_is_compiled_only_after_enough_steps_and_trains_the_same(monkeypatch):
    from sparktf.training.worker import step as step_module
    from sparktf.training.worker.gradient_exchange import GradientExchange

    monkeypatch.setattr(step_module, "COMPILE_AFTER_UPDATES", 2)
    x, y = regression_data(8)
    reference, trained = nonlinear_model(), nonlinear_model()
    trained.set_weights(reference.get_weights())
    train_step = step_module.TrainStep(trained)
    compiled, xla_in_graph = [], []
    for _ in range(4):
        reference.train_on_batch(x, y)
        train_step.run(x, y, GradientExchange())
        compiled.append(train_step.last_update_compiled)
        step_graph = train_step._traced_step(x, y, None)[0].graph.as_graph_def()  # the step the next run takes
        xla_in_graph.append(any(f.attr["_XlaMustCompile"].b for f in step_graph.library.function))
    # two updates as TensorFlow ops, then XLA-compiled ones: a short job never pays the compile, nor a trace of the
    # compiled form (the step is traced again with it once the second update is applied)
    assert compiled == [False, False, True, True]
    assert xla_in_graph == [False, True, True, True]
    for got, want in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_a_long_runs_warm_up_takes_the_compiled_update_at_once_and_trains_the_same():
    from sparktf.training.worker.gradient_exchange import GradientExchange
    from sparktf.training.worker.step import TrainStep

    from sparktf.training.checkpoint import ModelState

    x, y = regression_data(8)
    reference, trained = nonlinear_model(), nonlinear_model()
    train_step = TrainStep(trained)
    start = ModelState.capture(trained, 0)
    train_step.warm_up(x, y, long_run=True)  # a stream's resident job: it pays the compile before its first pass
    assert train_step.last_update_compiled and not train_step.compile_pending
    start.apply_to(trained)  # the warm-up's updates undone, as the start state does
    reference.set_weights(trained.get_weights())
    for _ in range(3):
        reference.train_on_batch(x, y)
        train_step.run(x, y, GradientExchange())
        assert train_step.last_update_compiled
    for got, want in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-6)
