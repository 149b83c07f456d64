"""``sparktf.layers.DynamicEmbedding`` in plain Keras (one process, no Spark): exactness against a fixed
``Embedding``, admission, capacity, eviction, saving and export, string ids, determinism, bad arguments."""

from __future__ import annotations

import os
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from sparktf.errors import ConfigurationError
from sparktf.layers import DynamicEmbedding, DynamicEmbeddingEviction
from sparktf.layers.sketch import FALLBACK_SALT, bucket
from sparktf.layers.slots import table_slots
from sparktf.optimizers import LazyAdam, RowWiseAdagrad

DIM = 4


def _initializer() -> keras.initializers.Initializer:
    return keras.initializers.RandomUniform(-0.05, 0.05, seed=7)


def _model(table: keras.layers.Layer, width: int = 2, dtype: str = "int64", dense: bool = True,
           kernel_initializer: Any = None) -> keras.Model:
    """ids ``[batch, width]`` -> table -> Flatten -> Dense(1) (seeded unless given), or the table's vectors alone."""
    ids = keras.Input((width,) if width else (), dtype=dtype)
    vectors = table(ids)
    if not dense:
        return keras.Model(ids, vectors)
    kernel_initializer = kernel_initializer or keras.initializers.GlorotUniform(seed=3)
    outputs = keras.layers.Dense(1, kernel_initializer=kernel_initializer)(keras.layers.Flatten()(vectors))
    return keras.Model(ids, outputs)


def _fit(model: keras.Model, optimizer: keras.optimizers.Optimizer, x, y, **kwargs) -> keras.callbacks.History:
    model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
    return model.fit(x, y, batch_size=kwargs.pop("batch_size", 8), shuffle=False, verbose=0, **kwargs)


def _is_fallback_row(vector: np.ndarray, layer: DynamicEmbedding) -> bool:
    return bool(np.any(np.all(np.abs(layer.fallback.numpy() - vector) < 1e-7, axis=1)))


OPTIMIZERS = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "row_wise_adagrad": lambda: RowWiseAdagrad(0.1),
}
SLOTS = {"sgd_momentum": 1, "adam": 2, "row_wise_adagrad": 1}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_training_equals_a_fixed_embedding_fed_first_seen_indices(name):
    rng = np.random.default_rng(0)
    pool = np.concatenate([rng.integers(-2 ** 62, 2 ** 62, 30), np.array([0, 1, 2, -1, 2 ** 63 - 1, -2 ** 63])])
    x = rng.choice(pool, size=(2000, 2))
    y = rng.normal(size=(2000, 1)).astype("float32")
    first_seen = {key: index for index, key in enumerate(dict.fromkeys(x.reshape(-1).tolist()))}
    indices = np.vectorize(first_seen.get)(x)
    capacity = 48
    models = []
    for table in (DynamicEmbedding, keras.layers.Embedding):  # unseeded initializers: the same seeds for both
        keras.utils.set_random_seed(5)
        models.append(_model(table(DIM, capacity) if table is DynamicEmbedding else table(capacity, DIM),
                             kernel_initializer="glorot_uniform"))
    dynamic_model, fixed_model = models
    dynamic, fixed = dynamic_model.layers[1], fixed_model.layers[1]
    dynamic_optimizer, fixed_optimizer = OPTIMIZERS[name](), OPTIMIZERS[name]()
    _fit(dynamic_model, dynamic_optimizer, x, y)
    _fit(fixed_model, fixed_optimizer, indices, y)

    assert dynamic.stats()["step"] == 250 and dynamic.stats()["rows"] == len(first_seen) < capacity
    assert dynamic.stats()["fallback_reads"] == 0
    np.testing.assert_array_equal(dynamic.row_keys.numpy()[:len(first_seen)], list(first_seen))
    np.testing.assert_allclose(dynamic.embeddings.numpy(), fixed.embeddings.numpy(), atol=1e-6)
    assert np.abs(dynamic.embeddings.numpy() - dynamic.embeddings_initializer((capacity, DIM))).max() > 1e-3
    dynamic_slots, fixed_slots = table_slots(dynamic_optimizer, dynamic.embeddings), table_slots(
        fixed_optimizer, fixed.embeddings)
    assert len(dynamic_slots) == len(fixed_slots) == SLOTS[name]
    for (mine, _), (theirs, _) in zip(dynamic_slots, fixed_slots):
        assert np.abs(theirs.numpy()).max() > 0
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), atol=1e-6)
    np.testing.assert_allclose(dynamic_model.layers[-1].kernel.numpy(), fixed_model.layers[-1].kernel.numpy(),
                               atol=1e-6)


