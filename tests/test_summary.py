"""TensorBoard summaries: written event files read back with read_scalar."""

import glob
import os

import numpy as np
import tensorflow as tf
from tensorflow.core.util import event_pb2

from sparktf.summary import TrainSummary, ValidationSummary
from sparktf.triggers import SeveralIteration, TrainingProgress


def progress(iteration):
    return TrainingProgress(iteration, 10, 0.0)


def test_train_summary_writes_and_reads_scalars(tmp_path):
    summary = TrainSummary(str(tmp_path), "app")
    for iteration in range(1, 6):
        summary.add_scalar("Loss", 1.0 / iteration, progress(iteration), wall_time=1000.0 + iteration)
        summary.add_scalar("LearningRate", 0.1, progress(iteration))
    loss = summary.read_scalar("Loss")
    assert loss.shape == (5, 3)
    np.testing.assert_array_equal(loss[:, 0], [1, 2, 3, 4, 5])
    np.testing.assert_allclose(loss[:, 1], 1.0 / np.arange(1, 6), rtol=1e-6)
    np.testing.assert_array_equal(loss[:, 2], 1000.0 + np.arange(1, 6))
    assert summary.read_scalar("LearningRate").shape == (5, 3)
    assert summary.read_scalar("Throughput").shape == (0, 3)
    assert os.path.isdir(tmp_path / "app" / "train")


def test_event_files_are_tensorboard_events(tmp_path):
    summary = ValidationSummary(str(tmp_path), "app")
    summary.add_scalar("Loss", 0.5, progress(3))
    summary.close()
    (path,) = glob.glob(str(tmp_path / "app" / "validation" / "events.out.tfevents.*"))
    events = [event_pb2.Event.FromString(r) for r in tf.data.TFRecordDataset(path).as_numpy_iterator()]
    assert events[0].file_version == "brain.Event:2"
    assert events[1].step == 3 and events[1].summary.value[0].tag == "Loss"


def test_summary_trigger_filters_a_tag(tmp_path):
    summary = TrainSummary(str(tmp_path), "app").set_summary_trigger("Loss", SeveralIteration(2))
    for iteration in range(1, 7):
        summary.add_scalar("Loss", iteration, progress(iteration))
        summary.add_scalar("Throughput", iteration, progress(iteration))
    np.testing.assert_array_equal(summary.read_scalar("Loss")[:, 0], [2, 4, 6])
    assert len(summary.read_scalar("Throughput")) == 6


def test_reopened_summary_appends_a_new_file(tmp_path):
    first = TrainSummary(str(tmp_path), "app")
    first.add_scalar("Loss", 1.0, progress(1))
    first.close()
    second = TrainSummary(str(tmp_path), "app")
    second.add_scalar("Loss", 2.0, progress(2))
    np.testing.assert_array_equal(second.read_scalar("Loss")[:, :2], [[1, 1.0], [2, 2.0]])


def test_train_summary_writes_the_workers_of_every_iteration(tmp_path):
    summary = TrainSummary(str(tmp_path), "app")
    columns = ([0.5, 0.4], [0.1, 0.1], [1000.0, 1001.0], [0.2, 0.25])
    summary.add_iterations(7, 4, 64, None, columns, workers=2)
    summary.add_iterations(9, 4, 64, None, ([0.3], [0.1], [1002.0], [0.2]), workers=3)
    workers = summary.read_scalar("Workers")
    np.testing.assert_array_equal(workers[:, :2], [[7, 2], [8, 2], [9, 3]])
    np.testing.assert_allclose(summary.read_scalar("Throughput")[:, 1], [320, 256, 320])
