"""A PySpark worker daemon that loads TensorFlow and Keras once, before it forks Python workers.

PySpark starts each executor's Python workers by forking them from a daemon
process. The stock daemon holds no TensorFlow, so every new worker imports
it, 2-4 s of CPU each: on the first task, and again whenever a worker
is replaced (after a failed or cancelled task, or one idle for a minute).
This daemon imports TensorFlow and Keras once, without their start-up log
lines, freezes what the imports allocated out of the garbage collector's
reach (so forked workers share those pages instead of copying them), and
then runs PySpark's own daemon loop unchanged. Its workers start with
TensorFlow loaded and without a runtime: no devices listed, no threads of
TensorFlow's own started, so each task still binds its devices and threads.

Spark puts its ``pyspark.zip`` first on the workers' path, and Python
compiles a zipped module from source on every import (no ``.pyc`` is kept
for it): 0.5-0.9 CPU-s for each daemon. Where that zip is the one inside the
pip-installed ``pyspark`` that Python finds anyway (the same files), the
daemon imports that installed, compiled copy instead.

Use it where sparktf is installed on the executors (the daemon starts before
any file a session ships), with the session setting::

    spark.python.daemon.module=sparktf.spark.tf_daemon
"""

from __future__ import annotations

import importlib.machinery
import os
import sys

__all__ = ["preload", "main"]


def prefer_installed_pyspark() -> bool:
    """Move Spark's zips to the end of ``sys.path`` where they are the installed ``pyspark``'s own.

    Spark's worker path starts with ``<SPARK_HOME>/python/lib/pyspark.zip``
    (and py4j's zip). When ``pyspark`` is pip-installed, ``SPARK_HOME`` is
    that package's folder, so the zip holds the same modules as the installed
    package, whose compiled ``.pyc`` files import without compiling. Zips of
    another Spark (a cluster's own ``SPARK_HOME``) stay first.

    Returns
    -------
    bool
        Whether the path changed (``pyspark`` not yet imported, and the zips
        are the installed package's).
    """
    if "pyspark" in sys.modules:
        return False
    zips = [entry for entry in sys.path if os.path.basename(entry) == "pyspark.zip"]
    if not zips:
        return False
    spec = importlib.machinery.PathFinder.find_spec("pyspark", [entry for entry in sys.path if entry not in zips])
    if spec is None or not spec.origin:
        return False
    bundled = os.path.join(os.path.dirname(spec.origin), "python", "lib")
    if not all(_is_zip_in(entry, bundled) for entry in zips):
        return False
    moved = [entry for entry in sys.path if _is_zip_in(entry, bundled)]
    sys.path[:] = [entry for entry in sys.path if entry not in moved] + moved
    return True


def _is_zip_in(entry: str, folder: str) -> bool:
    """Whether ``entry`` is a zip file directly inside ``folder``."""
    if not entry.endswith(".zip"):
        return False
    try:
        return os.path.samefile(os.path.dirname(entry) or ".", folder)
    except OSError:
        return False


def preload() -> None:
    """Import TensorFlow and Keras (quietly) and freeze the objects they made into the permanent generation.

    The freeze is a full collection of :mod:`sparktf.spark.worker_gc`'s, so the
    workers forked from here inherit its sizes: their first model load only
    freezes the model's objects instead of collecting everything again.
    """
    from sparktf import tf_startup
    from sparktf.spark.worker_gc import freeze_alive

    tf_startup.import_without_devices()
    freeze_alive()


def main() -> None:
    """Preload, then serve Python workers as ``pyspark.daemon`` does."""
    prefer_installed_pyspark()
    preload()
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
