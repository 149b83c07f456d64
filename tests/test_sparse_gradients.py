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

OPTIMIZERS = ("sgd", "momentum", "adagrad", "adam")
USERS, ITEMS, GLOBAL_BATCH, STEPS = 1000, 4, 32, 3
CLIP_NORM = 0.05


def _optimizer(name):
    import keras

    return {"sgd": lambda: keras.optimizers.SGD(0.5),
            "momentum": lambda: keras.optimizers.SGD(0.5, momentum=0.9),
            "adagrad": lambda: keras.optimizers.Adagrad(0.5),
            "adam": lambda: keras.optimizers.Adam(0.05)}[name]()


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
            for variant in (None, *(VARIANTS.get(name, ()) if repeats else ()))]


def train_ranks(rank, peers, listener, secret):
    """Every case on this rank's half of each global batch: its weights, their digest and the traffic."""
    from sparktf.collective import Communicator
    from sparktf.training.gradient_exchange import GradientExchange
    from sparktf.training.step import GradientClipping, TrainStep

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
    """Weights after ``fit`` on the global batches (no repeats), or after applying the dense gradient."""
    import tensorflow as tf

    model = _model(name, ITEMS if repeats else 4 * GLOBAL_BATCH)
    for features, labels in _batches(repeats):
        if not repeats:
            model.fit(features, labels, batch_size=GLOBAL_BATCH, shuffle=False, verbose=0)
            continue
        with tf.GradientTape() as tape:
            loss = model.compute_loss(features, labels, model(features, training=True))
        gradients = [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)]
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


def test_optimizers_that_move_untouched_rows_are_told_apart():
    import keras

    from sparktf.training.update_form import updates_every_row

    assert not updates_every_row(keras.optimizers.SGD(0.1))
    assert not updates_every_row(keras.optimizers.Adagrad(0.1))
    assert updates_every_row(keras.optimizers.SGD(0.1, momentum=0.9))
    assert updates_every_row(keras.optimizers.Adam(0.1))
