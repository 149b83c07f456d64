"""remote_errors and the failure inbox: a plain Spark task's sparktf error reaches the driver as its record."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from sparktf.collective.failure_inbox import FailureInbox, InboxAddress, new_key, send_failure
from sparktf.dataset import TFDataset
from sparktf.errors import DataError, FailureRecord, StorageError, WorkerTraceback
from sparktf.predictor import TFPredictor
from sparktf.spark import remote_errors
from sparktf.spark.remote_errors import ActionFailures

SPARK_TEXT = (
    "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
    "Traceback (most recent call last):\n  File \"worker.py\", line 1, in main\n"
    "ValueError: inner cause\n\nDuring handling of the above exception, another exception occurred:\n"
    "sparktf.errors.DataError: partition 1, record 2: features has shape [3], expected [2].\n"
    " SQLSTATE: 38000\n\tat org.apache.spark.api.python.BasePythonRunner\n"
)


def test_the_inbox_keeps_a_tasks_record_under_each_action_key_and_hands_it_over_once():
    record = FailureRecord.of(StorageError("the store refused the read", path="s3://bucket/x", route="fsspec",
                                           transient=True), shard=3)
    first, nested = new_key(), new_key()
    with FailureInbox("127.0.0.1") as inbox:
        assert send_failure(inbox.for_tasks, [first, nested], record)
        assert send_failure(inbox.for_tasks, [first], FailureRecord.of(DataError("a later failure")))
        assert inbox.take(first) == record  # an action's first failure is its cause
        assert inbox.take(first) is None
        error = inbox.take(nested).to_error()
    assert type(error) is StorageError and (error.path, error.route, error.transient) == ("s3://bucket/x", "fsspec", True)
    assert "secret" not in repr(inbox.for_tasks)


def test_the_inbox_keeps_nothing_from_a_client_without_the_secret_or_with_other_keys():
    record = FailureRecord.of(DataError("forged"))
    key = new_key()
    with FailureInbox("127.0.0.1") as inbox:
        assert not send_failure(InboxAddress(inbox.address, b"w" * 32), [key], record, timeout=5)
        assert not send_failure(inbox.for_tasks, ["not-an-action-key"], record, timeout=5)
        assert inbox.take(key) is None
        assert send_failure(inbox.for_tasks, [key], record)  # the inbox still serves
    assert not send_failure(inbox.for_tasks, [key], record, timeout=5)  # closed: refused at once, never waits


@pytest.fixture
def sparks_text_unread(monkeypatch):
    def unread(error):
        raise AssertionError("the driver read Spark's text of the task failure")

    monkeypatch.setattr(remote_errors, "_error_in_text", unread)


def test_a_bad_record_fails_the_count_and_the_prediction_as_its_record(sc, sparks_text_unread):
    rdd = sc.parallelize([(np.zeros(2), 1)] * 5 + [(np.zeros(3), 1)], 2)
    dataset = TFDataset.from_rdd(rdd, (tf.float32, [2]), (tf.int32, []))
    with pytest.raises(DataError, match=r"partition 1, record 2 .*features has shape \[3\], expected \[2\]") as raised:
        dataset.num_records
    # the one cause: the traceback of the task that read the record, not Spark's error chained to Py4J's
    assert isinstance(raised.value.__cause__, WorkerTraceback) and raised.value.__suppress_context__
    assert "DataError: partition 1, record 2" in str(raised.value.__cause__) and raised.value.__cause__.__cause__ is None
    features = TFDataset.from_rdd(rdd.map(lambda record: record[0]), (tf.float32, [2]), batch_per_thread=4)
    predictor = TFPredictor.from_keras(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]), features)
    with pytest.raises(DataError, match=r"partition 1, record 2 .*features has shape \[3\], expected \[2\]"):
        predictor.predict().collect()


def test_without_an_inbox_the_record_travels_in_sparks_text_whole(sc):
    """``spark.sparktf.rendezvous=barrier``: the executors cannot reach the driver, Spark's text is all there is.
    The task raises a carrier of the record from its error: class, fields and a message of several lines arrive."""
    message = "the store broke off reading part-00001\n  after 3 retries: connection reset"

    def failing(index, rows):
        if index == 1:
            raise StorageError(message, path="s3://bucket/part-00001", route="fsspec", retries=3, transient=True)
        yield from rows

    with pytest.raises(Exception) as failed:  # Spark's own error, as the driver gets it
        sc.parallelize(range(4), 2).mapPartitionsWithIndex(remote_errors._ReportingFailures(failing, None)).collect()
    error = ActionFailures(None, new_key()).error_of(failed.value)
    assert type(error) is StorageError and str(error) == message
    assert isinstance(error.__cause__, WorkerTraceback) and "in failing" in str(error.__cause__)  # the task's own
    assert (error.path, error.route, error.retries, error.transient) == ("s3://bucket/part-00001", "fsspec", 3, True)
    assert FailureRecord.of(error).relaunch_helps  # a store that broke off: training relaunches
    assert ActionFailures(None, new_key()).error_of(RuntimeError(SPARK_TEXT)) is None  # only a record counts
    assert ActionFailures(None, new_key()).error_of(RuntimeError("sparktf-failure-record: {\"kind\": 1}")) is None
