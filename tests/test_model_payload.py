"""models.payload and models.cache: capturing a Keras model, rebuilding it exactly, and the per-process cache.

The custom layer, loss and Lambda function are defined in this test module,
which executors cannot import: they must travel by value.
"""

import numpy as np
import keras
import pytest
import tensorflow as tf

from sparktf.models import cache as model_cache
from sparktf.models.payload import payload_key
from sparktf.errors import DataError
from sparktf.models.payload import ModelPayload

OFFSET = 0.25


class ScaleShift(keras.layers.Layer):
    """A custom layer with a trainable weight and a constructor argument."""

    def __init__(self, factor=2.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="scale")

    def call(self, x):
        return x * self.scale * self.factor

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}


def half_squared_error(y_true, y_pred):
    return 0.5 * keras.ops.mean(keras.ops.square(y_true - y_pred))


class Doubler(keras.Model):
    """A subclassed model whose constructor takes plain values."""

    def __init__(self, units=3, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.dense = keras.layers.Dense(units)

    def call(self, x):
        return self.dense(x) * 2.0


def _data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
    return x, y


def _trained_model():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((4,))
    h = ScaleShift(1.5)(inputs)
    h = keras.layers.Lambda(lambda t: tf.tanh(t) + OFFSET)(h)
    h = keras.layers.Dense(8, activation="relu")(h)
    h = keras.layers.BatchNormalization()(h)
    outputs = keras.layers.Dense(1)(h)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=half_squared_error, metrics=["mae"])
    x, y = _data()
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    return model


def _values(variables):
    return [v.numpy() for v in variables]


