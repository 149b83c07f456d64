"""Sharded tables between real processes: each rank holds a share of the tables' rows and optimizer slots, looks up
the rows its batch needs from their owners, and sends their gradients there; training ends where replicated
training ends, weights and optimizer slots alike."""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest

from ring_harness import run_ranks

OPTIMIZERS = ("sgd", "adagrad", "adam", "lazy_adam")  # padded, row kernel, dense and own row update forms
USERS, ITEMS, TAGS, GLOBAL_BATCH, STEPS = 301, 50, 13, 32, 5
#: Every table: "items" and "item_bias" share their ids (Wide & Deep), "tag_a" and "tag_c" are columns of one input.
SHARDED = ("users", "items", "item_bias", "tag_a", "tag_c")


def _model(name, users_initializer="uniform"):
    import keras

    from sparktf.optimizers import LazyAdam, RowWiseAdagrad

    optimizer = {"sgd": lambda: keras.optimizers.SGD(0.5), "momentum": lambda: keras.optimizers.SGD(0.5, momentum=0.9),
                 "adagrad": lambda: keras.optimizers.Adagrad(0.5), "adam": lambda: keras.optimizers.Adam(0.05),
                 "lazy_adam": lambda: LazyAdam(0.05), "row_wise_adagrad": lambda: RowWiseAdagrad(0.5)}[name]()
    keras.utils.set_random_seed(7)
    user, item = keras.Input((1,), dtype="int32", name="user"), keras.Input((2,), dtype="int32", name="item")
    tags = keras.Input((3,), dtype="int32", name="tags")
    product = keras.layers.Multiply()([
        keras.layers.Flatten()(keras.layers.Embedding(USERS, 4, users_initializer, name="users")(user)),
        keras.layers.Dense(4)(keras.layers.Flatten()(keras.layers.Embedding(ITEMS, 4, name="items")(item)))])
    joined = keras.layers.Concatenate()([
        product, keras.layers.Flatten()(keras.layers.Embedding(ITEMS, 1, name="item_bias")(item)),
        keras.layers.Embedding(TAGS, 3, name="tag_a")(tags[:, 0]), keras.layers.Embedding(TAGS, 3, name="tag_c")(tags[:, 2])])
    model = keras.Model([user, item, tags], keras.layers.Dense(1, activation="sigmoid")(joined))
    model.compile(optimizer, "binary_crossentropy")
    return model


def _batches():
    """``STEPS`` global batches; user ids Zipf-repeated (within and across the ranks), items and tags from a few."""
    rng = np.random.default_rng(3)
    return [([(np.minimum(rng.zipf(1.3, (GLOBAL_BATCH, 1)), USERS) - 1).astype("int32"),
              rng.choice(np.arange(1, ITEMS, 7), (GLOBAL_BATCH, 2)).astype("int32"),  # ids unlike their positions
              rng.integers(0, TAGS, (GLOBAL_BATCH, 3)).astype("int32")],
             rng.integers(0, 2, (GLOBAL_BATCH, 1)).astype("float32")) for _ in range(STEPS)]


