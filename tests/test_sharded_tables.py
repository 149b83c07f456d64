"""Sharded tables between real processes: each rank holds a share of the tables' rows and optimizer slots, looks up
the rows its batch needs from their owners, and sends their gradients there; training ends where replicated
training ends, weights and optimizer slots alike."""

from __future__ import annotations

import numpy as np
import pytest

from ring_harness import run_ranks

OPTIMIZERS = ("sgd", "adagrad", "adam", "lazy_adam")  # padded, row kernel, dense and own row update forms
USERS, ITEMS, GLOBAL_BATCH, STEPS = 301, 7, 32, 5


def _model(name):
    import keras

    from sparktf.optimizers import LazyAdam, RowWiseAdagrad

    optimizer = {"sgd": lambda: keras.optimizers.SGD(0.5), "momentum": lambda: keras.optimizers.SGD(0.5, momentum=0.9),
                 "adagrad": lambda: keras.optimizers.Adagrad(0.5), "adam": lambda: keras.optimizers.Adam(0.05),
                 "lazy_adam": lambda: LazyAdam(0.05), "row_wise_adagrad": lambda: RowWiseAdagrad(0.5)}[name]()
    keras.utils.set_random_seed(7)
    user, item = keras.Input((1,), dtype="int32", name="user"), keras.Input((2,), dtype="int32", name="item")
    product = keras.layers.Multiply()([
        keras.layers.Flatten()(keras.layers.Embedding(USERS, 4, name="users")(user)),
        keras.layers.Dense(4)(keras.layers.Flatten()(keras.layers.Embedding(ITEMS, 4, name="items")(item)))])
    model = keras.Model([user, item], keras.layers.Dense(1, activation="sigmoid")(product))
    model.compile(optimizer, "binary_crossentropy")
    return model


def _batches():
    """``STEPS`` global batches; user ids Zipf-repeated (within and across the ranks), items from a few."""
    rng = np.random.default_rng(3)
    return [([(np.minimum(rng.zipf(1.3, (GLOBAL_BATCH, 1)), USERS) - 1).astype("int32"),
              rng.integers(0, ITEMS, (GLOBAL_BATCH, 2)).astype("int32")],
             rng.integers(0, 2, (GLOBAL_BATCH, 1)).astype("float32")) for _ in range(STEPS)]


def train_ranks(rank, peers, listener, secret):
    """Per optimizer: the weights and optimizer variables after replicated, then sharded, training."""
    from sparktf.collective import Communicator
    from sparktf.training.checkpoint import ModelState
    from sparktf.training.gradient_exchange import GradientExchange
    from sparktf.training.sharding.plan import ShardPlan
    from sparktf.training.sharding.tables import RankShards, apply_start_state, working_model
    from sparktf.training.step import TrainStep

    half = slice(rank * GLOBAL_BATCH // 2, (rank + 1) * GLOBAL_BATCH // 2)
    results = {}
    with Communicator.from_peers(rank, peers, secret, timeout=30, listener=listener) as comm:
        for name in OPTIMIZERS:
            model = _model(name)
            TrainStep(model)  # builds the optimizer
            start = ModelState.capture(model)
            plan = ShardPlan.of(model, 2, None, {"users": True, "items": True})
            working = working_model(model, plan, GLOBAL_BATCH // 2)
            shards = RankShards(plan, working, rank, comm)
            shards.start(apply_start_state(start, working, plan), 0)
            for trained, shards in ((model, None), (working, shards)):
                step = TrainStep(trained)
                step.sharded = frozenset() if shards is None else shards.positions
                exchange = GradientExchange(comm, None, shards)
                for features, labels in _batches():
                    features = [f[half] for f in features]
                    if shards is not None:
                        features = shards.fetch_rows(features)
                    assert step.run(features, labels[half], exchange, weight=0.5).applied
                    if shards is not None:
                        shards.apply()
                state = ModelState.capture(model) if shards is None else shards.captured_state(STEPS)
                results[(name, shards is not None)] = (state.weights, state.optimizer_variables)
            assert working.get_layer("users").embeddings.shape[0] == GLOBAL_BATCH // 2  # no rank holds the table
    return results


@pytest.fixture(scope="module")
def ranks_results():
    return run_ranks(2, train_ranks)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_sharded_training_ends_where_replicated_training_ends(ranks_results, name):
    for rank, results in enumerate(ranks_results):
        (weights, slots), (sharded_weights, sharded_slots) = results[(name, False)], results[(name, True)]
        for got, want in zip(sharded_weights + sharded_slots, weights + slots):
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=f"rank {rank}")


def test_optimize_with_sharded_tables_ends_where_replicated_training_ends_and_refuses_what_it_cannot_train(sc):
    from sparktf import TFDataset, TFOptimizer
    from sparktf.errors import ConfigurationError
    from sparktf.triggers import MaxIteration

    (users, items), labels = [np.concatenate(parts) for parts in zip(*[f for f, _ in _batches()])], \
        np.concatenate([labels for _, labels in _batches()])
    dataset = TFDataset.from_ndarrays(((users, items), labels), batch_size=GLOBAL_BATCH)
    trained = {}
    for shard_tables in (None, "users,items"):
        sc.setLocalProperty("spark.sparktf.shardTables", shard_tables)
        try:
            model = _model("adam")
            optimizer = TFOptimizer.from_keras(model, dataset, num_workers=2)
            optimizer.optimize(MaxIteration(STEPS), verbose=0)
            assert optimizer.last_traffic.sharded_tables == (2 * STEPS if shard_tables else 0)
            trained[shard_tables] = model.get_weights() + [np.array(v.numpy()) for v in model.optimizer.variables]
        finally:
            sc.setLocalProperty("spark.sparktf.shardTables", None)
    for got, want in zip(trained["users,items"], trained[None]):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    sc.setLocalProperty("spark.sparktf.shardTables", "users")
    try:
        optimizer = TFOptimizer.from_keras(_model("adam"), dataset, num_workers=2)
        optimizer.set_gradient_clipping_by_l2_norm(1.0)
        with pytest.raises(ConfigurationError, match=r"sharded tables \['users'\] cannot be trained with clipping"):
            optimizer.optimize(MaxIteration(1), verbose=0)
    finally:
        sc.setLocalProperty("spark.sparktf.shardTables", None)