def test_an_id_gets_its_row_at_its_admit_after_th_sighting():
    layer = DynamicEmbedding(DIM, 8, admit_after=3, fallback_bins=16, embeddings_initializer=_initializer())
    for sighting in (1, 2):
        vector = layer(np.array([42, 7 + sighting]), training=True).numpy()[0]
        assert layer.keys().size == 0
        assert _is_fallback_row(vector, layer)
    vector = layer(np.array([42]), training=True).numpy()[0]
    np.testing.assert_array_equal(layer.keys(), [42])
    np.testing.assert_allclose(vector, layer.embeddings.numpy()[0], atol=1e-7)
    assert not _is_fallback_row(vector, layer)
    assert layer.stats() == {"rows": 1, "capacity": 8, "fallback_reads": 4, "refused_full": 0, "evicted": 0,
                             "step": 3}
    inference = layer(np.array([42, 8]), training=False).numpy()
    np.testing.assert_allclose(inference[0], layer.embeddings.numpy()[0], atol=1e-7)
    assert _is_fallback_row(inference[1], layer) and layer.stats()["step"] == 3  # inference changes nothing
    assert layer.sketch.shape == (4, 1024) and layer.sketch.numpy().sum() == 4 * 5  # 42 3 times, 8 and 9 once
    assert layer.evict() == 0 and layer.sketch.numpy().sum() == 4 * 1  # aged: 3 halves to 1, 1 to 0


def test_a_full_table_refuses_ids_to_the_fallback_rows_which_train():
    layer = DynamicEmbedding(DIM, 4, fallback_bins=32, embeddings_initializer=_initializer())
    ids = np.array([[10, 11], [12, 13], [14, 15], [16, 17], [18, 19]], np.int64)
    with tf.GradientTape() as tape:
        vectors = layer(ids, training=True)
        loss = tf.reduce_sum(vectors)
    table_gradient, fallback_gradient = tape.gradient(loss, [layer.embeddings.value, layer.fallback.value])
    assert layer.stats() == {"rows": 4, "capacity": 4, "fallback_reads": 6, "refused_full": 6, "evicted": 0,
                             "step": 1}
    np.testing.assert_array_equal(layer.keys(), [10, 11, 12, 13])
    flat = vectors.numpy().reshape(-1, DIM)
    assert all(_is_fallback_row(vector, layer) for vector in flat[4:])
    # only the rows read carry a gradient, each table its own
    assert isinstance(table_gradient, tf.IndexedSlices) and isinstance(fallback_gradient, tf.IndexedSlices)
    np.testing.assert_array_equal(table_gradient.indices.numpy(), [0, 1, 2, 3])
    np.testing.assert_array_equal(fallback_gradient.indices.numpy(),
                                  bucket(tf.constant(ids.reshape(-1)[4:]), FALLBACK_SALT, 32).numpy())
    layer(np.array([20, 21, 10]), training=True)
    assert layer.stats()["rows"] == 4 and layer.stats()["refused_full"] == 8
    before = layer.fallback.numpy()
    _fit(_model(layer, width=0, dense=False), keras.optimizers.SGD(0.5), np.arange(30, 38), np.ones((8, DIM)))
    assert np.abs(layer.fallback.numpy() - before).max() > 1e-3  # the fallback table trains
    assert layer.stats()["rows"] == 4