def train_ranks(rank, peers, listener, secret):
    """Per optimizer: the state after replicated training (without the tables' slots, and those by layer and kind),
    and what each rank of sharded training uploads and the folder it writes its rows of the slots to."""
    import os
    import tempfile

    from sparktf.collective import Communicator
    from sparktf.models.payload import ModelPayload
    from sparktf.training.checkpoint import ModelState
    from sparktf.training.worker.gradient_exchange import GradientExchange
    from sparktf.training.tables.plan import ShardPlan
    from sparktf.training.tables.sharded_tables import (RankShards, apply_start_state, optimizer_state_positions,
                                                        state_rows, without_optimizer_state, working_model)
    from sparktf.training.state_source import rank_upload
    from sparktf.training.worker.step import TrainStep

    half = slice(rank * GLOBAL_BATCH // 2, (rank + 1) * GLOBAL_BATCH // 2)
    results = {}
    with Communicator.from_peers(rank, peers, secret, timeout=30, listener=listener) as comm:
        for name in OPTIMIZERS:
            model = _model(name)
            TrainStep(model)  # builds the optimizer
            slots = optimizer_state_positions(model, SHARDED)
            start = without_optimizer_state(ModelState.capture(model), slots)  # the driver's: without the slots
            plan = ShardPlan.of(model, 2, None, dict.fromkeys(SHARDED, True))
            working = working_model(ModelPayload.from_model(model, include_weights=False), plan, GLOBAL_BATCH // 2)
            shards = RankShards(plan, working, rank, comm)
            rows = state_rows(working, plan, rank)  # the rank's rows of the tables, all it is given
            shards.start(apply_start_state(start.rows(rows), working, plan), None)  # fresh slots
            for trained, shards in ((model, None), (working, shards)):
                step = TrainStep(trained, sharded=frozenset() if shards is None else shards.positions)
                exchange = GradientExchange(comm, None, shards)
                for features, labels in _batches():
                    features = [f[half] for f in features]
                    if shards is not None:
                        features = shards.lookup(features)
                    assert step.run(features, labels[half], exchange, weight=0.5).applied
                    if shards is not None:
                        shards.apply()
                # sharded: what the rank uploads, its rows of the tables (the test joins them as the driver), and
                # where it wrote its rows of their slots (a folder both ranks name)
                if shards is None:
                    state = ModelState.capture(model)
                    results[(name, False)] = (without_optimizer_state(state, slots),
                                              {where: state.array(index) for index, where in slots.items()})
                else:
                    root = os.path.join(tempfile.gettempdir(), f"sparktf-ring-slots-{secret[:4].hex()}", name)
                    results[(name, True)] = (rank_upload(rank, *shards.captured_state(STEPS)),
                                             shards.save_optimizer_state(root, STEPS, secret))
            assert working.get_layer("users").embeddings.shape[0] == GLOBAL_BATCH // 2  # no rank holds the table
    return results


@pytest.fixture(scope="module")
def ranks_results():
    import shutil

    results = run_ranks(2, train_ranks)
    yield results
    shutil.rmtree(os.path.dirname(os.path.dirname(results[0][(OPTIMIZERS[0], True)][1])), ignore_errors=True)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_sharded_training_ends_where_replicated_training_ends(ranks_results, name):
    from sparktf.training.tables.optimizer_state_store import read_optimizer_state_rows
    from sparktf.training.state_source import joined_uploads

    uploads = {rank: results[(name, True)][0] for rank, results in enumerate(ranks_results)}
    assert [len(arrays) for _, arrays in uploads.values()][1] < len(uploads[0][1])  # rank 1 sends its rows only
    sharded = joined_uploads(uploads, "the test")
    folder = ranks_results[0][(name, True)][1]
    assert ranks_results[1][(name, True)][1] == folder
    for rank, results in enumerate(ranks_results):
        replicated, slots = results[(name, False)]
        assert len(sharded.optimizer_variables) == len(replicated.optimizer_variables)
        for got, want in zip(sharded.weights + sharded.optimizer_variables,
                             replicated.weights + replicated.optimizer_variables):
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=f"rank {rank}")
        assert bool(slots) == (name != "sgd")
        for (layer, kind), want in slots.items():  # both ranks' files, read whole (2 -> 1)
            got = read_optimizer_state_rows(folder, layer, 0, len(want), [kind])[kind]
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=f"{layer} {kind}")


class _NotWholeInTasks(keras.initializers.Initializer):
    """An initializer that fails when a Spark task builds a table of ``rows`` rows (sharded: no worker should)."""

    def __init__(self, rows):
        self.rows = rows

    def __call__(self, shape, dtype=None):
        from pyspark import TaskContext

        assert not (TaskContext.get() is not None and shape[0] == self.rows), "a Spark task built the whole table"
        return keras.random.uniform(shape, -0.05, 0.05, dtype=dtype, seed=1)

    def get_config(self):
        return {"rows": self.rows}


