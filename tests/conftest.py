"""Shared fixtures: one real local[2] SparkSession for the whole test session."""

import os
import sys

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SPARK_TEST_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "2",
    "spark.python.worker.reuse": "true",
    "spark.driver.memory": "2g",
}


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession of the test session (``local[2]``)."""
    import sparktf

    session = sparktf.init_spark("local[2]", app_name="sparktf-tests", conf=SPARK_TEST_CONF)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def sc(spark):
    """The SparkContext of the shared session."""
    return spark.sparkContext


def save_module_with_two_signatures(module, method, directory):
    """Save a ``tf.Module`` with ``method`` as both "serving_default" and "other"; return the path."""
    import tensorflow as tf

    path = str(directory)
    tf.saved_model.save(module, path, signatures={"serving_default": method, "other": method})
    return path
