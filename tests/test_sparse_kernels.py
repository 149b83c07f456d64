"""Exact sparse kernels (sparktf.training.tables.sparse_kernels), RowWiseAdagrad and LazyAdam: one process, no Spark."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from sparktf.optimizers import LazyAdam, RowWiseAdagrad
from sparktf.optimizers.rows import sum_duplicate_rows
from sparktf.training.tables.sparse_kernels import (ADAGRAD_KERNEL, LAZY_ADAM_KERNEL, ROW_WISE_ADAGRAD_KERNEL,
                                             apply_rows, kernel_description, sparse_kernel)

SHAPE = (50, 4)
TOUCHED = 30  # steps touch rows 0 .. 29 only


def random_steps(seed, count, ids=16, high=TOUCHED, scale=1.0):
    """``count`` steps of (ids with repeats, rows) for a SHAPE table."""
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, high, size=ids).astype(np.int64),
             (rng.normal(size=(ids, SHAPE[1])) * scale).astype(np.float32)) for _ in range(count)]


def slices(ids, rows, shape=SHAPE):
    return tf.IndexedSlices(tf.convert_to_tensor(rows), tf.convert_to_tensor(ids), tf.constant(shape, tf.int64))


def table(seed=0, shape=SHAPE):
    return keras.Variable(np.random.default_rng(seed).normal(size=shape).astype(np.float32), name="table")


def assert_same_state(optimizer, variable, reference, reference_variable, atol=1e-6):
    np.testing.assert_allclose(variable.numpy(), reference_variable.numpy(), rtol=0, atol=atol)
    assert [v.path for v in optimizer.variables] == [v.path for v in reference.variables]
    for mine, theirs in zip(optimizer.variables, reference.variables):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=0, atol=atol, err_msg=mine.path)


KERNELS = {
    "adagrad": (lambda: keras.optimizers.Adagrad(learning_rate=0.1), ADAGRAD_KERNEL, 1.0),
    # where TensorFlow's ResourceSparseApplyAdagradV2 (epsilon outside the sqrt) is 0.15 off after 100 steps
    "adagrad_zero_accumulator": (lambda: keras.optimizers.Adagrad(learning_rate=0.1, initial_accumulator_value=0.0),
                                 ADAGRAD_KERNEL, 1e-3),
    "row_wise_adagrad": (lambda: RowWiseAdagrad(learning_rate=0.1), ROW_WISE_ADAGRAD_KERNEL, 1.0),
    "lazy_adam": (lambda: LazyAdam(learning_rate=0.01), LAZY_ADAM_KERNEL, 1.0),
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_apply_rows_equals_keras_apply(name):
    make, kernel, scale = KERNELS[name]
    optimizer = make()
    reference = type(optimizer).from_config(optimizer.get_config())
    assert sparse_kernel(optimizer) == kernel and "touched rows only" in kernel_description(optimizer)
    variable, reference_variable = table(), table()
    optimizer.build([variable])
    reference.build([reference_variable])

    @tf.function
    def kernel_step(ids, rows):  # repeated ids: apply_rows sums them
        apply_rows(optimizer, variable, slices(ids, rows))
        optimizer.iterations.assign_add(1)

    @tf.function
    def keras_step(ids, rows):  # deduplicated the way a caller (the gradient exchange) does
        unique, summed = sum_duplicate_rows(ids, rows)
        reference.apply([slices(unique, summed)], [reference_variable])

    initial = variable.numpy()
    for ids, rows in random_steps(1, 100, scale=scale):
        kernel_step(ids, rows)
        keras_step(ids, rows)
    assert int(optimizer.iterations.numpy()) == int(reference.iterations.numpy()) == 100
    assert_same_state(optimizer, variable, reference, reference_variable)
    assert not np.allclose(variable.numpy()[:TOUCHED], initial[:TOUCHED])
    np.testing.assert_array_equal(variable.numpy()[TOUCHED:], initial[TOUCHED:])


@pytest.mark.parametrize("make", [
    lambda: keras.optimizers.Adagrad(learning_rate=0.1),
    lambda: LazyAdam(learning_rate=keras.optimizers.schedules.ExponentialDecay(0.05, 3, 0.5)),
], ids=["adagrad", "lazy_adam_schedule"])
def test_rows_then_subset_apply_equals_one_apply_of_all(make):
    # apply_rows for the table, then optimizer.apply of the other variables: one iterations increment per step
    optimizer = make()
    reference = type(optimizer).from_config(optimizer.get_config())
    rng = np.random.default_rng(3)
    init = [rng.normal(size=shape).astype(np.float32) for shape in (SHAPE, (4, 3), (3,))]
    names = ("table", "kernel", "bias")
    mine, theirs = ([keras.Variable(v, name=n) for v, n in zip(init, names)] for _ in range(2))
    optimizer.build(mine)
    reference.build(theirs)

    @tf.function
    def split_step(ids, rows, kernel_gradient, bias_gradient):
        apply_rows(optimizer, mine[0], slices(ids, rows))
        optimizer.apply([kernel_gradient, bias_gradient], mine[1:])

    @tf.function
    def whole_step(ids, rows, kernel_gradient, bias_gradient):
        unique, summed = sum_duplicate_rows(ids, rows)
        reference.apply([slices(unique, summed), kernel_gradient, bias_gradient], theirs)

    for ids, rows in random_steps(4, 10):
        dense = (rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(3,)).astype(np.float32))
        split_step(ids, rows, *dense)
        whole_step(ids, rows, *dense)
    assert int(optimizer.iterations.numpy()) == 10
    for variable, reference_variable in zip(mine, theirs):
        assert_same_state(optimizer, variable, reference, reference_variable)


def test_no_kernel_where_it_would_not_be_exact():
    refused = [keras.optimizers.Adam(), keras.optimizers.SGD(), keras.optimizers.SGD(momentum=0.9), keras.optimizers.Adagrad(clipnorm=1.0),
               keras.optimizers.Ftrl(), RowWiseAdagrad(weight_decay=0.01), LazyAdam(use_ema=True),
               keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())]
    for optimizer in refused:
        assert sparse_kernel(optimizer) is None, optimizer
        assert kernel_description(optimizer).startswith("Keras' own update")
    variable = table()
    adam = keras.optimizers.Adam()
    adam.build([variable])
    with pytest.raises(ValueError, match="no exact sparse kernel"):
        apply_rows(adam, variable, slices([0], np.ones((1, 4), np.float32)))
    with pytest.raises(ValueError, match="not built"):
        apply_rows(keras.optimizers.Adagrad(), variable, slices([0], np.ones((1, 4), np.float32)))


def test_row_wise_adagrad_matches_numpy_reference():
    lr, eps = 0.1, 1e-8
    optimizer = RowWiseAdagrad(learning_rate=lr, epsilon=eps)
    rng = np.random.default_rng(5)
    w0, b0 = rng.normal(size=(6, 3)).astype(np.float32), rng.normal(size=(3,)).astype(np.float32)
    variable, bias = keras.Variable(w0), keras.Variable(b0)
    optimizer.build([variable, bias])
    assert optimizer.accumulator(variable).shape == (6,) and optimizer.accumulator(bias).shape == (3,)
    w, acc, b, bias_acc = w0.astype(np.float64), np.zeros(6), b0.astype(np.float64), np.zeros(3)
    for ids in ([0, 2, 2], [2, 4], [0, 0, 4]):  # rows 1, 3 and 5 never present
        rows = rng.normal(size=(len(ids), 3)).astype(np.float32)
        bias_gradient = rng.normal(size=(3,)).astype(np.float32)
        optimizer.apply([slices(ids, rows, (6, 3)), bias_gradient], [variable, bias])
        dense = np.zeros((6, 3))
        np.add.at(dense, ids, rows)
        acc += np.mean(dense ** 2, axis=1)
        w -= lr * dense / (np.sqrt(acc) + eps)[:, None]
        bias_acc += bias_gradient.astype(np.float64) ** 2  # 1-D: element-wise Adagrad, same formula
        b -= lr * bias_gradient / (np.sqrt(bias_acc) + eps)
    np.testing.assert_allclose(variable.numpy(), w, rtol=0, atol=1e-6)
    np.testing.assert_allclose(optimizer.accumulator(variable).numpy(), acc, rtol=1e-6, atol=0)
    np.testing.assert_allclose(bias.numpy(), b, rtol=0, atol=1e-6)
    np.testing.assert_allclose(optimizer.accumulator(bias).numpy(), bias_acc, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(variable.numpy()[[1, 3, 5]], w0[[1, 3, 5]])
    np.testing.assert_array_equal(optimizer.accumulator(variable).numpy()[[1, 3, 5]], 0.0)
    # a dense gradient gives the update of its IndexedSlices
    sparse_optimizer, dense_optimizer = RowWiseAdagrad(lr, eps), RowWiseAdagrad(lr, eps)
    sparse_variable, dense_variable = keras.Variable(w0), keras.Variable(w0)
    for ids, rows in random_steps(6, 3, ids=3, high=6):
        sparse_optimizer.apply([slices(ids, rows[:, :3], (6, 3))], [sparse_variable])
        dense_optimizer.apply([tf.convert_to_tensor(slices(ids, rows[:, :3], (6, 3)))], [dense_variable])
    np.testing.assert_allclose(dense_variable.numpy(), sparse_variable.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(dense_optimizer.accumulator(dense_variable).numpy(),
                               sparse_optimizer.accumulator(sparse_variable).numpy(), rtol=1e-6, atol=0)
    assert not np.allclose(dense_variable.numpy(), w0)


def test_lazy_adam_equals_adam_with_dense_gradients():
    adam, lazy = keras.optimizers.Adam(learning_rate=0.01), LazyAdam(learning_rate=0.01)
    rng = np.random.default_rng(7)
    init = [rng.normal(size=shape).astype(np.float32) for shape in (SHAPE, (4,))]
    adam_vars, lazy_vars = [keras.Variable(v) for v in init], [keras.Variable(v) for v in init]
    for _ in range(20):
        gradients = [rng.normal(size=v.shape).astype(np.float32) for v in init]
        adam.apply(gradients, adam_vars)
        lazy.apply(gradients, lazy_vars)
    for a, b in zip(adam_vars, lazy_vars):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=0, atol=1e-6)
        assert not np.allclose(b.numpy(), init[0] if b.shape == SHAPE else init[1])
    for a, b in zip(adam.variables, lazy.variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=0, atol=1e-6)


def test_lazy_adam_rows_absent_from_the_gradient_do_not_move():
    adam, lazy = keras.optimizers.Adam(learning_rate=0.01), LazyAdam(learning_rate=0.01)
    adam_table, lazy_table = table(), table()
    initial = lazy_table.numpy()
    steps = random_steps(8, 20)
    steps[0] = (np.array([TOUCHED + 5]), steps[0][1][:1])  # row 35: in the first step only
    for ids, rows in steps:
        lazy.apply([slices(ids, rows)], [lazy_table])
        adam.apply([slices(ids, rows)], [adam_table])
    momentum, velocity = (slot.numpy() for slot in lazy.moments(lazy_table))
    untouched = [row for row in range(SHAPE[0]) if row >= TOUCHED and row != TOUCHED + 5]
    np.testing.assert_array_equal(lazy_table.numpy()[untouched], initial[untouched])
    assert not momentum[untouched].any() and not velocity[untouched].any()
    # row 35 moved once (step 1) and then kept its place and stale moments; Adam kept moving it
    after_first = initial[TOUCHED + 5] - 0.01 * np.sign(steps[0][1][0])
    np.testing.assert_allclose(lazy_table.numpy()[TOUCHED + 5], after_first, atol=1e-5)
    assert np.abs(adam_table.numpy()[TOUCHED + 5] - after_first).min() > 1e-2
    # with every row present at every step, the lazy update is Adam's
    adam, lazy, adam_table, lazy_table = keras.optimizers.Adam(0.01), LazyAdam(0.01), table(), table()
    rng = np.random.default_rng(9)
    for _ in range(20):
        ids = rng.permutation(SHAPE[0]).astype(np.int64)
        rows = rng.normal(size=SHAPE).astype(np.float32)
        lazy.apply([slices(ids, rows)], [lazy_table])
        adam.apply([slices(ids, rows)], [adam_table])
    np.testing.assert_allclose(lazy_table.numpy(), adam_table.numpy(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("make", [lambda: RowWiseAdagrad(learning_rate=0.05, epsilon=1e-6),
                                  lambda: LazyAdam(learning_rate=0.01, beta_1=0.8, beta_2=0.99, epsilon=1e-6)],
                         ids=["row_wise_adagrad", "lazy_adam"])
def test_fit_save_and_load(make, tmp_path):
    optimizer = make()
    config = optimizer.get_config()
    again = type(optimizer).from_config(config)
    assert again.get_config() == config and type(again) is type(optimizer)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(20, 4),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse")
    rng = np.random.default_rng(10)
    x, y = rng.integers(0, 20, size=(64, 3)).astype(np.int32), rng.normal(size=(64, 1)).astype(np.float32)
    table_before = model.layers[0].embeddings.numpy()
    history = model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert not np.allclose(model.layers[0].embeddings.numpy(), table_before)
    assert int(optimizer.iterations.numpy()) == 4
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert type(loaded.optimizer) is type(optimizer) and loaded.optimizer.get_config() == optimizer.get_config()
    assert len(loaded.optimizer.variables) == len(optimizer.variables)
    for mine, theirs in zip(optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(theirs.numpy(), mine.numpy())
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)
