"""run_job: executor failures reach the driver as readable sparktf errors."""

import pytest

from sparktf.errors import DataError, SparkTFError
from sparktf.spark import remote_errors
from sparktf.spark.jobs import run_job, worker_traceback
from sparktf.spark.remote_errors import reporting_failures
from sparktf.spark.sessions import session_kind


def test_a_plain_worker_exception_carries_the_worker_traceback(spark, sc):
    def _fail_with_value_error(_):
        raise ValueError("boom from record 42")

    rdd = sc.parallelize(range(2), 2).map(_fail_with_value_error)
    with pytest.raises(SparkTFError) as info:
        run_job(session_kind(spark), rdd.collect, what="the probe job")
    message = str(info.value)
    assert message.startswith("the probe job failed on an executor")
    assert "ValueError: boom from record 42" in message
    assert "_fail_with_value_error" in message
    assert "at org.apache" not in message
    assert type(info.value) is SparkTFError


def test_a_reported_sparktf_error_comes_back_as_itself_without_reading_sparks_text(spark, sc, monkeypatch):
    def _fail_with_data_error(partition, records):
        from sparktf.errors import DataError

        raise DataError(f"partition {partition}, record 3: expected shape [2], got [3]")

    def unreadable(error):
        raise AssertionError("the driver read Spark's text of the task failure")

    monkeypatch.setattr(remote_errors, "_error_in_text", unreadable)
    kind = session_kind(spark)
    rdd = sc.parallelize(range(2), 2).mapPartitionsWithIndex(reporting_failures(kind, _fail_with_data_error))
    with pytest.raises(DataError, match=r"partition [01], record 3: expected shape \[2\], got \[3\]") as info:
        run_job(kind, rdd.collect)
    assert type(info.value) is DataError
    # the same error raised by a function that does not report it is Spark's task failure, shown, not classified
    unreported = sc.parallelize(range(2), 2).mapPartitionsWithIndex(_fail_with_data_error)
    with pytest.raises(SparkTFError, match="sparktf.errors.DataError: partition") as info:
        run_job(kind, unreported.collect)
    assert type(info.value) is SparkTFError


def test_results_and_driver_side_errors_pass_through(spark, sc):
    kind = session_kind(spark)
    assert run_job(kind, sc.parallelize(range(4), 2).sum) == 6
    with pytest.raises(KeyError):
        run_job(kind, lambda: {}["missing"])
    assert worker_traceback(RuntimeError("no trace here")) is None
