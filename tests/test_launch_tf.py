"""sparktf.run with real MultiWorkerMirroredStrategy programs: a Keras 3 custom loop and tf_keras fit."""

import os

import numpy as np
import pytest

import sparktf

pytest.importorskip("tf_keras")


def _synthetic_shard(rank: int, rows: int = 64):
    """Different data on every worker, so equal final weights prove the gradients were all-reduced."""
    rng = np.random.default_rng(100 + rank)
    x = rng.normal(size=(rows, 4)).astype("float32")
    return x, (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32") + 0.1).astype("float32")


def _save_weights(out_dir, ctx, weights):
    np.savez(os.path.join(out_dir, f"rank{ctx.worker_num}.npz"), *weights)


def _keras3_custom_loop(out_dir, ctx):
    import keras
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(learning_rate=0.05)
    x, y = _synthetic_shard(ctx.worker_num)

    @tf.function
    def train_step(features, labels):
        def replica_step(features, labels):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(features, training=True) - labels))
                scaled = loss / strategy.num_replicas_in_sync
            optimizer.apply_gradients(zip(tape.gradient(scaled, model.trainable_variables), model.trainable_variables))
            return loss
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(replica_step, (features, labels)), None)

    losses = [float(train_step(x[i:i + 16], y[i:i + 16])) for i in range(0, 64, 16) for _ in range(3)]
    print(f"{ctx.job_name} {ctx.task_index} keras {keras.__version__} losses {losses[0]:.4f} -> {losses[-1]:.4f}")
    _save_weights(out_dir, ctx, [v.numpy() for v in model.weights])
    return {"first_loss": losses[0], "last_loss": losses[-1], "keras": keras.__version__}


def _tf_keras_fit(out_dir, ctx):
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8, activation="relu"),
                                     tf.keras.layers.Dense(1)])
        model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=0.05), loss="mse")
    x, y = _synthetic_shard(ctx.worker_num)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).with_options(options)
    history = model.fit(dataset, epochs=3, verbose=2)
    _save_weights(out_dir, ctx, model.get_weights())
    return {"losses": history.history["loss"], "model_class_module": type(model).__module__}


def _weights_of(out_dir, rank):
    with np.load(os.path.join(out_dir, f"rank{rank}.npz")) as saved:
        return [saved[key] for key in sorted(saved.files, key=lambda k: int(k.split("_")[1]))]


def _assert_identical_weights(out_dir):
    chief, worker = _weights_of(out_dir, 0), _weights_of(out_dir, 1)
    assert len(chief) == len(worker) == 4
    for a, b in zip(chief, worker):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_keras3_custom_loop_under_mwms_trains_in_sync(sc, capsys, tmp_path):
    result = sparktf.run(_keras3_custom_loop, args=str(tmp_path), num_workers=2, master_node="chief", timeout=240)
    assert result["keras"].startswith("3.")
    assert result["last_loss"] < result["first_loss"]
    _assert_identical_weights(tmp_path)
    out = capsys.readouterr().out
    assert "[chief 0] chief 0 keras 3" in out and "[worker 0] worker 0 keras 3" in out


def test_tf_keras_fit_under_mwms_with_legacy_keras(sc, capsys, tmp_path):
    result = sparktf.run(_tf_keras_fit, args=str(tmp_path), num_workers=2, env={"TF_USE_LEGACY_KERAS": "1"},
                         timeout=240)
    assert result["model_class_module"].startswith("tf_keras")
    assert len(result["losses"]) == 3 and result["losses"][-1] < result["losses"][0]
    _assert_identical_weights(tmp_path)
    out = capsys.readouterr().out
    assert "[worker 0] Epoch 3/3" in out and "[worker 1] Epoch 3/3" in out
