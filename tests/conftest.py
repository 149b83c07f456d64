"""Shared fixtures: one real local[2] SparkSession for the whole test session."""

import contextlib
import os
import sys
import threading

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Every JVM the tests start (sessions, executors, a standalone master and workers) lives seconds to
# minutes and moves little data: the C2 JIT compiler and G1's threads were a third of their CPU time
# (test_context: 65 -> 44 CPU-s with these). The suite is CPU-bound on 2 cores. They also share one archive
# of Spark's classes (see jvm_class_archive; dumped by make test's install step, or else by the first run;
# inherited by pytest-xdist's workers).
if "JAVA_TOOL_OPTIONS" not in os.environ:
    from jvm_class_archive import TEST_JVM_OPTIONS, java_tool_options

    os.environ["JAVA_TOOL_OPTIONS"] = java_tool_options(TEST_JVM_OPTIONS)

SPARK_TEST_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "2",
    "spark.python.worker.reuse": "true",
    # workers fork from a daemon that loaded TensorFlow: each replaced worker saves its ~2-3 CPU-s import
    # (the sessions that tests start in processes of their own keep PySpark's stock daemon)
    "spark.python.daemon.module": "sparktf.spark.tf_daemon",
    "spark.driver.memory": "2g",
    # a call that leaked its slots (a bug) fails the tests after it with the planner's message, not pytest's timeout
    "spark.sparktf.slotWait": "240",
}


_SESSION = []  # the shared session, once a test has started it
SESSION_FIXTURES = {"spark", "sc"}
# files whose tests run Spark in processes of their own (the others may use the shared session implicitly)
OWN_SPARK_FILES = {"test_connect.py", "test_context.py", "test_elastic.py", "test_gpus.py", "test_notebook.py", "test_seed_scale.py",
                   "test_standalone_cluster.py", "test_storage_programs.py"}
KEEP_ALIVE_SECONDS = 20


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession of the test session (``local[2]``)."""
    import sparktf

    session = sparktf.init_spark("local[2]", app_name="sparktf-tests", conf=SPARK_TEST_CONF)
    session.sparkContext.setLogLevel("ERROR")
    _SESSION.append(session)
    yield session
    _SESSION.clear()
    session.stop()


@pytest.fixture(scope="session")
def sc(spark):
    """The SparkContext of the shared session."""
    return spark.sparkContext


@pytest.fixture(scope="module")
def s3_server():
    """The URL of a local S3 server (moto's server mode on 127.0.0.1; in-memory buckets)."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


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
    "test_connect.py", "test_elastic.py", "test_examples.py", "test_optimizer_failures.py", "test_keras_hub.py",
    "test_seed_scale.py",
    "test_gpus.py",
    "test_context.py", "test_storage_programs.py", "test_predictor.py", "test_standalone_cluster.py",
    "test_optimizer.py", "test_notebook.py", "test_ml_pipeline.py",
)
# Files that mostly wait (executors killed and given back, servers starting, watchdogs, timeouts) left
# 15-40 % of both cores idle beside other files. Two of them side by side, or one beside small tests, left
# the cores a quarter to a third idle for minutes. Beside a waiting file, the files that keep both cores busy
# by themselves (two training workers and a driver, all computing) left 0-15 % idle: xdist_pairing runs each
# waiting file beside a busy one where the queue allows (make test: 9:32-9:50 before, 8:31-8:57 after).
WAITING_FILES = (
    "test_connect.py", "test_elastic.py", "test_optimizer_failures.py", "test_generation.py", "test_launch_run.py",
    "test_step_anatomy.py", "test_storage.py",
)
BUSY_FILES = (
    "test_keras_hub.py", "test_seed_scale.py", "test_storage_programs.py", "test_sharded_tables.py",
    "test_sparse_gradients.py", "test_standalone_cluster.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` that runs ``WAITING_FILES`` beside ``BUSY_FILES`` (see ``xdist_pairing``)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist_pairing import WaitingBesideBusy

    return WaitingBesideBusy(config, log, WAITING_FILES, BUSY_FILES)


def pytest_collection_modifyitems(items):
    """Run the files of ``LONG_FILES_FIRST`` first, in that order (a stable sort: tests keep their order)."""
    rank = {name: index for index, name in enumerate(LONG_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Keep the shared session's Python workers while a test runs Spark processes of its own.

    Spark ends all idle Python workers of a session that ran no Python task
    for a minute; the next test would then import TensorFlow again in fresh
    ones (~4 s each). The tests of ``OWN_SPARK_FILES`` that do not use the
    shared session (local-cluster, standalone, example programs) often take
    longer than that.
    """
    if not _SESSION or item.path.name not in OWN_SPARK_FILES or SESSION_FIXTURES & set(item.fixturenames):
        return (yield)
    with _python_workers_kept(_SESSION[0].sparkContext):
        return (yield)


@contextlib.contextmanager
def _python_workers_kept(sc):
    """Run a one-task Python job every ``KEEP_ALIVE_SECONDS`` in the background until the block ends."""
    stop = threading.Event()

    def touch():
        while not stop.wait(KEEP_ALIVE_SECONDS):
            sc.parallelize([0], 1).foreach(lambda _: None)

    thread = threading.Thread(target=touch, name="keep-python-workers", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=60)
