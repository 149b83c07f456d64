"""Creating the SparkSession sparktf runs on, with executors that can run it."""

from __future__ import annotations

import functools
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import zipfile
from typing import Iterable, Iterator, Mapping, Optional, Union

from pyspark import SparkContext
from pyspark.sql import SparkSession

from sparktf.spark.session_kind import SessionKind
from sparktf.spark.sessions import is_connect, session_kind
from sparktf.spark.interrupts import install_interrupt_handler
from sparktf.spark.session_state import at_stop, session_state

__all__ = ["init_spark", "ship_package", "warm_up_workers", "current_session", "spark_context", "reject_connect"]

WARM_UP_CONF = "spark.sparktf.warmUpWorkers"
WARM_UP_SECONDS = 120.0
_LOG = logging.getLogger("sparktf")


def init_spark(
    master: Optional[str] = None,
    app_name: str = "sparktf",
    conf: Optional[Mapping[str, str]] = None,
    remote: Optional[str] = None,
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
    remote : str, optional
        A Spark Connect address (``sc://host:port``, or ``local[N]`` for a
        Connect server this process starts): returns a Spark Connect session.
        ``None`` means the ``SPARK_REMOTE`` environment variable when set
        and neither ``master`` nor ``MASTER`` is.

    Returns
    -------
    pyspark.sql.SparkSession
        The session, classic or Spark Connect; calling ``init_spark`` again
        returns the same one.

    Notes
    -----
    ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` are set to the running
    interpreter when unset, so executors use the same environment (otherwise a
    fresh virtualenv fails on the executors with "No module named
    tensorflow"). The ``sparktf`` package itself is zipped and added to the
    executors' path (a session artifact under Spark Connect), so they need
    not have it installed.

    When this call creates the session, a background job imports
    TensorFlow in one Python worker per task slot (~4 s each), so that the
    first training or inference job reuses warm workers instead of paying
    for the import while you build the model. Set
    ``spark.sparktf.warmUpWorkers=false`` to skip it. Spark stops Python
    workers that stay idle for a minute, so the benefit lasts about that long.

    When this call starts the driver JVM itself (no session yet, not under
    ``spark-submit``, not Spark Connect) and neither ``conf`` nor
    ``SPARK_DRIVER_MEMORY`` sets ``spark.driver.memory``, it is set to a
    quarter of the machine's memory, between 2g and 8g, instead of Spark's
    1g (logged once on the ``sparktf`` logger). Under ``spark-submit`` pass
    ``--driver-memory`` yourself.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    active = SparkSession.getActiveSession()
    if master is None:
        master = os.environ.get("MASTER") or os.environ.get("SPARK_MASTER")
    if remote is None and master is None:
        remote = os.environ.get("SPARK_REMOTE") or None
    created = False
    if active is not None and master is None and (remote is None or is_connect(active)):
        session = active
    else:
        builder = SparkSession.builder.remote(remote) if remote else SparkSession.builder.master(master or "local[*]")
        builder = builder.appName(app_name).config("spark.sql.execution.arrow.pyspark.enabled", "true")
        if "spark.ui.showConsoleProgress" not in (conf or {}):  # sparktf shows its own progress
            builder = builder.config("spark.ui.showConsoleProgress", "false")
        memory = None if remote else _default_driver_memory(conf or {})
        if memory is not None:
            builder = builder.config("spark.driver.memory", memory)
        for key, value in (conf or {}).items():
            builder = builder.config(key, str(value))
        created = active is None if remote else SparkContext._active_spark_context is None
        session = builder.getOrCreate()
    kind = session_kind(session)
    install_interrupt_handler()  # Ctrl-C cancels the sparktf calls of every thread (spark/interrupts.py)
    ship_package(kind)
    if created:
        warm_up_workers(kind)
    return session


def current_session(session: Optional[SparkSession] = None) -> SessionKind:
    """The :class:`SessionKind` of ``session`` (default: sparktf's session, ``init_spark()``)."""
    return session_kind(session or init_spark())


def spark_context(what: str, alternative: str, session: Optional[SparkSession] = None) -> SparkContext:
    """The SparkContext of ``session`` (default: sparktf's session, ``init_spark()``), for ``what``, which needs RDDs.

    Raises
    ------
    SparkTFError
        In a Spark Connect session (before any job), naming ``what`` and
        ``alternative``.
    """
    return current_session(session).spark_context(what, alternative)


def reject_connect(what: str, alternative: str) -> None:
    """Raise ``SparkTFError`` naming ``what`` and ``alternative`` when the active session is Spark Connect.

    For entry points whose argument is an RDD (which a Connect client cannot
    have): the check costs nothing and starts no session.
    """
    active = SparkSession.getActiveSession()
    if active is not None and is_connect(active):
        session_kind(active).spark_context(what, alternative)


def warm_up_workers(kind: SessionKind) -> Optional[threading.Thread]:
    """Import TensorFlow in one Python worker per task slot, in a background job; return its thread.

    Does nothing (returns None) when ``spark.sparktf.warmUpWorkers`` is
    ``false``. The job is cancelled after ``WARM_UP_SECONDS``; its failure
    (e.g. the session stopped meanwhile) is only logged.
    """
    if kind.conf.get(WARM_UP_CONF, "true").strip().lower() == "false":
        return None
    thread = threading.Thread(target=_warm_up, args=(kind,), name="sparktf-warm-up", daemon=True)
    thread.start()
    return thread


def _warm_up(kind: SessionKind) -> None:
    tag = f"sparktf-warm-up-{os.getpid()}-{id(kind.holder)}"
    timer = threading.Timer(WARM_UP_SECONDS, _cancel_warm_up, (kind, tag))
    timer.daemon = True
    try:
        timer.start()
        started = time.monotonic()
        slots = max(1, kind.task_slots())
        warmed = kind.run_tasks(slots, _import_tensorflow, tag,
                                description="sparktf: warming up Python workers (imports TensorFlow)")
        _LOG.debug("warmed %d Python worker(s) in %.1f s (%d with TensorFlow)", len(warmed),
                   time.monotonic() - started, sum(1 for value in warmed if value == b"1"))
    except Exception as error:  # best effort: the user's jobs start workers themselves
        _LOG.debug("warming up the Python workers failed: %s", error)
    finally:
        timer.cancel()


def _cancel_warm_up(kind: SessionKind, tag: str) -> None:
    try:
        kind.cancel_tag(tag)
    except Exception as error:  # the session is gone
        _LOG.debug("cancelling the warm-up job failed: %s", error)


def _import_tensorflow(_: Iterable[int]) -> Iterator[bytes]:
    """A warm-up task: import TensorFlow and Keras in this Python worker (b"1" if they are installed)."""
    try:
        import keras  # noqa: F401
        import tensorflow  # noqa: F401
    except ImportError:
        yield b"0"
        return
    yield b"1"


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


def ship_package(session: Union[SparkSession, SessionKind]) -> str:
    """Add a zip of the ``sparktf`` package to the executors' Python path.

    Done once per session (per SparkContext in a classic one); returns the
    path of the zip. Its temporary folder is deleted when the session stops
    or the process exits.
    """
    kind = session if isinstance(session, SessionKind) else session_kind(session)
    state = session_state(kind)
    if state.shipped_package:
        return state.shipped_package
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
    kind.add_python_file(zip_path)
    state.shipped_package = zip_path
    at_stop(kind, functools.partial(shutil.rmtree, out_dir, ignore_errors=True))
    return zip_path