def test_consecutive_ids_spread_over_the_fallback_bins():
    counts = np.bincount(bucket(tf.range(4096, dtype=tf.int64), FALLBACK_SALT, 64).numpy(), minlength=64)
    assert counts.min() >= 32 and counts.max() <= 100


def _adam_rows(optimizer: keras.optimizers.Optimizer, layer: DynamicEmbedding, row: int) -> np.ndarray:
    return np.stack([slot.numpy()[row] for slot, _ in table_slots(optimizer, layer.embeddings)])


def test_ttl_eviction_frees_idle_rows_to_fresh_values_and_slots():
    layer = DynamicEmbedding(DIM, 8, evict={"ttl_steps": 2}, embeddings_initializer=_initializer())
    model, optimizer = _model(layer, width=0, dense=False), keras.optimizers.Adam(0.05)
    _fit(model, optimizer, np.array([5, 6] * 4), np.ones((8, DIM)), batch_size=2)  # steps 1-4: ids 5 and 6
    model.fit(np.array([6] * 8), np.ones((8, DIM)), batch_size=2, shuffle=False, verbose=0)  # steps 5-8: id 6
    initial = _initializer()((8, DIM)).numpy()
    assert np.abs(layer.embeddings.numpy()[0] - initial[0]).max() > 1e-2
    assert np.abs(_adam_rows(optimizer, layer, 0)).min() > 0
    kept, kept_slots = layer.embeddings.numpy()[1], _adam_rows(optimizer, layer, 1)

    assert layer.evict(optimizer) == 1  # id 5 last seen at step 4: 8 - 4 > 2
    np.testing.assert_array_equal(layer.keys(), [6])
    np.testing.assert_allclose(layer.embeddings.numpy()[0], initial[0], atol=1e-7)
    np.testing.assert_array_equal(_adam_rows(optimizer, layer, 0), 0)
    np.testing.assert_array_equal(layer.embeddings.numpy()[1], kept)
    np.testing.assert_array_equal(_adam_rows(optimizer, layer, 1), kept_slots)
    assert layer.evict(optimizer) == 0 and layer.stats()["evicted"] == 1
    assert _is_fallback_row(model.predict(np.array([5]), verbose=0)[0], layer)
    # re-admitted, id 5 takes the freed row and starts from the fresh value
    layer.observe(np.array([5]))
    np.testing.assert_array_equal(layer.keys(), [5, 6])
    np.testing.assert_allclose(model.predict(np.array([5]), verbose=0)[0], initial[0], atol=1e-7)


SLOT_RESETS = {  # optimizer, its slots of a table and their initial value
    "adagrad": (lambda: keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.3), 1, 0.3),
    "lazy_adam": (lambda: LazyAdam(0.1), 2, 0.0),
    "row_wise_adagrad": (lambda: RowWiseAdagrad(0.1), 1, 0.0),
    "sgd_momentum": (lambda: keras.optimizers.SGD(0.1, momentum=0.9), 1, 0.0),
}


@pytest.mark.parametrize("name", sorted(SLOT_RESETS))
def test_a_freed_row_gets_its_slots_initial_values_back(name):
    make, slots, initial = SLOT_RESETS[name]
    layer, optimizer = DynamicEmbedding(DIM, 4, evict={"ttl_steps": 1}), make()
    for ids in ([1, 2], [2], [2]):  # id 1 (row 0) idle for 2 steps
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(layer(np.array(ids), training=True) - 1))
        optimizer.apply(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables)
    found = table_slots(optimizer, layer.embeddings)
    assert len(found) == slots
    trained = [slot.numpy().copy() for slot, _ in found]
    assert all(np.abs(values[0] - initial).min() > 1e-4 for values in trained)
    assert layer.evict(optimizer) == 1
    for (slot, value), before in zip(found, trained):
        assert value == pytest.approx(initial)
        np.testing.assert_allclose(slot.numpy()[0], initial, atol=1e-7)
        np.testing.assert_array_equal(slot.numpy()[1:], before[1:])


