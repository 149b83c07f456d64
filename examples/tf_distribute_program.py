"""A tf.distribute program written the TensorFlowOnSpark way, run on Spark with ``sparktf.run``.

``main_fun(args, ctx)`` is an ordinary MultiWorkerMirroredStrategy program: it
reads ``TF_CONFIG`` (set by sparktf for every task), builds the strategy,
trains on its own shard of small synthetic regression data and, on the chief,
saves the model under ``--model_dir``. sparktf starts one fresh Python
process per Spark barrier task for it and prints their output as
``[chief 0] ...`` / ``[worker 0] ...``.

Two ways to train that work under MultiWorkerMirroredStrategy:

- default: a custom training loop (``strategy.run``) on Keras 3 layers;
- ``--legacy_keras``: ``model.fit`` on ``tf_keras`` (``pip install
  'sparktf[legacy-keras]'``); sparktf sets ``TF_USE_LEGACY_KERAS=1`` in the
  children. Keras 3's own ``fit`` does not run under this strategy.

Run::

    python examples/tf_distribute_program.py --smoke
    spark-submit --master local[2] examples/tf_distribute_program.py --num_workers 2 --model_dir /tmp/model
"""

import argparse
import json
import os
import shutil
import tempfile

import numpy as np

import sparktf

TRUE_WEIGHTS = np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")


def make_shard(rank: int, rows: int):
    """Synthetic regression data, different on every worker: y = x @ TRUE_WEIGHTS + 0.1 + noise."""
    rng = np.random.default_rng(1000 + rank)
    x = rng.normal(size=(rows, 4)).astype("float32")
    y = x @ TRUE_WEIGHTS + 0.1 + rng.normal(scale=0.01, size=(rows, 1)).astype("float32")
    return x, y


def train_keras3_custom_loop(strategy, x, y, args):
    """Keras 3 layers, trained by a ``strategy.run`` loop; returns the model and the last mean loss."""
    import keras
    import tensorflow as tf

    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
        optimizer = keras.optimizers.Adam(learning_rate=args.learning_rate)

    @tf.function
    def train_step(features, labels):
        def replica_step(features, labels):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(features, training=True) - labels))
                scaled_loss = loss / strategy.num_replicas_in_sync
            gradients = tape.gradient(scaled_loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss

        per_replica = strategy.run(replica_step, args=(features, labels))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None)

    loss = float("nan")
    for epoch in range(args.epochs):
        for start in range(0, len(x), args.batch_size):
            loss = float(train_step(x[start:start + args.batch_size], y[start:start + args.batch_size]))
        print(f"epoch {epoch + 1}/{args.epochs} loss {loss:.4f}", flush=True)
    return model, loss


def train_tf_keras_fit(strategy, x, y, args):
    """``tf_keras`` (``TF_USE_LEGACY_KERAS=1``) trained by ``model.fit``; returns the model and the last loss."""
    import tensorflow as tf

    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(16, activation="relu"),
                                     tf.keras.layers.Dense(1)])
        model.compile(optimizer=tf.keras.optimizers.Adam(learning_rate=args.learning_rate), loss="mse")
    options = tf.data.Options()
    # every worker already holds its own shard
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch_size).with_options(options)
    history = model.fit(dataset, epochs=args.epochs, verbose=2)
    return model, float(history.history["loss"][-1])


def main_fun(args, ctx):
    """The distributed program: one call per task, in its own process, with ``TF_CONFIG`` set."""
    import tensorflow as tf

    print(f"{ctx.job_name} {ctx.task_index} of {ctx.num_workers}: TF_CONFIG={os.environ['TF_CONFIG']}", flush=True)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x, y = make_shard(ctx.worker_num, rows=64 if args.smoke else 4096)
    if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
        model, loss = train_tf_keras_fit(strategy, x, y, args)
    else:
        model, loss = train_keras3_custom_loop(strategy, x, y, args)
    # Every task saves (saving may run collectives under this strategy); only the chief's copy is kept.
    is_chief = ctx.job_name == "chief"
    model_dir = ctx.absolute_path(args.model_dir) if is_chief else tempfile.mkdtemp(prefix="tf_distribute_worker_")
    os.makedirs(model_dir, exist_ok=True)
    path = os.path.join(model_dir, "model.keras")
    model.save(path)
    if not is_chief:
        shutil.rmtree(model_dir, ignore_errors=True)
        return None
    return {"loss": loss, "model_path": path}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", default="tf_distribute_model", help="where the chief saves the model")
    parser.add_argument("--num_workers", type=int, default=2, help="Spark barrier tasks (one process each)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=32, help="per worker")
    parser.add_argument("--learning_rate", type=float, default=0.01)
    parser.add_argument("--legacy_keras", action="store_true", help="tf_keras model.fit instead of a Keras 3 loop")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds each process may run")
    parser.add_argument("--smoke", action="store_true", help="tiny data and 2 epochs, for a quick check")
    args = parser.parse_args(argv)
    if args.smoke:
        args.epochs = min(args.epochs, 2)
    return args


def main(argv=None):
    """Run ``main_fun`` on ``--num_workers`` Spark barrier tasks; return what the chief returned."""
    arguments = parse_args(argv)
    sparktf.init_spark(app_name="tf_distribute_program")
    result = sparktf.run(
        main_fun,
        arguments,
        num_workers=arguments.num_workers,
        master_node="chief",
        env={"TF_USE_LEGACY_KERAS": "1"} if arguments.legacy_keras else None,
        timeout=arguments.timeout,
    )
    print("chief returned:", json.dumps(result))
    return result


if __name__ == "__main__":
    main()
