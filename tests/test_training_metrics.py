"""The compiled metrics during training: per epoch, over the epoch's records, as model.fit gives them (local[2])."""

import keras
import numpy as np
import pytest

from sparktf import MaxEpoch, MaxIteration, TFDataset, TFOptimizer, TrainSummary


def classification_data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5]) + 0.3 * rng.normal(size=n) > 0).astype(np.float32)[:, None]
    return x, y


def classifier(weights=None):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(keras.optimizers.SGD(0.5), "binary_crossentropy", metrics=["accuracy", keras.metrics.AUC(name="auc")])
    if weights is not None:
        model.set_weights(weights)
    return model


class EpochLogs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.logs = []

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append(dict(logs))


def test_epoch_metrics_equal_fit_on_the_same_global_batches_across_calls(sc, tmp_path):
    x, y = classification_data()
    initial = classifier().get_weights()
    # 2 workers, no shuffling: rank 0 reads records 0-31, rank 1 records 32-63, 8 each per iteration
    dataset = TFDataset.from_ndarrays((x, y), batch_size=16, shuffle=False, sequential_order=True, num_partitions=1)
    optimizer = TFOptimizer.from_keras(classifier(initial), dataset, num_workers=2)
    optimizer.set_train_summary(TrainSummary(str(tmp_path), "metrics"))
    recorder = EpochLogs()
    first = optimizer.optimize(MaxIteration(6), callbacks=[recorder], verbose=0)  # stops in epoch 2 ...
    second = optimizer.optimize(MaxEpoch(2), callbacks=[recorder], verbose=0)  # ... which ends in the next call

    order = np.concatenate([np.r_[8 * k : 8 * k + 8, 32 + 8 * k : 40 + 8 * k] for k in range(4)])
    local = classifier(initial)  # one process, the same global batches in the same order
    fit = local.fit(x[order], y[order], batch_size=16, epochs=2, shuffle=False, verbose=0).history

    assert first["accuracy"] == [recorder.logs[0]["accuracy"]] and len(first["auc"]) == 1
    assert second["accuracy"] == [recorder.logs[1]["accuracy"]] and len(second["auc"]) == 1
    for name in ("accuracy", "auc"):
        np.testing.assert_allclose(first[name] + second[name], fit[name], atol=1e-5)
        np.testing.assert_allclose([logs[name] for logs in recorder.logs], fit[name], atol=1e-5)
    np.testing.assert_allclose(recorder.logs[0]["loss"], fit["loss"][0], atol=1e-5)
    assert optimizer.history.history["auc"] == [recorder.logs[1]["auc"]]
    written = optimizer.train_summary.read_scalar("accuracy")
    assert written[:, 0].tolist() == [4, 8]  # at each epoch's last iteration
    np.testing.assert_allclose(written[:, 1], fit["accuracy"], atol=1e-5)
    assert fit["accuracy"][0] != fit["accuracy"][1]  # the epochs differ: each is its own epoch's


def test_mlflow_callback_logs_the_training_and_validation_metrics_per_epoch(sc, tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    import mlflow.keras

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    experiment = mlflow.create_experiment("sparktf", artifact_location=(tmp_path / "artifacts").as_uri())
    dataset = TFDataset.from_ndarrays(classification_data(), batch_size=16, val_tensors=classification_data(32, 1))
    optimizer = TFOptimizer.from_keras(classifier(), dataset)
    with mlflow.start_run(experiment_id=experiment) as run:
        history = optimizer.optimize(MaxEpoch(2), callbacks=[mlflow.keras.MlflowCallback()], verbose=0)
    client = mlflow.MlflowClient()
    for name in ("loss", "accuracy", "auc", "val_loss", "val_accuracy"):
        logged = client.get_metric_history(run.info.run_id, name)
        assert [metric.step for metric in logged] == [0, 1], name
        np.testing.assert_allclose([metric.value for metric in logged], optimizer.history.history[name], atol=1e-6)
    np.testing.assert_allclose(optimizer.history.history["accuracy"], history["accuracy"], atol=1e-7)


def test_metrics_are_built_once_however_often_validation_asks(caplog):
    """The driver's model takes every validation's totals: building its metrics again would retrace each time."""
    from sparktf.training.metric_state import build_metrics

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy", metrics=["accuracy"])
    features, labels = np.zeros((1, 3), np.float32), np.zeros((1,), np.int32)
    with caplog.at_level("WARNING"):
        for _ in range(7):
            build_metrics(model, features, labels)
    assert [v.shape for v in model.metrics[1].variables] == [(), ()]  # accuracy's total and count, built
    assert not [r for r in caplog.records if "retracing" in r.getMessage()]


def test_the_metrics_of_many_models_in_one_process_build_without_tensorflows_retracing_warning(caplog):
    """Parallel trials build a model's metrics on the driver per trial: TensorFlow warned from the sixth on."""
    from sparktf.training.metric_state import build_metrics

    features, labels = np.zeros((1, 3), np.float32), np.zeros((1,), np.int32)
    with caplog.at_level("WARNING"):
        for _ in range(7):
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
            model.compile("sgd", "sparse_categorical_crossentropy", metrics=["accuracy"])
            build_metrics(model, features, labels)
            assert [v.shape for v in model.metrics[1].variables] == [(), ()]
    assert not [r for r in caplog.records if "retracing" in r.getMessage()]