def test_optimize_with_sharded_tables_ends_where_replicated_training_ends_and_resumes_on_one_worker(sc, tmp_path):
    """The driver never holds the sharded tables' slots (the ranks keep them in model_dir): its optimizer has none,
    its checkpoints neither; a checkpoint of 2 sharded workers loads and resumes on 1 unsharded one."""
    from sparktf import SeveralIteration, TFDataset, TFOptimizer
    from sparktf.triggers import MaxIteration

    features, labels = [np.concatenate(parts) for parts in zip(*[f for f, _ in _batches()])], \
        np.concatenate([labels for _, labels in _batches()])
    dataset = TFDataset.from_ndarrays((tuple(features), labels), batch_size=GLOBAL_BATCH)
    trained = {}
    # replicated; sharded (the job channel joins the ranks' rows); sharded without a job channel (the ranks gather)
    every = ",".join(SHARDED)
    for run, shard_tables, rendezvous in (("None", None, None), ("sharded", every, None), ("barrier", every, "barrier")):
        sc.setLocalProperty("spark.sparktf.shardTables", shard_tables)
        sc.setLocalProperty("spark.sparktf.rendezvous", rendezvous)
        try:
            model = _model("adam", _NotWholeInTasks(USERS) if shard_tables else "uniform")
            model.set_weights(_model("adam").get_weights())  # the same start
            optimizer = TFOptimizer.from_keras(model, dataset, num_workers=2, model_dir=str(tmp_path / run))
            optimizer.optimize(MaxIteration(STEPS), checkpoint_trigger=SeveralIteration(3), verbose=0)
            assert optimizer.last_traffic.sharded_tables == (len(SHARDED) * (STEPS - 3) if shard_tables else 0)
            trained[run] = _state(model, () if shard_tables else SHARDED)  # the driver's optimizer: no table slots
        finally:
            sc.setLocalProperty("spark.sparktf.shardTables", None)
            sc.setLocalProperty("spark.sparktf.rendezvous", None)
    folders = sorted(os.listdir(tmp_path / "sharded" / "tables"))  # the checkpoints' and the last segment's only
    assert [name.split("-")[1] for name in folders] == ["3", "5"], folders
    for run in ("sharded", "barrier"):
        assert len(trained[run]) == len(trained["None"])
        for got, want in zip(trained[run], trained["None"]):
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=run)
    loaded, models = {}, {}
    # each checkpoint of 2 workers loaded and resumed on 1: tables replicated (the driver reads the sharded run's
    # slots from the ranks' files), and the sharded one on a lone sharded worker (that worker reads them)
    for run, model_dir, shard_tables in (("sharded", "sharded", None), ("None", "None", None),
                                         ("on one", "sharded", every)):
        sc.setLocalProperty("spark.sparktf.shardTables", shard_tables)
        try:
            models[run] = model = _model("adam")
            optimizer = TFOptimizer.from_keras(model, dataset, num_workers=1, model_dir=str(tmp_path / model_dir))
            optimizer.load_checkpoint(version=3)
            loaded[run] = _state(model)
            assert optimizer.optimize(MaxIteration(STEPS), verbose=0)["iterations"] == STEPS
        finally:
            sc.setLocalProperty("spark.sparktf.shardTables", None)
    for got, want in zip(loaded["sharded"], loaded["None"]):  # the slots the driver read are the replicated ones
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    for run, without in (("sharded", ()), ("on one", SHARDED)):
        replicated = _state(models["None"], without)
        assert len(_state(models[run])) == len(replicated)
        for got, want in zip(_state(models[run]), replicated):
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=run)


def _state(model, without=()):
    """The model's weights and optimizer variables, but its optimizer's slots of the tables ``without``."""
    from sparktf.training.tables.sharded_tables import optimizer_state_positions

    dropped = optimizer_state_positions(model, without)
    variables = model.weights + model.optimizer.variables
    return [np.array(v.numpy()) for k, v in enumerate(variables) if k not in dropped]


def test_sharded_tables_refuse_clipping_by_the_global_norm(sc):
    from sparktf import TFDataset, TFOptimizer
    from sparktf.errors import ConfigurationError
    from sparktf.triggers import MaxIteration

    dataset = TFDataset.from_ndarrays((tuple(np.zeros((4, width), "int32") for width in (1, 2, 3)), np.zeros((4, 1))),
                                      batch_size=4)
    sc.setLocalProperty("spark.sparktf.shardTables", "users")
    try:
        optimizer = TFOptimizer.from_keras(_model("adam"), dataset, num_workers=2)
        optimizer.set_gradient_clipping_by_l2_norm(1.0)
        with pytest.raises(ConfigurationError, match=r"sharded tables \['users'\] cannot be trained with clipping"):
            optimizer.optimize(MaxIteration(1), verbose=0)
    finally:
        sc.setLocalProperty("spark.sparktf.shardTables", None)


