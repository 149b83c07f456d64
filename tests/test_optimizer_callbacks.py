"""Keras callbacks, live progress and the Keras-shaped history of TFOptimizer.optimize (real Spark, local[2])."""

import csv
import logging
import os
import re
import time

import keras
import numpy as np
import tensorflow as tf

from sparktf import MaxEpoch, TFDataset, TFOptimizer, TrainSummary
from sparktf.collective.channel import RankReport
from sparktf.training.driver.callbacks import DriverCallbacks, default_verbose
from sparktf.triggers import TrainingProgress

W = np.array([[1.0], [-2.0], [3.0]], np.float32)


def data(n=64, seed=0, sign=1.0):
    x = np.random.default_rng(seed).normal(size=(n, 3)).astype(np.float32)
    return x, sign * x @ W


def linear_model(learning_rate=0.05):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, kernel_initializer="zeros")])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate), loss="mse", metrics=["mae"])
    return model


class RecordEpochs(keras.callbacks.Callback):
    """A user callback from the test module: keeps every epoch's logs and the model's weights then."""

    def __init__(self):
        super().__init__()
        self.logs, self.weights, self.batches, self.hooks = [], [], [], []

    def on_train_begin(self, logs=None):
        self.hooks.append("train_begin")

    def on_epoch_begin(self, epoch, logs=None):
        self.hooks.append(f"epoch_begin {epoch}")

    def on_train_batch_end(self, batch, logs=None):
        self.hooks.append(f"batch {batch}")
        self.batches.append(dict(logs))

    def on_epoch_end(self, epoch, logs=None):
        self.hooks.append(f"epoch_end {epoch}")
        self.logs.append(dict(logs))
        self.weights.append(self.model.get_weights())

    def on_train_end(self, logs=None):
        self.hooks.append("train_end")


def test_callbacks_see_every_epoch_and_the_history_matches(sc, tmp_path):
    dataset = TFDataset.from_ndarrays(data(), batch_size=16, val_tensors=data(32, seed=1))
    model = linear_model()
    recorder, csv_path = RecordEpochs(), tmp_path / "epochs.csv"
    optimizer = TFOptimizer.from_keras(model, dataset)
    history = optimizer.optimize(MaxEpoch(3), callbacks=[recorder, keras.callbacks.CSVLogger(str(csv_path))],
                                 verbose=0)
    every_batch = [f"batch {b}" for b in range(4)]  # each of the 4 iterations of an epoch, in order, once
    assert recorder.hooks == ["train_begin"] + [
        hook for i in range(3) for hook in (f"epoch_begin {i}", *every_batch, f"epoch_end {i}")] + ["train_end"]
    assert [logs["loss"] for logs in recorder.batches] == history["loss"]
    assert [sorted(logs) for logs in recorder.logs] == [["loss", "mae", "val_loss", "val_mae"]] * 3
    assert optimizer.history.history["loss"] == [logs["loss"] for logs in recorder.logs]
    assert optimizer.history.history["val_mae"] == [logs["val_mae"] for logs in recorder.logs]
    assert recorder.logs[-1]["loss"] < recorder.logs[0]["loss"]
    np.testing.assert_allclose(recorder.weights[-1][0], model.get_weights()[0], atol=1e-7)
    rows = list(csv.DictReader(open(csv_path)))
    assert [int(row["epoch"]) for row in rows] == [0, 1, 2]
    np.testing.assert_allclose([float(row["val_loss"]) for row in rows], [l["val_loss"] for l in recorder.logs],
                               rtol=1e-5)


def test_early_stopping_on_a_validation_metric_restores_the_best_weights(sc):
    # validation labels are the negated training labels: the better the fit, the worse val_loss after epoch 1
    dataset = TFDataset.from_ndarrays(data(), batch_size=16, val_tensors=data(32, seed=1, sign=-1.0))
    recorder = RecordEpochs()
    optimizer = TFOptimizer.from_keras(linear_model(), dataset)
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, restore_best_weights=True)
    history = optimizer.optimize(MaxEpoch(10), callbacks=[recorder, stop], verbose=0)
    val_losses = [logs["val_loss"] for logs in recorder.logs]
    assert len(val_losses) == 2 and val_losses[0] < val_losses[1]  # no improvement in epoch 2: stop
    assert history["epochs"] == 2 and optimizer.model.stop_training
    for restored, best in zip(optimizer.model.get_weights(), recorder.weights[0]):
        np.testing.assert_allclose(restored, best, atol=1e-7)


