"""Creating the SparkSession sparktf runs on, with executors that can run it."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import sys
import tempfile
import zipfile
from typing import Mapping, Optional

from pyspark import SparkContext
from pyspark.sql import SparkSession

__all__ = ["init_spark", "ship_package"]

_SHIPPED_ATTR = "_sparktf_shipped_zip"


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
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    active = SparkSession.getActiveSession()
    if master is None:
        master = os.environ.get("MASTER") or os.environ.get("SPARK_MASTER")
    if active is not None and master is None:
        session = active
    else:
        builder = SparkSession.builder.appName(app_name).master(master or "local[*]")
        builder = builder.config("spark.sql.execution.arrow.pyspark.enabled", "true")
        for key, value in (conf or {}).items():
            builder = builder.config(key, str(value))
        session = builder.getOrCreate()
    ship_package(session.sparkContext)
    return session


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