def test_sharded_tables_keyword_chooses_per_optimizer_over_the_session_settings(sc):
    from sparktf import TFDataset, TFOptimizer
    from sparktf.errors import ConfigurationError

    dataset = TFDataset.from_ndarrays((tuple(np.zeros((4, width), "int32") for width in (1, 2, 3)), np.zeros((4, 1))),
                                      batch_size=4)

    def sharded(**keywords):
        optimizer = TFOptimizer.from_keras(_model("adam"), dataset, num_workers=2, **keywords)
        return sorted(table.layer for table in optimizer.training_session.tables.plan.tables)

    sc.setLocalProperty("spark.sparktf.shardTables", "tag_a")
    sc.setLocalProperty("spark.sparktf.shardTableBytes", "1k")
    try:
        assert sharded() == ["tag_a", "users"]  # no keyword: the session's settings (a choice and a threshold)
        assert sharded(sharded_tables=None) == []
        assert sharded(sharded_tables=[SHARDED[-1]]) == [SHARDED[-1]]
        assert sharded(sharded_tables="auto") == ["users"]  # the one table over the session's 1k
        with pytest.raises(ConfigurationError, match=r"\['nope'\] are not Embedding layers of the model"):
            sharded(sharded_tables=["users", "nope"])
        with pytest.raises(ConfigurationError, match="sharded_tables must be 'auto', a list of Embedding layer"):
            sharded(sharded_tables=3)
        from sparktf.ml import KerasEstimator  # the estimator's Param, passed to from_keras as it is

        assert KerasEstimator().getShardedTables() == "session"
        assert KerasEstimator(shardedTables=["users"]).getShardedTables() == ["users"]
    finally:
        sc.setLocalProperty("spark.sparktf.shardTables", None)
        sc.setLocalProperty("spark.sparktf.shardTableBytes", None)


def test_the_driver_joins_the_ranks_rows_and_refuses_what_does_not_join():
    from sparktf.errors import TrainingError
    from sparktf.training.checkpoint import ModelState
    from sparktf.training.state_source import joined_uploads, rank_upload

    table, slot = np.arange(20, dtype=np.float32).reshape(10, 2), np.arange(10, dtype=np.float32)
    state = ModelState([table, np.ones(3, np.float32)], [np.array(7), slot], 4)
    rows = [{0: (0, 5), 3: (0, 5)}, {0: (5, 10), 3: (5, 10)}]
    uploads = {rank: rank_upload(rank, state.rows(rows[rank]), rows[rank]) for rank in (0, 1)}
    assert len(uploads[1][1]) == 2  # rank 1 sends its rows of the table and the slot only
    joined = joined_uploads(uploads, "segment 1")
    for got, want in zip(joined.weights + joined.optimizer_variables, state.weights + state.optimizer_variables):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(TrainingError, match=r"rows of sharded state array 0 do not join up: \[\(0, 5\), \(7, 10\)\]"):
        joined_uploads({0: uploads[0], 2: rank_upload(2, state.rows({0: (7, 10)}), {0: (7, 10)})}, "segment 1")
    meta, arrays = uploads[1]
    with pytest.raises(TrainingError, match="rank 1 sent after segment 1 arrived corrupted"):
        joined_uploads({0: uploads[0], 1: (meta, [arrays[0] + 1, arrays[1]])}, "segment 1")
    with pytest.raises(TrainingError, match="rank 0 sent no model state"):
        joined_uploads({1: uploads[1]}, "segment 1")


