"""run_job: executor failures reach the driver as readable sparktf errors."""

import pytest

from sparktf.errors import DataError, SparkTFError
from sparktf.spark.jobs import run_job, worker_traceback


def test_a_plain_worker_exception_carries_the_worker_traceback(sc):
    def _fail_with_value_error(_):
        raise ValueError("boom from record 42")

    rdd = sc.parallelize(range(2), 2).map(_fail_with_value_error)
    with pytest.raises(SparkTFError) as info:
        run_job(rdd.collect, what="the probe job")
    message = str(info.value)
    assert message.startswith("the probe job failed on an executor")
    assert "ValueError: boom from record 42" in message
    assert "_fail_with_value_error" in message
    assert "at org.apache" not in message
    assert type(info.value) is SparkTFError


def test_a_sparktf_error_comes_back_as_itself(sc):
    def _fail_with_data_error(_):
        from sparktf.errors import DataError

        raise DataError("partition 0, record 3: expected shape [2], got [3]")

    rdd = sc.parallelize(range(2), 2).map(_fail_with_data_error)
    with pytest.raises(DataError, match=r"partition 0, record 3: expected shape \[2\], got \[3\]"):
        run_job(rdd.collect)


def test_results_and_driver_side_errors_pass_through(sc):
    assert run_job(sc.parallelize(range(4), 2).sum) == 6
    with pytest.raises(KeyError):
        run_job(lambda: {}["missing"])
    assert worker_traceback(RuntimeError("no trace here")) is None