def test_lfu_eviction_by_the_callback_makes_room_for_refused_ids():
    layer = DynamicEmbedding(DIM, 2, evict={"lfu": 0.5}, embeddings_initializer=_initializer())
    model, optimizer = _model(layer, width=0, dense=False), keras.optimizers.Adam(0.05)
    # id 1 seen 5 times, id 2 twice, id 3 once (refused: the table is full): LFU frees one row, id 2's
    history = _fit(model, optimizer, np.array([1, 2, 1, 2, 1, 3, 1, 1]), np.ones((8, DIM)), batch_size=1,
                   callbacks=[DynamicEmbeddingEviction()])
    assert history.history["evicted_rows"] == [1]
    np.testing.assert_array_equal(layer.keys(), [1])
    np.testing.assert_allclose(layer.score.numpy(), [2.5, 0], atol=1e-6)
    np.testing.assert_allclose(layer.embeddings.numpy()[1], _initializer()((2, DIM))[1], atol=1e-7)
    np.testing.assert_array_equal(_adam_rows(optimizer, layer, 1), 0)
    assert np.abs(_adam_rows(optimizer, layer, 0)).min() > 0
    assert layer.stats() == {"rows": 1, "capacity": 2, "fallback_reads": 1, "refused_full": 1, "evicted": 1,
                             "step": 8}
    model.fit(np.array([3]), np.ones((1, DIM)), verbose=0, callbacks=[DynamicEmbeddingEviction()])
    np.testing.assert_array_equal(layer.keys(), [1, 3])  # no refusal since the last eviction: nothing freed
    assert layer.stats()["evicted"] == 1


def _stock_ops_only(path: str) -> None:
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as file:
        saved.ParseFromString(file.read())
    graph = saved.meta_graphs[0].graph_def
    functions = {function.signature.name for function in graph.library.function}
    ops = {node.op for function in graph.library.function for node in function.node_def} | {
        node.op for node in graph.node}
    assert "LowerBound" in ops and "DynamicStitch" in ops  # tf.searchsorted is LowerBound
    assert all(hasattr(tf.raw_ops, op) for op in ops - functions), sorted(ops - functions)


def test_save_load_and_export_keep_predictions_and_keys(tmp_path):
    layer = DynamicEmbedding(DIM, 16, admit_after=2, evict={"ttl_steps": 5}, fallback_bins=8,
                             embeddings_initializer=_initializer(), name="items")
    model = _model(layer)
    x = np.array([[3, 4], [3, 5], [4, 6]] + [[3, 4]] * 13, np.int64)  # 5 and 6 seen once: never admitted
    _fit(model, keras.optimizers.Adam(0.01), x, np.ones((16, 1)), batch_size=4)
    queries = np.array([[3, 4], [5, 6], [99, -7]], np.int64)
    expected = model.predict(queries, verbose=0)
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    restored = loaded.get_layer("items")
    assert isinstance(restored, DynamicEmbedding) and restored.get_config() == layer.get_config()
    np.testing.assert_array_equal(restored.keys(), [3, 4])
    np.testing.assert_allclose(loaded.predict(queries, verbose=0), expected, atol=1e-6)
    assert restored.stats() == layer.stats()
    vectors = _model(restored, dense=False).predict(queries, verbose=0)
    assert all(_is_fallback_row(vector, restored) for vector in vectors[1:].reshape(-1, DIM))
    model.export(str(tmp_path / "export"), verbose=False)
    _stock_ops_only(str(tmp_path / "export"))
    served = tf.saved_model.load(str(tmp_path / "export"))  # kept: its variables live as long as it does
    np.testing.assert_allclose(served.serve(tf.constant(queries)).numpy(), expected, atol=1e-6)