def test_a_shards_optimizer_takes_the_learning_rate_and_iterations_the_start_state_gives_the_model():
    """A ``LearningRateScheduler`` on the driver sets the rate between segments: the owners' updates use it."""
    from sparktf.models.payload import ModelPayload
    from sparktf.training.checkpoint import ModelState
    from sparktf.training.tables.plan import ShardPlan
    from sparktf.training.tables.sharded_tables import (RankShards, apply_start_state, optimizer_state_positions,
                                                        state_rows, without_optimizer_state, working_model)

    model = _model("adam")  # a learning rate of 0.05 in the payload
    model.optimizer.build(model.trainable_variables)
    plan = ShardPlan.of(model, 2, None, {"users": True})
    working = working_model(ModelPayload.from_model(model, include_weights=False), plan, 4)
    shards = RankShards(plan, working, 1, communicator=None)
    model.optimizer.learning_rate.assign(0.015625)  # set on the driver after the payload was made
    model.optimizer.iterations.assign(40)
    driver_state = without_optimizer_state(ModelState.capture(model), optimizer_state_positions(model, ["users"]))
    shards.start(apply_start_state(driver_state.rows(state_rows(working, plan, 1)), working, plan), None)
    (shard,) = shards._shards
    assert float(shard.optimizer.learning_rate.numpy()) == 0.015625 and int(shard.optimizer.iterations.numpy()) == 40
    np.testing.assert_array_equal(shard.rows.numpy()[:150], model.get_layer("users").embeddings.numpy()[151:])
    assert not shard.rows.numpy()[150:].any()  # rank 1 owns 150 rows of a 151-row shard: the rest stays zero


class _SqrtAbs(keras.layers.Layer):
    """``sqrt(|x|)``: finite at 0, where its gradient is not."""

    def call(self, inputs):
        return keras.ops.sqrt(keras.ops.abs(inputs))


def test_a_sharded_tables_gradient_that_is_not_finite_stops_training_with_the_weights_kept(sc):
    """The owners' sums of a sharded table's rows are not in the step's own finiteness check: their flag stops it."""
    from sparktf import TFDataset, TFOptimizer
    from sparktf.errors import TrainingError
    from sparktf.triggers import MaxIteration

    user = keras.Input((1,), dtype="int32")
    vectors = keras.layers.Flatten()(keras.layers.Embedding(USERS, 4, "zeros", name="users")(user))
    model = keras.Model(user, keras.layers.Dense(1)(_SqrtAbs()(vectors)))  # the loss finite, the rows' gradient not
    model.compile("sgd", "mse")
    before = model.get_weights()
    ids = np.arange(64, dtype="int32").reshape(-1, 1) % USERS
    optimizer = TFOptimizer.from_keras(model, TFDataset.from_ndarrays((ids, np.ones((64, 1), "float32")),
                                                                      batch_size=16),
                                       num_workers=2, sharded_tables=["users"])
    with pytest.raises(TrainingError, match="not finite at iteration 1"):
        optimizer.optimize(MaxIteration(2), verbose=0)
    assert optimizer.iteration == 0
    for got, want in zip(model.get_weights(), before):
        np.testing.assert_array_equal(got, want)


def test_validation_and_evaluation_with_sharded_tables_hold_a_batchs_rows_never_a_whole_table(sc):
    """Evaluation tasks build the model with working tables and fetch each batch's rows by id from the driver (a
    task that built a whole table, 301 rows against a worker's share of 151, would fail the initializer); the
    metrics equal Keras' own evaluate of the driver's model."""
    from sparktf import EveryEpoch, TFDataset, TFOptimizer
    from sparktf.triggers import MaxIteration

    features, labels = [np.concatenate(parts) for parts in zip(*[f for f, _ in _batches()])], \
        np.concatenate([labels for _, labels in _batches()])
    held_out = tuple(f[::-1].copy() for f in features), labels[::-1].copy()
    model = _model("adam", _NotWholeInTasks(USERS))
    model.compile(model.optimizer, "binary_crossentropy", metrics=["binary_accuracy"])
    dataset = TFDataset.from_ndarrays((tuple(features), labels), batch_size=GLOBAL_BATCH, val_tensors=held_out)
    optimizer = TFOptimizer.from_keras(model, dataset, num_workers=2, sharded_tables=list(SHARDED))
    history = optimizer.optimize(MaxIteration(STEPS), validation_trigger=EveryEpoch(), verbose=0)
    assert len(history["val_loss"]) == 1 and np.isfinite(history["val_loss"][0])
    evaluated = optimizer.evaluate(TFDataset.from_ndarrays(held_out, batch_per_thread=8))
    local = keras.Model.evaluate(model, list(held_out[0]), held_out[1], batch_size=8, verbose=0, return_dict=True)
    assert set(evaluated) == set(local) == {"loss", "binary_accuracy"}
    for name, value in local.items():
        np.testing.assert_allclose(evaluated[name], value, atol=1e-5, rtol=0, err_msg=name)