def test_reduce_lr_on_plateau_changes_the_rate_the_next_epoch_trains_with(sc, tmp_path):
    dataset = TFDataset.from_ndarrays(data(), batch_size=16)
    optimizer = TFOptimizer.from_keras(linear_model(0.05), dataset)
    optimizer.set_train_summary(TrainSummary(str(tmp_path), "lr"))
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=1e9)
    optimizer.optimize(MaxEpoch(3), callbacks=[plateau], verbose=0)
    rates = optimizer.train_summary.read_scalar("LearningRate")
    per_epoch = [sorted(set(np.round(rates[rates[:, 0] // 4.01 == e, 1], 6))) for e in range(3)]
    # the first epoch sets the best loss; every later one is "no improvement" and halves the rate
    assert per_epoch == [[0.05], [0.05], [0.025]]
    np.testing.assert_allclose(float(optimizer.model.optimizer.learning_rate), 0.0125, rtol=1e-6)


def test_progress_is_shown_per_epoch_and_verbose_0_is_silent(sc, capsys, caplog):
    caplog.set_level(logging.INFO, logger="sparktf.optimizer")
    assert default_verbose() == 2  # pytest's captured stdout is not a terminal
    dataset = TFDataset.from_ndarrays(data(), batch_size=16)
    optimizer = TFOptimizer.from_keras(linear_model(), dataset)
    optimizer.optimize(MaxEpoch(2), verbose=2)  # no callbacks: one segment spans both epochs
    # a straggler's line is the progress output's too, on a loaded machine: not what this test is about
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip() and
             not line.startswith("straggler: ")]
    assert lines[0] == "Epoch 1/2" and lines[2] == "Epoch 2/2"
    assert all("loss:" in line for line in (lines[1], lines[3])) and len(lines) == 4
    assert len(optimizer.history.history["loss"]) == 2
    assert "epoch 2: loss=" in caplog.text  # also logged on the sparktf.optimizer logger
    optimizer.optimize(MaxEpoch(4), verbose=1)
    shown = capsys.readouterr().out
    assert "Epoch 3/4" in shown and "Epoch 4/4" in shown and "4/4" in shown and "loss" in shown
    optimizer.optimize(MaxEpoch(5), verbose=0)
    assert capsys.readouterr().out == ""


def driver_display(verbose, history=None):
    """DriverCallbacks of a 2-epoch run (4 iterations each, 16 records per iteration), no Spark."""
    history = history or keras.callbacks.History()
    display = DriverCallbacks([], linear_model(), verbose=verbose, iterations_per_epoch=4, global_batch=16,
                              epochs=2, history=history)
    display.train_begin()
    display.segment_begins(TrainingProgress(0, 4))
    return display


def test_epochs_drawn_after_the_fact_show_their_measured_step_time(capsys):
    display = driver_display(verbose=2)
    display.segment_ends(1, [1.0] * 8, [0.25] * 8, TrainingProgress(8, 4, 1.0), None)  # one segment, two epochs
    display.train_end()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert [line for line in lines if line.startswith("Epoch")] == ["Epoch 1/2", "Epoch 2/2"]
    shown = [float(ms) for ms in re.findall(r"(\d+)ms/step", "\n".join(lines))]
    assert len(shown) == 2 and all(240 <= ms <= 300 for ms in shown), lines  # 0.25 s steps, not ~0 us


def live(iteration, *batches):
    """Rank 0's report at ``iteration`` carrying ``(iteration, loss, mae)`` of the iterations since its last one."""
    return {0: RankReport("train", iteration, 0.0, 1.0, ("loss", "mae"),
                          tuple((i, (loss, mae)) for i, loss, mae in batches))}


def test_every_iteration_reaches_on_train_batch_end_once_in_order_live_or_from_the_records():
    recorder = RecordEpochs()
    display = DriverCallbacks([recorder], linear_model(), verbose=0, iterations_per_epoch=4, global_batch=16,
                              epochs=3, history=keras.callbacks.History())
    display.train_begin()
    display.segment_begins(TrainingProgress(0, 4))
    display.report(live(2, (1, 9.0, 0.5), (2, 2.0, 0.4)))  # delivered live, in order
    assert [hook for hook in recorder.hooks if hook.startswith("batch")] == ["batch 0", "batch 1"]
    display.report(live(6, (5, 5.0, 0.3)))  # after a gap (3-4 were lost): comes with the records, in order
    display.report(live(6))  # a report without new iterations
    records = {"mae": [0.5, 0.4, 0.35, 0.3, 0.2, 0.25]}
    display.segment_ends(1, [9.0, 2.0, 3.0, 4.0, 5.0, 6.0], [0.01] * 6, TrainingProgress(6, 4, 6.0), None,
                         metrics=records)
    display.segment_begins(TrainingProgress(6, 4, 6.0))  # a second segment, without validation
    display.report(live(8, (7, 7.0, 0.1), (8, 8.0, 0.15)))
    display.segment_ends(7, [7.0, 8.0, 1.0, 1.0, 1.0, 1.0], [0.01] * 6, TrainingProgress(12, 4, 1.0), None)
    display.train_end()
    batches = [hook for hook in recorder.hooks if hook.startswith("batch")]
    assert batches == [f"batch {i % 4}" for i in range(12)]
    assert [logs["loss"] for logs in recorder.batches][:8] == [9.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert [logs["mae"] for logs in recorder.batches[:8]] == [0.5, 0.4, 0.35, 0.3, 0.2, 0.25, 0.1, 0.15]
    assert recorder.logs[0] == {"loss": 4.5, "mae": 0.3}  # the metric at the epoch's last iteration
    assert recorder.hooks.index("epoch_end 0") == recorder.hooks.index("epoch_begin 1") - 1
    assert recorder.hooks[recorder.hooks.index("epoch_end 0") - 1] == "batch 3"


def test_verbose_1_shows_each_epoch_once_when_the_live_display_ran_ahead(capsys):
    history = keras.callbacks.History()
    display = driver_display(verbose=1, history=history)
    display.report({0: RankReport("train", 6, 0.0, 2.0)})  # rank 0 is in epoch 2 when it first reports
    display.segment_ends(1, [3.0] * 4 + [1.0] * 4, [0.01] * 8, TrainingProgress(8, 4, 1.0), {"loss": 0.5})
    display.train_end()
    shown = capsys.readouterr().out
    assert shown.count("Epoch 1/2") == 1 and shown.count("Epoch 2/2") == 1, shown
    assert "val_loss: 0.5" in shown
    assert history.history["loss"] == [3.0, 1.0] and history.history["val_loss"] == [0.5]


def test_an_elastic_call_shows_worker_changes_and_logs_the_fewest_workers_of_each_epoch(capsys):
    history = keras.callbacks.History()
    display = DriverCallbacks([], linear_model(), verbose=2, iterations_per_epoch=4, global_batch=16,
                              epochs=3, history=history, num_workers=3)
    display.train_begin()
    display.segment_begins(TrainingProgress(0, 4))
    display.launching(3, 0)
    display.segment_ends(1, [3.0] * 4, [0.01] * 4, TrainingProgress(4, 4, 3.0), None, workers=3)
    display.segment_begins(TrainingProgress(4, 4, 3.0))
    display.launching(3, 4)
    display.launching(2, 4)  # the launch failed: relaunched on fewer
    display.segment_ends(5, [2.0] * 2, [0.01] * 2, TrainingProgress(6, 4, 2.0), None, workers=2)
    display.segment_begins(TrainingProgress(6, 4, 2.0))
    display.launching(3, 6)  # grown back within the epoch
    display.segment_ends(7, [1.0] * 6, [0.01] * 6, TrainingProgress(12, 4, 1.0), None, workers=3)
    display.train_end()
    shown = capsys.readouterr().out
    assert "continuing on 2 of 3 workers from iteration 5" in shown
    assert "continuing on 3 of 3 workers from iteration 7" in shown
    assert shown.count("continuing on") == 2
    assert history.history["workers"] == [3, 2, 3]


def test_a_call_that_is_not_elastic_logs_no_workers(capsys):
    history = keras.callbacks.History()
    display = driver_display(verbose=2, history=history)
    display.launching(2, 0)
    display.segment_ends(1, [1.0] * 8, [0.01] * 8, TrainingProgress(8, 4, 1.0), None, workers=2)
    display.train_end()
    assert "workers" not in history.history and "continuing" not in capsys.readouterr().out


class WaitForALiveCall(keras.layers.Layer):
    """Drops the last feature, a marker: a training batch holding a marked record waits for ``flag``.

    The driver's ``on_train_batch_end`` creates ``flag``, so the epoch of the marked batch cannot end
    before a call came live. The wait gives up after ``limit`` seconds and says so in ``flag + ".late"``.
    """

    def __init__(self, flag, limit=30.0, **kwargs):
        super().__init__(**kwargs)
        self.flag, self.limit = flag, limit

    def call(self, inputs, training=None):
        if not training:
            return inputs[:, :-1]

        def wait(values):
            if values.numpy()[:, -1].max() > 0:
                deadline = time.monotonic() + self.limit
                while not os.path.exists(self.flag):
                    if time.monotonic() > deadline:
                        open(self.flag + ".late", "w").close()
                        break
                    time.sleep(0.01)  # polls the condition; the assertions never rely on timing
                if not os.path.exists(self.flag + ".released"):  # the first epoch's
                    open(self.flag + ".released", "w").write(repr(time.time()))
            return values

        waited = tf.py_function(wait, [inputs], tf.float32)
        waited.set_shape(inputs.shape)
        return waited[:, :-1]

    def get_config(self):
        return {**super().get_config(), "flag": self.flag, "limit": self.limit}


class TimeBatches(RecordEpochs):
    """Records the wall time of every call and creates ``flag`` at the first ``on_train_batch_end``."""

    def __init__(self, flag):
        super().__init__()
        self.flag, self.batch_times, self.epoch_times = flag, [], []

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        self.batch_times.append(time.time())
        open(self.flag, "a").close()

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        self.epoch_times.append(time.time())


def test_on_train_batch_end_arrives_live_while_the_epoch_runs_once_and_in_order(sc, tmp_path):
    flag = str(tmp_path / "first-batch-call")
    x, y = data(128)
    marked = np.c_[x, np.zeros(len(x), np.float32)]
    marked[-1, -1] = 1.0  # rank 1's last record: the epoch's last iteration waits for a live call
    dataset = TFDataset.from_ndarrays((marked, y), batch_size=16, shuffle=False, sequential_order=True,
                                      num_partitions=1)
    model = keras.Sequential([keras.Input((4,)), WaitForALiveCall(flag), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    recorder = TimeBatches(flag)
    history = TFOptimizer.from_keras(model, dataset, num_workers=2).optimize(MaxEpoch(2), callbacks=[recorder],
                                                                             verbose=0)
    assert not os.path.exists(flag + ".late")  # the marked batch was released by a live call
    released = float(open(flag + ".released").read())
    first, epoch_end = recorder.batch_times[0], recorder.epoch_times[0]
    assert first < released < epoch_end  # the first call came while epoch 1's last iteration waited
    every_batch = [f"batch {b}" for b in range(8)]
    assert recorder.hooks == ["train_begin"] + [
        hook for i in range(2) for hook in (f"epoch_begin {i}", *every_batch, f"epoch_end {i}")] + ["train_end"]
    assert [logs["loss"] for logs in recorder.batches] == history["loss"]  # live values are the records' own
    assert [logs["mae"] for logs in recorder.batches[7::8]] == [logs["mae"] for logs in recorder.logs]
