"""Deterministic training failures stop at once with a short named error; bad settings fail before any job."""

import logging
import math

import keras
import numpy as np
import pytest

from sparktf import DataError, MaxIteration, TFDataset, TFOptimizer, TrainingError
from sparktf.errors import ModelError


def classifier(classes=2, features=3, loss="sparse_categorical_crossentropy"):
    model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(classes)])
    model.compile(optimizer="sgd", loss=loss)
    return model


def features(n=16, width=3):
    return np.random.default_rng(0).normal(size=(n, width)).astype(np.float32)


def train_once(optimizer, caplog):
    """Train one iteration; return the error and whether a relaunch was logged."""
    with caplog.at_level(logging.WARNING, logger="sparktf.optimizer"):
        with pytest.raises(Exception) as raised:
            optimizer.optimize(MaxIteration(1))
    relaunched = [r for r in caplog.records if "relaunching" in r.getMessage()]
    return raised.value, relaunched


@pytest.mark.parametrize("label", [5, -1])
def test_labels_out_of_range_stop_at_once_with_tensorflows_line(sc, caplog, label):
    labels = np.full(16, label, np.int32)
    dataset = TFDataset.from_ndarrays((features(), labels), batch_size=8)
    optimizer = TFOptimizer.from_keras(classifier(), dataset, max_failures=3)
    error, relaunched = train_once(optimizer, caplog)
    assert isinstance(error, DataError), error
    message = str(error)
    assert f"Received a label value of {label} which is outside the valid range of [0, 2)" in message
    assert "iteration 1" in message and "rank " in message and "partition " in message
    assert "class ids in [0, number of classes)" in message
    assert len(message) < 1500
    assert "InvalidArgumentError" in str(error.__cause__)  # the worker's traceback stays reachable
    assert relaunched == [] and optimizer.iteration == 0


def mean_squares(y_true, y_pred):
    return keras.ops.mean(keras.ops.square(y_true - y_pred))


def test_label_shape_a_custom_loss_rejects_on_the_workers_is_not_relaunched(sc, caplog):
    dataset = TFDataset.from_ndarrays((features(), np.zeros((16, 5), np.float32)), batch_size=8)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3)])
    optimizer = TFOptimizer.from_loss(model, mean_squares, "sgd", dataset, max_failures=3)
    error, relaunched = train_once(optimizer, caplog)
    assert isinstance(error, DataError), error
    assert "Dimensions must be equal, but are 5 and 3" in str(error)
    assert "warm-up" in str(error) and len(str(error)) < 1500
    assert relaunched == []


class FailsWhenTraining(keras.layers.Layer):
    def call(self, inputs, training=False):
        if training:
            raise LookupError("this layer cannot train")
        return inputs


