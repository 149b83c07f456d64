"""The main sparktf job: train, evaluate and predict handwritten digits on Spark.

Run with ``make demo`` (or ``python examples/train_digits.py``). It uses the
1,797 8x8 digit images shipped in ``examples/data``, so nothing is downloaded:

1. starts (or reuses) a SparkSession with :func:`sparktf.init_spark`;
2. puts the images into an RDD of ``(image, label)`` records and wraps it in
   a :class:`sparktf.TFDataset` with a validation RDD;
3. trains a small Keras CNN, with a custom layer defined in this script, by
   synchronous data-parallel SGD on Spark barrier tasks (one per core), with
   TensorBoard summaries and checkpoints: Adam from a learning rate of 0.01
   decayed to 0 over the run (cosine), 10 epochs, about 99% held-out accuracy;
4. evaluates it over the held-out records and predicts them with
   :class:`sparktf.TFPredictor`, returning an RDD.
"""

import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sparktf  # before TensorFlow: keeps its start-up log lines out of the output

import keras
import numpy as np

from bundled_data import load_digits

from sparktf import (
    EveryEpoch,
    MaxEpoch,
    TFDataset,
    TFOptimizer,
    TFPredictor,
    TrainSummary,
    ValidationSummary,
)


class Rescale(keras.layers.Layer):
    """Scales pixel intensities from [0, 16] to [0, 1] (a user-defined layer)."""

    def call(self, inputs):
        return inputs / 16.0


def build_model(decay_steps: int) -> keras.Model:
    """The CNN, compiled with Adam on a learning rate that decays from 0.01 to 0 over ``decay_steps`` steps."""
    inputs = keras.Input(shape=(8, 8, 1))
    x = Rescale()(inputs)
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(64, activation="relu")(x)
    outputs = keras.layers.Dense(10, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(1e-2, decay_steps)),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the initial weights and the order of the training records")
    parser.add_argument("--log-dir", default=os.path.join(tempfile.gettempdir(), "sparktf-demo"))
    args = parser.parse_args()

    spark = sparktf.init_spark(app_name="sparktf-digits",
                               conf={"spark.ui.showConsoleProgress": "false"})
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    workers = sc.defaultParallelism

    digits, digit_labels = load_digits()
    images = digits.reshape(-1, 8, 8, 1).astype(np.float32)
    labels = digit_labels.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(images))
    train_idx, test_idx = order[:1500], order[1500:]
    train_rdd = sc.parallelize(list(zip(images[train_idx], labels[train_idx])), workers)
    test_rdd = sc.parallelize(list(zip(images[test_idx], labels[test_idx])), workers)

    batch_size = args.batch_size - args.batch_size % workers
    dataset = TFDataset.from_rdd(
        train_rdd,
        features=("float32", [8, 8, 1]),
        labels=("int32", []),
        batch_size=batch_size,
        val_rdd=test_rdd,
        seed=args.seed,
    )

    keras.utils.set_random_seed(args.seed)
    model = build_model(decay_steps=args.epochs * dataset.iterations_per_epoch())
    model_dir = os.path.join(args.log_dir, "checkpoints")
    optimizer = TFOptimizer.from_keras(model, dataset, model_dir=model_dir)
    optimizer.set_train_summary(TrainSummary(args.log_dir, "digits"))
    optimizer.set_val_summary(ValidationSummary(args.log_dir, "digits"))
    print(f"Training on {workers} Spark workers, global batch {batch_size} ...")
    history = optimizer.optimize(end_trigger=MaxEpoch(args.epochs), checkpoint_trigger=EveryEpoch())
    print(f"trained {history['iterations']} iterations ({history['epochs']} epochs), "
          f"final training loss {history['loss'][-1]:.4f}")
    validation = {k: [round(float(v), 4) for v in vs] for k, vs in history.items()
                  if k not in ("loss", "iterations", "epochs")}
    print("validation after each epoch:", validation)

    test_set = TFDataset.from_rdd(test_rdd, features=("float32", [8, 8, 1]), labels=("int32", []),
                                  batch_per_thread=64)
    scores = optimizer.evaluate(test_set)
    print("held-out evaluation:", {k: round(float(v), 4) for k, v in scores.items()})

    to_predict = TFDataset.from_rdd(test_rdd.map(lambda record: record[0]),
                                    features=("float32", [8, 8, 1]), batch_per_thread=64)
    predictions = TFPredictor.from_keras(model, to_predict).predict()
    predicted = np.array(predictions.map(lambda p: int(np.argmax(p))).collect())
    accuracy = float(np.mean(predicted == labels[test_idx]))
    print(f"TFPredictor accuracy on {len(predicted)} held-out digits: {accuracy:.3f}")
    print(f"TensorBoard: tensorboard --logdir {args.log_dir}")
    spark.stop()


if __name__ == "__main__":
    main()
