"""Creating the SparkSession sparktf runs on, with executors that can run it."""

from __future__ import annotations

import atexit
import functools
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import zipfile
from typing import Iterable, Iterator, Mapping, Optional

from pyspark import SparkContext
from pyspark.sql import SparkSession

__all__ = ["init_spark", "ship_package", "warm_up_workers"]

_SHIPPED_ATTR = "_sparktf_shipped_zip"
WARM_UP_CONF = "spark.sparktf.warmUpWorkers"
WARM_UP_SECONDS = 120.0
_LOG = logging.getLogger("sparktf")


def init_spark(
    master: Optional[str] = None,
    app_name: str = "sparktf",
    conf: Optional[Mapping[str, str]] = None,
) -> SparkSession:
    """Return a SparkSession whose executors can run sparktf and TensorFlow.

    Parameters
    ----------
    master : str, optional
        Spark master URL. ``None`` means the ``MASTER`` or ``SPARK_MASTER``
        environment variable if set, else the already active session, else
        embedded ``local[*]``.
    app_name : str
        Application name of a new session.
    conf : mapping, optional
        Extra Spark configuration for a new session.

    Returns
    -------
    pyspark.sql.SparkSession
        The session; calling ``init_spark`` again returns the same one.

    Notes
    -----
    ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` are set to the running
    interpreter when unset, so executors use the same environment (otherwise a
    fresh virtualenv fails on the executors with "No module named
    tensorflow"). The ``sparktf`` package itself is zipped and added to the
    executors' path, so they need not have it installed.

    When this call creates the SparkContext, a background job imports
    TensorFlow in one Python worker per task slot (~4 s each), so that the
    first training or inference job reuses warm workers instead of paying
    for the import while you build the model. Set
    ``spark.sparktf.warmUpWorkers=false`` to skip it. Spark stops Python
    workers that stay idle for a minute, so the benefit lasts about that long.

    When this call starts the driver JVM itself (no session yet, not under
    ``spark-submit``) and neither ``conf`` nor ``SPARK_DRIVER_MEMORY`` sets
    ``spark.driver.memory``, it is set to a quarter of the machine's memory,
    between 2g and 8g, instead of Spark's 1g (logged once on the ``sparktf``
    logger). Under ``spark-submit`` pass ``--driver-memory`` yourself.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    active = SparkSession.getActiveSession()
    if master is None:
        master = os.environ.get("MASTER") or os.environ.get("SPARK_MASTER")
    created = False
    if active is not None and master is None:
        session = active
    else:
        builder = SparkSession.builder.appName(app_name).master(master or "local[*]")
        builder = builder.config("spark.sql.execution.arrow.pyspark.enabled", "true")
        if "spark.ui.showConsoleProgress" not in (conf or {}):  # sparktf shows its own progress
            builder = builder.config("spark.ui.showConsoleProgress", "false")
        memory = _default_driver_memory(conf or {})
        if memory is not None:
            builder = builder.config("spark.driver.memory", memory)
        for key, value in (conf or {}).items():
            builder = builder.config(key, str(value))
        created = SparkContext._active_spark_context is None
        session = builder.getOrCreate()
    ship_package(session.sparkContext)
    if created:
        warm_up_workers(session.sparkContext)
    return session


def warm_up_workers(sc: SparkContext) -> Optional[threading.Thread]:
    """Import TensorFlow in one Python worker per task slot, in a background job; return its thread.

    Does nothing (returns None) when ``spark.sparktf.warmUpWorkers`` is
    ``false``. The job is cancelled after ``WARM_UP_SECONDS``; its failure
    (e.g. the session stopped meanwhile) is only logged.
    """
    if sc.getConf().get(WARM_UP_CONF, "true").strip().lower() == "false":
        return None
    thread = threading.Thread(target=_warm_up, args=(sc,), name="sparktf-warm-up", daemon=True)
    thread.start()
    return thread


def _warm_up(sc: SparkContext) -> None:
    tag = f"sparktf-warm-up-{os.getpid()}-{id(sc)}"
    slots = max(1, sc.defaultParallelism)
    timer = threading.Timer(WARM_UP_SECONDS, _cancel_warm_up, (sc, tag))
    timer.daemon = True
    try:
        sc.addJobTag(tag)  # this thread's jobs only
        sc.setJobDescription("sparktf: warming up Python workers (imports TensorFlow)")
        timer.start()
        started = time.monotonic()
        warmed = sc.parallelize(range(slots), slots).mapPartitions(_import_tensorflow).collect()
        _LOG.debug("warmed %d Python worker(s) in %.1f s (%d with TensorFlow)", len(warmed),
                   time.monotonic() - started, sum(warmed))
    except Exception as error:  # best effort: the user's jobs start workers themselves
        _LOG.debug("warming up the Python workers failed: %s", error)
    finally:
        timer.cancel()


def _cancel_warm_up(sc: SparkContext, tag: str) -> None:
    try:
        sc.cancelJobsWithTag(tag)
    except Exception as error:  # the session is gone
        _LOG.debug("cancelling the warm-up job failed: %s", error)


def _import_tensorflow(_: Iterable[int]) -> Iterator[bool]:
    """A warm-up task: import TensorFlow and Keras in this Python worker (True if they are installed)."""
    try:
        import keras  # noqa: F401
        import tensorflow  # noqa: F401
    except ImportError:
        yield False
        return
    yield True


def _default_driver_memory(conf: Mapping[str, str]) -> Optional[str]:
    """The ``spark.driver.memory`` to give a JVM this process starts, or None to leave Spark's choice.

    None when a JVM is running already (a session, or ``spark-submit``'s
    gateway) or the user chose a value.
    """
    if SparkContext._active_spark_context is not None or os.environ.get("PYSPARK_GATEWAY_PORT"):
        return None
    if "spark.driver.memory" in conf or os.environ.get("SPARK_DRIVER_MEMORY"):
        return None
    if "spark.driver.memory" in os.environ.get("PYSPARK_SUBMIT_ARGS", "") or "--driver-memory" in os.environ.get(
        "PYSPARK_SUBMIT_ARGS", ""
    ):
        return None
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: keep Spark's default
        return None
    megabytes = min(max(physical // 4 >> 20, 2048), 8192)
    _LOG.info("sparktf starts the driver JVM with spark.driver.memory=%dm (a quarter of this machine's "
              "memory, 2g-8g; set spark.driver.memory to choose)", megabytes)
    return f"{megabytes}m"


def ship_package(sc: SparkContext) -> str:
    """Add a zip of the ``sparktf`` package to the executors' Python path.

    Done once per SparkContext; returns the path of the zip. Its temporary
    folder is deleted when the SparkContext stops or the process exits.
    """
    shipped = getattr(sc, _SHIPPED_ATTR, None)
    if shipped:
        return shipped
    package_dir = os.path.dirname(os.path.abspath(__file__))
    out_dir = tempfile.mkdtemp(prefix="sparktf-pyfiles-")
    zip_path = os.path.join(out_dir, "sparktf.zip")
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as archive:
        for root, dirs, files in os.walk(package_dir):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if name.endswith(".py"):
                    full = os.path.join(root, name)
                    rel = os.path.relpath(full, os.path.dirname(package_dir))
                    archive.write(full, rel)
    sc.addPyFile(zip_path)
    setattr(sc, _SHIPPED_ATTR, zip_path)
    _remove_when_done(sc, out_dir)
    return zip_path


def _remove_when_done(sc: SparkContext, directory: str) -> None:
    """Delete ``directory`` when ``sc`` stops, or at the latest when the process exits."""
    remove = functools.partial(shutil.rmtree, directory, ignore_errors=True)
    atexit.register(remove)
    stop = sc.stop

    def stop_and_remove() -> None:
        try:
            stop()
        finally:
            remove()
            atexit.unregister(remove)

    sc.stop = stop_and_remove