def test_a_model_that_fails_on_its_first_batch_raises_model_error_at_once(sc, caplog):
    model = keras.Sequential([keras.Input((3,)), FailsWhenTraining(), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    dataset = TFDataset.from_ndarrays((features(), np.zeros((16, 1), np.float32)), batch_size=8)
    error, relaunched = train_once(TFOptimizer.from_keras(model, dataset, max_failures=3), caplog)
    assert isinstance(error, ModelError) and isinstance(error, TrainingError), error
    assert "this layer cannot train)" in str(error) and "fix the model" in str(error)
    assert relaunched == []


@pytest.mark.parametrize(
    "model, data, words",
    [
        (classifier(3, loss="mse"), (features(), np.zeros((16, 5), np.float32)),
         ["labels have shape [5]", "output has shape [3]", "loss mse"]),
        (classifier(2), (features(), np.zeros((16, 2), np.float32)),
         ["labels", "[2]", "sparse_categorical_crossentropy", "categorical_crossentropy for one-hot"]),
        (classifier(features=10), (features(width=8), np.zeros(16, np.int32)),
         ["features", "[8]", "[10]"]),
        (classifier(), (np.array([["1.5", "2", "3"]] * 16), np.zeros(16, np.int32)),
         ["features", "string", "float32"]),
    ],
    ids=["mse-shapes", "one-hot-sparse", "input-width", "unicode-features"],
)
def test_data_that_cannot_fit_the_model_is_refused_before_any_job(sc, model, data, words):
    dataset = TFDataset.from_ndarrays(data, batch_size=8)
    jobs_before = sc.statusTracker().getJobIdsForGroup()
    with pytest.raises(DataError) as raised:
        TFOptimizer.from_keras(model, dataset)
    for word in words:
        assert word in str(raised.value)
    assert sc.statusTracker().getJobIdsForGroup() == jobs_before


def test_string_label_column_is_refused_before_any_job(spark):
    df = spark.createDataFrame([([1.0, 2.0, 3.0], "yes")] * 4, ["x", "y"])
    dataset = TFDataset.from_dataframe(df, "x", "y", batch_size=2)
    with pytest.raises(DataError, match=r"labels are strings but the model's output is float32"):
        TFOptimizer.from_keras(classifier(), dataset)


@pytest.mark.parametrize(
    "settings, name",
    [
        ({"collective_timeout": 0}, "collective_timeout"),
        ({"collective_timeout": -5}, "collective_timeout"),
        ({"collective_timeout": math.nan}, "collective_timeout"),
        ({"num_workers": 0}, "num_workers"),
        ({"max_failures": -1}, "max_failures"),
    ],
)
def test_settings_out_of_range_name_the_parameter(sc, settings, name):
    dataset = TFDataset.from_ndarrays((features(), np.zeros(16, np.int32)), batch_size=8)
    with pytest.raises(ValueError, match=name):
        TFOptimizer.from_keras(classifier(), dataset, **settings)


def test_unknown_optimizer_and_missing_dataset_name_the_parameter(sc):
    dataset = TFDataset.from_ndarrays((features(), np.zeros(16, np.int32)), batch_size=8)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    loss = keras.losses.SparseCategoricalCrossentropy()
    with pytest.raises(ValueError, match=r"optim_method='not-an-optimizer' is not a Keras optimizer.*'adam'"):
        TFOptimizer.from_loss(model, loss, "not-an-optimizer", dataset)
    with pytest.raises(TypeError, match="dataset must be a TFDataset"):
        TFOptimizer.from_loss(model, loss, "sgd", None)


def test_model_dir_under_a_regular_file_is_refused_at_construction(sc, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    dataset = TFDataset.from_ndarrays((features(), np.zeros(16, np.int32)), batch_size=8)
    with pytest.raises(ValueError, match=r"model_dir .*a-file.* is a file"):
        TFOptimizer.from_keras(classifier(), dataset, model_dir=str(blocker / "checkpoints"))


def test_only_failures_a_relaunch_can_mend_are_relaunched_and_a_record_keeps_class_and_fields_over_the_wire():
    import json

    from sparktf.errors import ConfigurationError, DriverJVMGone, InternalError, StorageError
    from sparktf.errors import FailureRecord
    from sparktf.errors import relaunch_helps

    never = [DataError("x"), ModelError("x"), ConfigurationError("x"), DriverJVMGone("x"), StorageError("no such key"),
             InternalError("x")]
    assert not any(relaunch_helps(error) for error in never)
    assert all(relaunch_helps(error) for error in (TrainingError("lost peer"), OSError("reset"), RuntimeError("x"),
                                                   StorageError("reset", transient=True)))
    for transient in (True, False):
        error = StorageError("s3://b/k: reset", path="s3://b/k", route="fsspec s3fs", retries=2, transient=transient)
        record = FailureRecord.from_wire(json.loads(json.dumps(FailureRecord.of(error, rank=1, shard=0).to_wire())))
        back = record.to_error()
        assert type(back) is StorageError and str(back) == "s3://b/k: reset" and (record.rank, record.shard) == (1, 0)
        assert (back.path, back.route, back.retries, back.transient) == ("s3://b/k", "fsspec s3fs", 2, transient)
    assert type(FailureRecord.of(DataError("bad record 3")).to_error()) is DataError
    wired = json.loads(json.dumps(FailureRecord.of(DataError("row 3", bad_row=(1, 3))).to_wire()))
    assert FailureRecord.from_wire(wired).to_error().bad_row == (1, 3)  # where the record is travels with it
    unknown = FailureRecord.of(KeyError("k"))
    assert unknown.relaunch_helps and type(unknown.to_error()) is TrainingError and "KeyError" in unknown.message
    with pytest.raises(ValueError, match="unknown kind"):
        FailureRecord.from_wire({**unknown.to_wire(), "kind": "os.system"})


@pytest.mark.parametrize("raised, expected", [(ValueError("offsets out of range"), "InternalError"),
                                              (ConnectionResetError("reset by peer"), "CollectiveError"),
                                              ("CollectiveError", "CollectiveError")])
def test_a_failing_gradient_exchange_is_sparktfs_error_never_the_datas(raised, expected):
    from sparktf import errors
    from sparktf.errors import relaunch_helps
    from sparktf.training.worker.failures import classified_failures
    from sparktf.training.worker.step import TrainStep

    raised = errors.CollectiveError("rank 1 vanished") if raised == "CollectiveError" else raised
    step = TrainStep(classifier())

    def exchange(layout, parts):
        raise raised

    with pytest.raises(getattr(errors, expected)) as info:
        with classified_failures(rank=0, shard=1, iteration=1, warm_up=False):  # as the training loop runs a step
            step.run(features(8), np.zeros(8, np.int32), exchange)
    assert not isinstance(info.value, DataError) and info.value.__cause__ is not None
    assert relaunch_helps(info.value) is (expected == "CollectiveError")
    if expected == "InternalError":
        assert "offsets out of range" in str(info.value) and "please report it" in str(info.value)