def test_string_ids_train_and_predict():
    layer = DynamicEmbedding(DIM, 8, embeddings_initializer=_initializer())
    model = _model(layer, width=0, dtype="string", dense=False)
    words = np.array(["apple", "pear", "apple", "fig"], dtype=object)
    _fit(model, keras.optimizers.SGD(0.5), words, np.ones((4, DIM)), batch_size=2)
    fingerprints = tf.strings.to_hash_bucket_fast(["apple", "pear", "fig"], 2 ** 63 - 1).numpy()
    np.testing.assert_array_equal(layer.keys(), np.sort(fingerprints))
    vectors = model.predict(np.array(["pear", "kiwi"], dtype=object), verbose=0)
    np.testing.assert_allclose(vectors[0], layer.embeddings.numpy()[1], atol=1e-7)
    assert np.abs(vectors[0] - _initializer()((8, DIM))[1]).max() > 1e-2  # pear's row trained
    assert _is_fallback_row(vectors[1], layer)


def test_a_mixed_precision_layer_trains_float32_tables_and_returns_float16():
    layer = DynamicEmbedding(DIM, 8, embeddings_initializer=_initializer(), dtype="mixed_float16")
    model = _model(layer, width=0, dense=False)
    _fit(model, keras.optimizers.SGD(0.5), np.array([1, 2, 1, 3]), np.ones((4, DIM)), batch_size=2)
    assert layer.embeddings.dtype == "float32" and model.outputs[0].dtype == "float16"
    np.testing.assert_array_equal(layer.keys(), [1, 2, 3])
    np.testing.assert_allclose(layer.score.numpy()[:3], [2, 1, 1], atol=1e-6)
    assert np.abs(layer.embeddings.numpy()[0] - _initializer()((8, DIM))[0]).max() > 1e-2


def test_copies_given_the_same_observations_have_identical_state():
    copies = [DynamicEmbedding(DIM, 6, admit_after=2, evict={"lfu": 0.5}, embeddings_initializer=_initializer())
              for _ in range(2)]
    rng = np.random.default_rng(1)
    batches = [rng.integers(0, 12, size=(5, 3)) for _ in range(12)]
    for layer in copies:
        observe = tf.function(layer.observe)
        for number, batch in enumerate(batches):
            (observe if number % 2 else layer.observe)(tf.constant(batch))
            if number % 4 == 2:
                layer.evict()
    first, second = ([variable.numpy() for variable in layer.weights] for layer in copies)
    assert copies[0].stats()["rows"] > 0 and copies[0].stats()["refused_full"] > 0
    assert copies[0].stats()["evicted"] > 0
    assert len(first) == len(second) == 15
    for mine, theirs in zip(first, second):
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("kwargs, argument", [
    ({"capacity": 0}, "capacity"),
    ({"output_dim": "8"}, "output_dim"),
    ({"admit_after": 0}, "admit_after"),
    ({"fallback_bins": True}, "fallback_bins"),
    ({"evict": {"ttl": 3}}, "evict"),
    ({"evict": {"ttl_steps": 0}}, "evict['ttl_steps']"),
    ({"evict": {"lfu": 1.5}}, "evict['lfu']"),
    ({"embeddings_initializer": "no_such_initializer"}, "embeddings_initializer"),
])
def test_bad_arguments_raise_configuration_errors_naming_them(kwargs, argument):
    arguments = {"output_dim": DIM, "capacity": 8, **kwargs}
    with pytest.raises(ConfigurationError) as raised:
        DynamicEmbedding(**arguments)
    message = str(raised.value)
    assert message.startswith(f"DynamicEmbedding: {argument} must be") and "got" in message and "pass" in message


def test_float_ids_raise_a_configuration_error():
    with pytest.raises(ConfigurationError, match="dtype='int64'"):
        DynamicEmbedding(DIM, 8)(np.array([1.5, 2.0], np.float32))


def test_the_package_exposes_the_layers_lazily():
    import sparktf

    assert sparktf.layers.DynamicEmbedding is DynamicEmbedding
    assert keras.saving.get_registered_name(DynamicEmbedding) == "sparktf>DynamicEmbedding"