def _assert_same_arrays(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        np.testing.assert_array_equal(a, e)


@pytest.fixture(scope="module")
def trained():
    return _trained_model()


def test_round_trip_restores_weights_optimizer_and_compile(trained):
    payload = ModelPayload.from_bytes(ModelPayload.from_model(trained).to_bytes())
    rebuilt = payload.build()

    _assert_same_arrays(_values(rebuilt.weights), _values(trained.weights))
    _assert_same_arrays(_values(rebuilt.optimizer.variables), _values(trained.optimizer.variables))
    assert int(rebuilt.optimizer.iterations.numpy()) == 8
    # BatchNorm's moving statistics are non-trainable and must travel too.
    bn = [layer for layer in rebuilt.layers if isinstance(layer, keras.layers.BatchNormalization)][0]
    assert len(bn.non_trainable_weights) == 2
    assert not np.allclose(bn.moving_variance.numpy(), 1.0)

    x, y = _data(16, seed=3)
    np.testing.assert_array_equal(rebuilt.predict_on_batch(x), trained.predict_on_batch(x))
    assert rebuilt.loss is not trained.loss and rebuilt.loss.__name__ == "half_squared_error"
    np.testing.assert_allclose(
        rebuilt.evaluate(x, y, verbose=0), trained.evaluate(x, y, verbose=0), rtol=1e-6
    )


def test_rebuilt_model_continues_training_identically(trained):
    original = ModelPayload.from_model(trained).build()
    rebuilt = ModelPayload.from_model(original).build()
    x, y = _data(32, seed=5)
    original.fit(x, y, batch_size=16, shuffle=False, verbose=0)
    rebuilt.fit(x, y, batch_size=16, shuffle=False, verbose=0)
    for a, b in zip(_values(rebuilt.weights), _values(original.weights)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_without_optimizer_state(trained):
    payload = ModelPayload.from_model(trained, include_optimizer=False)
    assert payload.optimizer_variables == ()
    rebuilt = payload.build()
    assert int(rebuilt.optimizer.iterations.numpy()) == 0
    _assert_same_arrays(_values(rebuilt.weights), _values(trained.weights))


def test_uncompiled_and_subclassed_models():
    x, _ = _data(4)
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    subclassed = Doubler(3)
    subclassed(x)
    for model in (plain, subclassed):
        rebuilt = ModelPayload.from_model(model).build()
        assert type(rebuilt) is type(model)
        np.testing.assert_array_equal(rebuilt.predict_on_batch(x), model.predict_on_batch(x))


def test_unserializable_subclassed_model_names_the_fix():
    class Wrapper(keras.Model):
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def call(self, x):
            return self.layer(x)

    model = Wrapper(keras.layers.Dense(2))
    model(np.zeros((1, 4), "float32"))
    with pytest.raises(DataError, match="(?s)Wrapper.*get_config"):
        ModelPayload.from_model(model)

    class NoKwargs(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    model = NoKwargs()
    model(np.zeros((1, 4), "float32"))
    with pytest.raises(DataError, match=r"(?s)NoKwargs.*\*\*kwargs"):
        ModelPayload.from_model(model)


def test_key_is_a_content_hash(trained):
    first = ModelPayload.from_model(trained)
    assert ModelPayload.from_bytes(first.to_bytes()).key == first.key
    assert payload_key(first.to_bytes()) == first.key
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    assert ModelPayload.from_model(other).key != first.key


def test_bad_and_corrupted_bytes_raise_data_error(trained):
    data = bytearray(ModelPayload.from_model(trained).to_bytes())
    with pytest.raises(DataError, match="not a sparktf model payload"):
        ModelPayload.from_bytes(b"hello")
    data[-1] ^= 0xFF
    with pytest.raises(DataError, match="corrupted"):
        ModelPayload.from_bytes(bytes(data))


def test_load_cached_returns_one_object_per_content(trained):
    data = ModelPayload.from_model(trained).to_bytes()
    before = model_cache.load_count()
    first = model_cache.load_cached(data)
    assert model_cache.load_cached(data) is first
    assert model_cache.load_count() == before + 1


def test_model_cache_is_bounded_lru():
    cache = model_cache.ModelCache(max_entries=2)
    for key in ("a", "b", "a", "c", "a", "b"):
        cache.get_or_load(key, object)
    # "a" stayed recent, "b" was evicted by "c" and loaded again.
    assert cache.loads == 4


def test_a_loader_may_load_another_entry():
    cache = model_cache.ModelCache()
    outer = cache.get_or_load("outer", lambda: ("wraps", cache.get_or_load("inner", object)))
    assert outer[1] is cache.get_or_load("inner", object)
    assert cache.loads == 2


def test_a_scoring_query_does_not_evict_a_training_step_the_slots_count_models():
    cache = model_cache.ModelCache()  # 4 models
    trained = cache.get_or_load("payload", object)
    step = cache.derived(trained, "train-step", lambda model: ("step", model))
    cache.derived(trained, "batch-maps/k", lambda model: ("maps", model))
    for query in range(3):  # three scoring queries: a model, its runner and its batch maps each
        scored = cache.get_or_load(f"keras-predict:{query}", object)
        cache.derived(scored, "keras-runner", lambda model: ("runner", model))
        cache.derived(scored, "batch-maps/k", lambda model: ("maps", model))
    assert cache.derived(trained, "train-step", lambda model: pytest.fail("the step was traced again")) is step
    assert cache.loads == 4

    for query in range(4):  # the training model leaves with its step
        cache.get_or_load(f"another:{query}", object)
    assert cache.derived(trained, "train-step", lambda model: ("new", model)) == ("new", trained)  # not kept
    assert cache.derived(trained, "train-step", lambda model: ("newer", model)) == ("newer", trained)


def test_rebuilt_on_executors_exactly_and_once_per_worker(sc, trained):
    """The executors cannot import this test module: the custom objects travel by value."""
    broadcast = sc.broadcast(ModelPayload.from_model(trained).to_bytes())
    x, _ = _data(8, seed=7)

    def rebuild(partition):
        import os

        from sparktf.models import cache as mio

        model = mio.load_cached(broadcast)
        weights = [v.numpy() for v in model.weights]
        slots = [v.numpy() for v in model.optimizer.variables]
        yield os.getpid(), mio.load_count(), id(model), weights, slots, model.predict_on_batch(x)

    first = sc.parallelize(range(2), 2).mapPartitions(rebuild).collect()
    second = sc.parallelize(range(2), 2).mapPartitions(rebuild).collect()

    expected_prediction = trained.predict_on_batch(x)
    for _, _, _, weights, slots, prediction in first + second:
        _assert_same_arrays(weights, _values(trained.weights))
        _assert_same_arrays(slots, _values(trained.optimizer.variables))
        np.testing.assert_array_equal(prediction, expected_prediction)
    after_first = {pid: (count, model_id) for pid, count, model_id, *_ in first}
    reused = [(pid, count, model_id) for pid, count, model_id, *_ in second if pid in after_first]
    assert reused, "Spark did not reuse any Python worker between the two jobs"
    for pid, count, model_id in reused:
        assert (count, model_id) == after_first[pid]
    broadcast.destroy()
