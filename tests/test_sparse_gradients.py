"""Embedding gradients travel as rows between real processes: the weights equal one process's.

Two ranks run sparktf's ``TrainStep`` with the ``GradientExchange`` over a
real ring, each on its half of every global batch, for SGD, SGD with
momentum, Adagrad and Adam. Without repeated ids they must end where Keras'
``fit`` on the global batches ends; with ids repeated within and across the
ranks (and a table small enough to go dense), where one process's update
with the gradient's true (dense, summed) value ends.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from ring_harness import run_ranks

OPTIMIZERS = ("sgd", "momentum", "adagrad", "adam", "lazy_adam", "row_wise_adagrad")
#: sparktf's optimizers for tables: their own row updates, which a dense gradient would not give
ROW_OPTIMIZERS = ("lazy_adam", "row_wise_adagrad")


def _lazy_momentum():
    import keras

    class LazyMomentum(keras.optimizers.SGD):
        """Momentum kept and applied on the rows a gradient touches only (as TF 1's lazy optimizers did)."""

        def update_step(self, gradient, variable, learning_rate):
            import tensorflow as tf

            if not isinstance(gradient, tf.IndexedSlices):
                return super().update_step(gradient, variable, learning_rate)
            m = self.momentums[self._get_variable_index(variable)]
            rows = tf.gather(m, gradient.indices) * 0.9 - gradient.values * learning_rate
            m.scatter_update(tf.IndexedSlices(rows, gradient.indices))
            variable.scatter_add(tf.IndexedSlices(rows, gradient.indices))

    return LazyMomentum
USERS, ITEMS, GLOBAL_BATCH, STEPS = 1000, 4, 32, 3
CLIP_NORM = 0.05


def _optimizer(name):
    import keras

    from sparktf.optimizers import LazyAdam, RowWiseAdagrad

    return {"sgd": lambda: keras.optimizers.SGD(0.5),
            "momentum": lambda: keras.optimizers.SGD(0.5, momentum=0.9),
            "adagrad": lambda: keras.optimizers.Adagrad(0.5),
            "adam": lambda: keras.optimizers.Adam(0.05),
            "lazy_adam": lambda: LazyAdam(0.05),
            "row_wise_adagrad": lambda: RowWiseAdagrad(0.5)}[name]()


def _model(optimizer, items, policy="float32"):
    import keras

    keras.utils.set_random_seed(7)
    keras.mixed_precision.set_global_policy(policy)
    user, item = keras.Input((1,), dtype="int32"), keras.Input((1,), dtype="int32")
    product = keras.layers.Multiply()([keras.layers.Flatten()(keras.layers.Embedding(USERS, 4)(user)),
                                       keras.layers.Flatten()(keras.layers.Embedding(items, 4)(item))])
    model = keras.Model([user, item], keras.layers.Dense(1, activation="sigmoid")(product))
    model.compile(_optimizer(optimizer), "binary_crossentropy", metrics=["accuracy"])
    keras.mixed_precision.set_global_policy("float32")
    return model


def _batches(repeats):
    """``STEPS`` global batches ``([users, items], labels)``; ids unique within each, or Zipf-repeated."""
    rng = np.random.default_rng(3)
    batches = []
    for _ in range(STEPS):
        if repeats:
            users = np.minimum(rng.zipf(1.5, GLOBAL_BATCH), USERS) - 1
            items = rng.integers(0, ITEMS, GLOBAL_BATCH)
        else:
            users, items = rng.permutation(USERS)[:GLOBAL_BATCH], rng.permutation(4 * GLOBAL_BATCH)[:GLOBAL_BATCH]
        labels = rng.integers(0, 2, (GLOBAL_BATCH, 1)).astype("float32")
        batches.append(([users.reshape(-1, 1).astype("int32"), items.reshape(-1, 1).astype("int32")], labels))
    return batches


# with repeated ids, also: bf16 on the wire, clipping by the global norm, a mixed_float16 model
VARIANTS = {"adam": ("bf16", "mixed_float16"), "sgd": ("clip",)}


def _cases():
    return [(name, repeats, variant) for repeats in (False, True) for name in OPTIMIZERS
            for variant in (None, *(VARIANTS.get(name, ()) if repeats else ()))
            if repeats or name not in ROW_OPTIMIZERS]  # theirs: with repeats (fit: tests/test_sparse_kernels.py)


def train_ranks(rank, peers, listener, secret):
    """Every case on this rank's half of each global batch: its weights, their digest and the traffic."""
    from sparktf.collective import Communicator
    from sparktf.training.worker.gradient_exchange import GradientExchange
    from sparktf.training.clipping import GradientClipping
    from sparktf.training.worker.step import TrainStep

    results = {}
    half = slice(rank * GLOBAL_BATCH // 2, (rank + 1) * GLOBAL_BATCH // 2)
    with Communicator.from_peers(rank, peers, secret, timeout=30, listener=listener) as comm:
        for name, repeats, variant in _cases():
            policy = "mixed_float16" if variant == "mixed_float16" else "float32"
            model = _model(name, ITEMS if repeats else 4 * GLOBAL_BATCH, policy)
            clipping = GradientClipping(clip_norm=CLIP_NORM) if variant == "clip" else None
            step = TrainStep(model, clipping)
            exchange = GradientExchange(comm, "bf16" if variant == "bf16" else None)
            for features, labels in _batches(repeats):
                step.run([f[half] for f in features], labels[half], exchange, weight=0.5)
            weights = model.get_weights()
            digest = hashlib.sha256(b"".join(w.tobytes() for w in weights)).hexdigest()
            results[(name, repeats, variant)] = (weights, digest, vars(exchange.traffic))
    return results


def _one_process(name, repeats, clip_norm=None):
    """Weights after ``fit`` on the global batches (no repeats), or after applying the dense gradient (the rows,
    repeats included, for sparktf's row optimizers)."""
    import tensorflow as tf

    model = _model(name, ITEMS if repeats else 4 * GLOBAL_BATCH)
    for features, labels in _batches(repeats):
        if not repeats:
            model.fit(features, labels, batch_size=GLOBAL_BATCH, shuffle=False, verbose=0)
            continue
        with tf.GradientTape() as tape:
            loss = model.compute_loss(features, labels, model(features, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        if name not in ROW_OPTIMIZERS:
            gradients = [tf.convert_to_tensor(g) for g in gradients]
        if clip_norm is not None:
            gradients, _ = tf.clip_by_global_norm(gradients, clip_norm)
        model.optimizer.apply(gradients, model.trainable_variables)
    return model.get_weights()


@pytest.fixture(scope="module")
def ranks_results():
    return run_ranks(2, train_ranks)


@pytest.mark.parametrize("name,repeats,variant", _cases())
def test_two_ranks_end_with_one_process_weights(ranks_results, name, repeats, variant):
    first, second = (result[(name, repeats, variant)] for result in ranks_results)
    assert first[1] == second[1], "the ranks ended with different weights"
    expected = _one_process(name, repeats, CLIP_NORM if variant == "clip" else None)
    atol = 2e-2 if variant in ("bf16", "mixed_float16") else 1e-5
    for got, want in zip(first[0], expected):
        np.testing.assert_allclose(got, want, atol=atol, rtol=0)
    traffic = first[2]
    assert traffic["steps"] == STEPS
    assert traffic["sparse_tables"] == STEPS * (1 if repeats else 2)  # the user table travels as rows
    assert traffic["dense_tables"] == (STEPS if repeats else 0)  # 4 items touched by both ranks: dense
    assert traffic["sent"] < traffic["dense"]


def test_each_optimizer_gets_its_rows_in_the_form_that_updates_alike():
    import keras

    from sparktf.optimizers import LazyAdam, RowWiseAdagrad
    from sparktf.training.tables.update_form import MAX_PADDED_TABLES, TableUpdates

    probe = TableUpdates.probe
    assert probe(keras.optimizers.SGD(0.1)) == TableUpdates("padded", row_state=False)
    assert probe(keras.optimizers.Adagrad(0.1)) == TableUpdates("kernel", row_state=True)  # the touched rows' update
    assert probe(LazyAdam(0.1)).form() == "kernel"
    assert probe(RowWiseAdagrad(0.1)) == TableUpdates("kernel", row_state=True)  # one value per row
    assert probe(keras.optimizers.SGD(0.1)).form(tables=MAX_PADDED_TABLES + 1) == "rows"  # compiles would multiply
    assert probe(keras.optimizers.Adagrad(0.1, clipnorm=1.0)).form() == "rows"  # clipping: Keras' own
    assert probe(keras.optimizers.SGD(0.1, momentum=0.9)) == TableUpdates("dense", row_state=True)
    assert probe(keras.optimizers.Adam(0.1)) == TableUpdates("dense", row_state=True)
    assert probe(_lazy_momentum()(0.1, momentum=0.9)).form() == "rows"  # a zero row would decay its momentum


def test_padded_rows_keep_the_rows_and_add_zero_rows_of_untouched_indices():
    import tensorflow as tf

    from sparktf.training.tables.compiled_update import MIN_PADDED_ROWS, host_padded_rows

    rows = tf.IndexedSlices(tf.ones([70, 2]), tf.range(0, 140, 2, dtype=tf.int64), tf.constant([1000, 2], tf.int64))
    values, indices = host_padded_rows(rows, 1000)
    assert len(indices) == 128 and len(set(indices.tolist())) == 128 and indices[:70].tolist() == list(range(0, 140, 2))
    assert values[:70].min() == 1 and not values[70:].any() and values.shape == (128, 2)
    small = tf.IndexedSlices(tf.ones([3, 2]), tf.constant([4, 1, 0], tf.int64), tf.constant([5, 2], tf.int64))
    assert sorted(host_padded_rows(small, 5)[1].tolist()) == [0, 1, 2, 3, 4]  # at most the table
    exact = tf.IndexedSlices(tf.ones([64, 2]), tf.range(64, dtype=tf.int64), tf.constant([1000, 2], tf.int64))
    assert host_padded_rows(exact, 1000)[1].tolist() == list(range(64))  # a power of two already: as it is
    assert MIN_PADDED_ROWS == 64
