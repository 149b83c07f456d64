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


# The longest test files first: `make test` runs two pytest-xdist processes that take one file at a
# time (--no-loadscope-reorder keeps this order; xdist's own puts the files with the most tests first,
# i.e. these few-test slow ones last), so the short files left at the end even out their finish: the
# two processes' test time differed by 50-66 s that way, by 12 s with this order.
LONG_FILES_FIRST = (
    "test_elastic.py", "test_optimizer_failures.py", "test_seed_scale.py", "test_examples.py", "test_gpus.py",
    "test_context.py", "test_predictor.py", "test_standalone_cluster.py", "test_optimizer.py", "test_notebook.py",
    "test_ml_pipeline.py",
)


def pytest_collection_modifyitems(items):
    """Run the files of ``LONG_FILES_FIRST`` first, in that order (a stable sort: tests keep their order)."""
    rank = {name: index for index, name in enumerate(LONG_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
