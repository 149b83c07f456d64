"""remote_errors: executor-side sparktf errors come back to the driver as themselves."""

import pytest

from sparktf.errors import CollectiveError, DataError
from sparktf.spark.remote_errors import remote_sparktf_error, reraise_remote

SPARK_TEXT = (
    "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
    "Traceback (most recent call last):\n  File \"worker.py\", line 1, in main\n"
    "ValueError: inner cause\n\nDuring handling of the above exception, another exception occurred:\n"
    "sparktf.errors.DataError: partition 1, record 2: features has shape [3], expected [2].\n"
    " SQLSTATE: 38000\n\tat org.apache.spark.api.python.BasePythonRunner\n"
)


def test_the_last_reported_sparktf_error_is_rebuilt():
    error = remote_sparktf_error(RuntimeError(SPARK_TEXT))
    assert type(error) is DataError
    assert str(error) == "partition 1, record 2: features has shape [3], expected [2]."
    assert remote_sparktf_error(RuntimeError("sparktf.errors.NotAnError: x")) is None
    assert type(remote_sparktf_error(RuntimeError("sparktf.errors.CollectiveError: rank 1 gone"))) is CollectiveError


def test_reraise_remote_translates_and_chains():
    with pytest.raises(DataError, match="features has shape") as info:
        with reraise_remote():
            raise RuntimeError(SPARK_TEXT)
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(KeyError):
        with reraise_remote():
            raise KeyError("unrelated")
