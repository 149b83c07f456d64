"""Checkpoints, resuming with absolute counters, validation and summaries during optimize."""

import os

import keras
import numpy as np

from sparktf import (
    EveryEpoch,
    MaxEpoch,
    MaxScore,
    SeveralIteration,
    TFDataset,
    TFOptimizer,
    TrainSummary,
    TriggerOr,
    ValidationSummary,
)


def data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    return x, x @ np.array([[1.0], [-2.0], [3.0]], np.float32) + 0.5


def momentum_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, kernel_initializer="zeros")])
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse", metrics=["mae"])
    return model


def test_checkpoints_resume_with_absolute_counters(sc, tmp_path):
    model_dir = str(tmp_path / "run")
    dataset = TFDataset.from_ndarrays(data(64), batch_size=16, seed=1)
    model = momentum_model()
    first = TFOptimizer.from_keras(model, dataset, model_dir=model_dir)
    assert first.optimize(MaxEpoch(2))["iterations"] == 8
    assert sorted(os.listdir(model_dir)) == ["checkpoint-4.npz", "checkpoint-8.npz"]
    trained = model.get_weights()

    resumed_model = momentum_model()
    resumed = TFOptimizer.from_keras(resumed_model, dataset, model_dir=model_dir)
    resumed.load_checkpoint()
    for a, b in zip(resumed_model.get_weights(), trained):
        np.testing.assert_array_equal(a, b)
    assert int(resumed_model.optimizer.iterations.numpy()) == 8
    finished = resumed.optimize(MaxEpoch(2))
    assert finished == {"loss": [], "iterations": 8, "epochs": 2}

    resumed.load_checkpoint(version=4)  # momentum state and counters from iteration 4
    again = resumed.optimize(MaxEpoch(2))
    assert again["iterations"] == 8 and len(again["loss"]) == 4
    for a, b in zip(resumed_model.get_weights(), trained):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    more = resumed.optimize(MaxEpoch(3))
    assert more["iterations"] == 12 and more["epochs"] == 3
    assert os.path.exists(os.path.join(model_dir, "checkpoint-12.npz"))


def test_validation_history_and_summaries(sc, tmp_path):
    dataset = TFDataset.from_ndarrays(data(64), batch_size=16, val_tensors=data(24, seed=7))
    model = momentum_model()
    optimizer = TFOptimizer.from_keras(model, dataset)
    optimizer.set_train_summary(TrainSummary(str(tmp_path), "app"))
    optimizer.set_val_summary(ValidationSummary(str(tmp_path), "app"))
    history = optimizer.optimize(MaxEpoch(2), validation_trigger=EveryEpoch())
    assert len(history["val_loss"]) == len(history["val_mae"]) == 2
    val_x, val_y = data(24, seed=7)
    expected = model.evaluate(val_x, val_y, verbose=0, return_dict=True)
    np.testing.assert_allclose(history["val_loss"][-1], expected["loss"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(history["val_mae"][-1], expected["mae"], rtol=1e-5, atol=1e-6)

    train = optimizer.train_summary
    loss = train.read_scalar("Loss")
    np.testing.assert_array_equal(loss[:, 0], np.arange(1, 9))
    np.testing.assert_allclose(loss[:, 1], history["loss"], rtol=1e-6)
    assert (train.read_scalar("Throughput")[:, 1] > 0).all()
    np.testing.assert_allclose(train.read_scalar("LearningRate")[:, 1], 0.05, rtol=1e-6)
    assert (np.diff(loss[:, 2]) >= 0).all()
    validation = optimizer.val_summary
    np.testing.assert_array_equal(validation.read_scalar("Loss")[:, 0], [4, 8])
    np.testing.assert_allclose(validation.read_scalar("mae")[:, 1], history["val_mae"], rtol=1e-6)
    assert os.path.isdir(tmp_path / "app" / "train") and os.path.isdir(tmp_path / "app" / "validation")


def test_max_score_stops_after_a_validation(sc):
    dataset = TFDataset.from_ndarrays(data(64), batch_size=16, val_tensors=data(16, seed=3))
    optimizer = TFOptimizer.from_keras(momentum_model(), dataset)
    history = optimizer.optimize(
        end_trigger=TriggerOr(MaxScore(-1.0), MaxEpoch(5)), validation_trigger=SeveralIteration(2)
    )
    assert history["iterations"] == 2  # the first validation's mae (> -1) ends training
    assert len(history["val_mae"]) == 1
